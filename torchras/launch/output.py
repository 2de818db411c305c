"""The workers' output: whole lines on the launcher's console, every byte in the log files, torchrun's options.

Why the launcher reads every worker's output through a pipe. Workers that share a terminal or a pipe and write
unbuffered interleave mid-line: ``print`` writes a line's text and its newline apart, and a line longer than
PIPE_BUF is written in pieces (``rasd demo`` printed ``...mean loss 0.0526step    40 pair 2-3...``). Here one
thread, the launcher's loop, owns the console: it cuts what each worker wrote into lines and writes each line,
with its prefix, in one piece, so no two lines ever mix, the launcher's own event lines included.

What goes where, per local rank and stream (torchrun's ``--redirects``, ``--tee``, ``--local-ranks-filter``, and its
folder layout ``<log-dir>/<run id>_<random>/attempt_0/<local rank>/{stdout,stderr}.log``):

=========================  ================================  ==============================================
stream is                  shown on the console              the worker writes to
=========================  ================================  ==============================================
neither                    yes (unless filtered out)         a pipe the launcher reads (devnull if filtered)
redirected                 no                                its log file, directly
tee'd                      yes (unless filtered out)         a pipe; the launcher writes the file and console
=========================  ================================  ==============================================

A replacement worker appends to its local rank's files (the launcher writes a separator line first), where
torchrun's group restart would start ``attempt_1``: a respawn is not a new attempt of the job.

A partial line (a progress bar redrawn with ``\\r``, a prompt) is held until its newline, for at most
``PARTIAL_LINE_S`` or ``MAX_LINE`` bytes; then it is shown as a line of its own.
"""

from __future__ import annotations

import dataclasses
import os
import string
from typing import BinaryIO

PARTIAL_LINE_S = 1.0
MAX_LINE = 64 * 1024
READ_SIZE = 64 * 1024
#: torchrun's environment variable for the prefix: ``${role_name}``, ``${rank}`` and ``${local_rank}`` are replaced.
PREFIX_TEMPLATE_ENVIRONMENT = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


def prefix(role: str, rank: int, local_rank: int, template: str | None = None) -> bytes:
    """torchrun's prefix of a tee'd line, ``[default0]:``, or its template's."""
    template = os.environ.get(PREFIX_TEMPLATE_ENVIRONMENT) if template is None else template
    if template:
        text = string.Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)
    else:
        text = f"[{role}{local_rank}]:"
    return text.encode()


class Console:
    """The launcher's stdout and stderr, written one whole line per ``write`` loop, from one thread only."""

    def __init__(self, stdout: int = 1, stderr: int = 2) -> None:
        self.descriptors = {1: stdout, 2: stderr}

    def line(self, stream: int, data: bytes) -> None:
        """Write ``data`` (one line, without its newline) and a newline to stdout (1) or stderr (2)."""
        payload = data + b"\n"
        descriptor = self.descriptors[stream]
        while payload:
            try:
                written = os.write(descriptor, payload)
            except BlockingIOError:  # a non-blocking console that is full: wait for it, the line stays whole
                import select

                select.select([], [descriptor], [], 1.0)
                continue
            except OSError:  # the console is gone (a closed pipe): the job goes on, its lines are lost
                return
            payload = payload[written:]


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where one stream of one local rank goes (``destinations``)."""

    console: bool  # shown on the launcher's console
    file: str | None  # its log file, if it has one
    pipe: bool  # the worker writes into a pipe the launcher reads (else: the file directly, or devnull)


def destinations(
    local_rank: int, redirects: dict[int, int], tee: dict[int, int], shown: frozenset[int] | None, folder: str
) -> dict[int, Destination]:
    """torchrun's rules (``DefaultLogsSpecs.reify``) for stdout (1) and stderr (2) of ``local_rank``."""
    result = {}
    for stream, path in ((1, "stdout.log"), (2, "stderr.log")):
        redirected = bool(redirects.get(local_rank, 0) & stream)
        teed = bool(tee.get(local_rank, 0) & stream)
        on_console = (shown is None or local_rank in shown) and (teed or not redirected)
        file = os.path.join(folder, path) if (redirected or teed) else None
        result[stream] = Destination(console=on_console, file=file, pipe=on_console)
    return result


class Stream:
    """One stream of one worker: bytes in from its pipe; whole lines out to the console, every byte to its file."""

    def __init__(self, console: Console, stream: int, line_prefix: bytes, file: BinaryIO | None) -> None:
        self.console = console
        self.stream = stream
        self.prefix = line_prefix
        self.file = file
        self.pending = b""
        self.pending_since: float | None = None

    def feed(self, data: bytes, now: float) -> None:
        if self.file is not None:
            try:
                self.file.write(data)
                self.file.flush()
            except OSError:  # a full disk costs the log, not the console
                pass
        data = self.pending + data
        *lines, self.pending = data.split(b"\n")
        for line in lines:
            self.console.line(self.stream, self.prefix + line)
        if not self.pending:
            self.pending_since = None
        elif lines or self.pending_since is None:  # a new partial line: held from now
            self.pending_since = now
        if len(self.pending) >= MAX_LINE:
            self.flush()

    def due(self) -> float | None:
        """When the partial line must be shown even without its newline (None: nothing held)."""
        return None if self.pending_since is None else self.pending_since + PARTIAL_LINE_S

    def flush(self) -> None:
        """Show the partial line as a line of its own."""
        if self.pending:
            self.console.line(self.stream, self.prefix + self.pending)
        self.pending = b""
        self.pending_since = None

    def close(self) -> None:
        self.flush()
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
