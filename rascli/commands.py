"""The modes that send one command and show what comes back: ``-D`` (DIAGNOSTICS), ``--stacks`` (STACKS) and a
command given as words (``rascli CONTROL PROFILER_MASK none``, as ncclras 2.31 takes them; docs/cli.md).

DIAGNOSTICS and STACKS are reports: every byte the job sends is printed as it arrives, until the job closes the
connection. A command given as words gets one line back, printed. A reply that starts with ``ERROR`` (any case),
or a ``BUSY:`` reply (another DIAGNOSTICS runs in the process that took the connection), ends with exit code 5.
"""

from __future__ import annotations

from .connection import Connection
from .errors import Exit, RasCliError
from .options import Options
from .output import Streams
from .protocol import Timeouts, final_command, open_session


def _refused(first_line: bytes) -> bool:
    text = first_line.decode("utf-8", "replace").upper()
    return text.startswith("ERROR") or text.startswith("BUSY:")


def report(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    """Send DIAGNOSTICS or STACKS and print the reply until the job closes the connection."""
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
