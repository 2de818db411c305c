"""The RAS client protocol, version 2, from the client's side: which lines an invocation sends, in which order,
and what it accepts back (docs/protocol.md §1-2).

    connect -> CLIENT PROTOCOL 2     <- SERVER PROTOCOL <v>
            -> TIMEOUT <t>           <- OK          only with -t
            -> SET FORMAT <fmt>      <- OK          only with -f (the format verbatim, as typed)
            -> STATUS | VERBOSE STATUS              the report, then the server closes
            |  MONITOR [groups]      <- OK          then events until the job ends

Unlike ncclras, a silent server is not retried forever: the handshake is tried ``attempts`` times on fresh
connections (the kernel spreads connections over the job's processes, so a hung one may be skipped), each wait
bounded even with ``-t 0``, which disables only the wait for the report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .connection import Connection, show_bytes
from .errors import Exit, RasCliError
from .options import Options

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 2
HANDSHAKE = f"CLIENT PROTOCOL {PROTOCOL_VERSION}"
SERVER_PREFIX = "SERVER PROTOCOL "
#: The job's own gathering timeout when the client does not send TIMEOUT.
SERVER_DEFAULT_TIMEOUT = 5


@dataclass(frozen=True)
class Timeouts:
    connect: float = 3.0
    #: For each reply before the report: the handshake, TIMEOUT's and SET FORMAT's OK.
    reply: float = 2.0
    attempts: int = 3
    #: The report may be silent for the job's gathering timeout plus this (ncclras: 1 + t + 5 seconds).
    report_extra: float = 6.0

    def report(self, timeout: int | None) -> float | None:
        if timeout == 0:
            return None
        return (SERVER_DEFAULT_TIMEOUT if timeout is None else timeout) + self.report_extra


def setup_commands(options: Options) -> list[str]:
    """The commands between the handshake and the final one, each answered by ``OK``."""
    commands = []
    if options.timeout is not None:
        commands.append(f"TIMEOUT {options.timeout}")
    if options.format is not None:
        commands.append(f"SET FORMAT {options.format}")
    return commands


def final_command(options: Options) -> str:
    if options.monitor is not None:
        return f"MONITOR {options.monitor}" if options.monitor else "MONITOR"
    return "VERBOSE STATUS" if options.verbose else "STATUS"


class _Silent(Exception):
    pass


def _reply(conn: Connection, timeout: float, after: str) -> str:
    try:
        line = conn.read_line(timeout)
    except TimeoutError:
        raise _Silent(after) from None
    except RasCliError as err:
        if err.code != Exit.CONNECTION_LOST:
            raise
        line = None
    if line is None:
        raise RasCliError(
            f"the service at {conn.where} closed the connection without answering '{after}': "
            "it is not a RAS service, or the job is shutting down",
            Exit.PROTOCOL,
        )
    return line


def _handshake(conn: Connection, options: Options, timeouts: Timeouts, warn: Callable[[str], None]) -> None:
    conn.send_line(HANDSHAKE)
    reply = _reply(conn, timeouts.reply, HANDSHAKE)
    if not reply.upper().startswith(SERVER_PREFIX):
        raise RasCliError(
            f"the service at {conn.where} is not a RAS service: it answered {show_bytes(reply.encode())}", Exit.PROTOCOL
        )
    version = reply[len(SERVER_PREFIX) :].strip()
    if version != str(PROTOCOL_VERSION):
        warn(f"the job speaks RAS protocol {version!r}, this client {PROTOCOL_VERSION}; trying anyway")
    for command in setup_commands(options):
        conn.send_line(command)
        reply = _reply(conn, timeouts.reply, command)
        if reply != "OK":
            raise RasCliError(f"the job rejected '{command}': {reply}", Exit.PROTOCOL)


def open_session(options: Options, timeouts: Timeouts, warn: Callable[[str], None]) -> Connection:
    """Connect, shake hands and send the setup commands; the caller sends the final command."""
    for attempt in range(1, timeouts.attempts + 1):
        conn = Connection.open(options.host, options.port, timeouts.connect, options.default_addr)
        try:
            _handshake(conn, options, timeouts, warn)
            return conn
        except _Silent as silent:
            conn.close()
            message = (
                f"no answer from {conn.where} to '{silent.args[0]}' within {timeouts.reply:g} s "
                f"(attempt {attempt} of {timeouts.attempts})"
            )
            if attempt < timeouts.attempts:
                warn(f"{message}; retrying")
                continue
            raise RasCliError(
                f"{message}: a job process serving the port may be hung, or the service on the "
                "port is not a RAS service",
                Exit.TIMEOUT,
            ) from None
        except BaseException:
            conn.close()
            raise
    raise AssertionError("unreachable")
