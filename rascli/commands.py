"""The modes that send one command and show what comes back: ``-D`` (DIAGNOSTICS), ``--stacks`` (STACKS) and a
command given as words (``rascli CONTROL PROFILER_MASK none``, as ncclras 2.31 takes them; docs/cli.md).

DIAGNOSTICS and STACKS are reports: in a pipe every byte the job sends is printed as it arrives, until the job
closes the connection; on a terminal the whole reply is shown once it is in, each line styled by what it is
(``styled``: the job's text unchanged). A command given as words gets one line back, printed. A reply that starts
with ``ERROR`` (any case), or a ``BUSY:`` reply (another DIAGNOSTICS runs in the process that took the connection),
ends with exit code 5.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re

from rich.text import Text

from . import native
from .connection import Connection
from .errors import Exit, RasCliError
from .options import Options
from .output import Streams
from .protocol import Timeouts, final_command, open_session


def _refused(first_line: bytes) -> bool:
    text = first_line.decode("utf-8", "replace").upper()
    return text.startswith("ERROR") or text.startswith("BUSY:")


#: How the terminal shows a line of each report (``styled``): the job's text, unchanged, with a style per line.
STACKS_STYLES = (
    (re.compile(r"^Stacks of "), "bold"),
    (re.compile(r"^Not answering"), "bold red"),
    (re.compile(r"^\S.*:$"), "bold cyan"),  # a group's heading: its ranks, processes and thread
    (re.compile(r"^    \.\.\. \("), "dim"),
    (re.compile(r"^    rank .*: (last seen|no position)"), "red"),
    (re.compile(r"^    collective: not in "), "bold red"),  # the rank the others wait for (issue 42)
    (re.compile(r"^    collective: inside "), "yellow"),
)
DIAGNOSTICS_STYLES = (
    (re.compile(r" NCCL DIAG \[OK\] "), "green"),
    (re.compile(r" NCCL DIAG \[INFO\] .*(mismatch|differ|incomplete|unavailable|more than)"), "bold yellow"),
    (re.compile(r" NCCL DIAG (===|RAS diagnostics completed)"), "bold"),
)


def styled(text: str, stacks: bool) -> Text:
    """The report as a terminal shows it: every line as the job wrote it, styled by what it is. In a stack, the
    innermost frame of each group (where its ranks wait) stands out."""
    out = Text()
    lines = text.split("\n")
    for i, line in enumerate(lines):
        style = next(
            (s for pattern, s in (STACKS_STYLES if stacks else DIAGNOSTICS_STYLES) if pattern.search(line)), ""
        )
        innermost = stacks and line.startswith("    ") and not style and (i + 1 == len(lines) or lines[i + 1] == "")
        out.append(line, style="bold yellow" if innermost else style)
        if i + 1 < len(lines):
            out.append("\n")
    return out


def report(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    """Send DIAGNOSTICS or STACKS and print the reply until the job closes the connection: as it arrives in a pipe
    (and as JSON), styled on a terminal once it is whole. With ``--native``, the native frames follow
    (``native_frames``)."""
    if options.native:
        return native_frames(options, timeouts, streams)
    if streams.console is not None and not options.json:
        buffer = io.BytesIO()
        quiet = Streams(buffer, streams.err, None, None, streams.progress)
        try:
            with streams.waiting(f"Asking the job at {options.host}:{options.port}..."):
                return _report(options, timeouts, quiet)
        finally:  # what arrived, also when the reply was cut short
            text = buffer.getvalue().decode("utf-8", "replace").rstrip("\n")
            if text:
                streams.console.print(styled(text, options.stacks), soft_wrap=True)
    return _report(options, timeouts, streams)


def _report(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    limit = timeouts.report(options.timeout)
    command = final_command(options)
    received = b""
    first_line = False
    with open_session(options, timeouts, streams.error) as conn:
        conn.send_line(command)
        try:
            for data in conn.chunks(limit):
                received += data
                streams.write(data)
                if not first_line and b"\n" in received:
                    first_line = True
                    if _refused(received.split(b"\n", 1)[0]):
                        # A refused command (STACKS RANKS 3-1) leaves the connection open, as NCCL's ERROR replies
                        # do: nothing more comes, and waiting for the job to close would end only at the timeout
                        # (never with -t 0).
                        return Exit.PROTOCOL
        except TimeoutError:
            raise RasCliError(
                f"the reply to '{command}' from {conn.where} stopped: nothing more arrived for {limit:g} s",
                Exit.TIMEOUT,
            ) from None
    if not received:
        raise RasCliError(f"the job at {conn.where} closed the connection without answering '{command}'", Exit.PROTOCOL)
    return Exit.PROTOCOL if _refused(received.split(b"\n", 1)[0]) else Exit.OK


def native_frames(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    """``--stacks --native``: the STACKS report as without ``--native``, then the C and C++ frames of each process
    on this host (``rascli.native``). The processes come from a second STACKS, as JSON. With ``-f json``, one
    object: the job's ``stacks`` and rascli's ``native`` beside it."""
    plain = dataclasses.replace(options, native=False)
    if not options.json:
        code = report(plain, timeouts, streams)
        if code != Exit.OK:
            return code
    buffer = io.BytesIO()
    code = _report(dataclasses.replace(plain, format="json"), timeouts, Streams(buffer, streams.err, None, None, None))
    if code != Exit.OK:
        streams.write(buffer.getvalue())
        return code
    try:
        stacks = json.loads(buffer.getvalue().decode("utf-8", "replace").removeprefix("OK\n"))
    except ValueError:
        raise RasCliError("the job's STACKS report in JSON could not be read", Exit.PROTOCOL) from None
    with streams.waiting("Reading the native frames of this host's processes with py-spy..."):
        found = native.collect(stacks, options.all_threads)
    if options.json:
        streams.write((json.dumps({**stacks, "native": native.as_json(found)}, indent=2) + "\n").encode())
        return Exit.OK
    text = native.render_text(found)
    if streams.console is not None:
        streams.console.print(styled("\n" + text.rstrip("\n"), stacks=True), soft_wrap=True)
    else:
        streams.write(("\n" + text).encode())
    return Exit.OK


def command(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    """Send the command given as words and print the job's one-line reply."""
    line = final_command(options)
    with open_session(options, timeouts, streams.error) as conn:
        reply = _one_line(conn, line, timeouts.report(options.timeout))
    streams.write(reply.encode() + b"\n")
    return Exit.PROTOCOL if _refused(reply.encode()) else Exit.OK


def _one_line(conn: Connection, line: str, limit: float | None) -> str:
    conn.send_line(line)
    wait = limit if limit is not None else 3600.0
    try:
        reply = conn.read_line(wait)
    except TimeoutError:
        raise RasCliError(f"no answer from {conn.where} to '{line}' within {wait:g} s", Exit.TIMEOUT) from None
    if reply is None:
        raise RasCliError(f"the job at {conn.where} closed the connection without answering '{line}'", Exit.PROTOCOL)
    return reply
