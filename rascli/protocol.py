"""The RAS client protocol, version 2, from the client's side: which lines an invocation sends, in which order,
and what it accepts back (docs/protocol.md §1-2).

    connect -> CLIENT PROTOCOL 2     <- SERVER PROTOCOL <v>
            -> TIMEOUT <t>           <- OK          only with -t
            -> SET FORMAT <fmt>      <- OK          only with -f (the format verbatim, as typed)
            -> STATUS | VERBOSE STATUS              the report, then the server closes
            |  MONITOR [groups]      <- OK          then events until the job ends

The job's processes on a node share the port (SO_REUSEPORT): the kernel hands each new connection to one of them,
by a hash of the client's port, and a stopped (SIGSTOP) or hung one accepts it and never answers. So, as ncclras
does, a connection whose handshake (or a setup command's OK) goes unanswered for ``reply`` seconds is dropped and
a fresh one tried, about once a second, which soon lands on a process that answers. Unlike ncclras, not forever: for
``retry_for`` seconds (60 by default, ``--retry-for``), because a script that asks a job whose every process on
the node is stopped, or a port that is not a RAS service, must end. Each wait is bounded even with ``-t 0``,
which disables only the wait for the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .connection import Connection, ConnectTimeout, address, show_bytes
from .errors import Exit, RasCliError
from .options import Options

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 2
HANDSHAKE = f"CLIENT PROTOCOL {PROTOCOL_VERSION}"
SERVER_PREFIX = "SERVER PROTOCOL "
#: The job's own gathering timeout when the client does not send TIMEOUT (times its timeout factor).
SERVER_DEFAULT_TIMEOUT = 5
FACTOR_ENV = "TORCHRAS_TIMEOUT_FACTOR"


#: How long fresh connections are tried (``--retry-for``). Each lands on a stopped process with a chance of about
#: k/n (k of the node's n processes stopped), so 60 tries all fail with a chance of (k/n)**60: under 1e-18 with
#: half of them stopped, 3e-4 with 7 of 8.
DEFAULT_RETRY_FOR = 60.0


@dataclass(frozen=True)
class Timeouts:
    connect: float = 3.0
    #: For each reply before the report, on one connection: the handshake, TIMEOUT's and SET FORMAT's OK. When
    #: one does not come, the connection is given up for a fresh one (ncclras: 1 s).
    reply: float = 1.0
    #: Fresh connections are tried for this many seconds from the first; ``inf``: forever, as ncclras.
    retry_for: float = DEFAULT_RETRY_FOR
    #: The report may be silent for the job's gathering timeout plus this (ncclras: 1 + t + 5 seconds), and so
    #: may MONITOR's OK (ncclras reads it with the same timeout).
    report_extra: float = 6.0
    #: The job's TORCHRAS_TIMEOUT_FACTOR, as this client's environment has it: the job's default gathering timeout
    #: and its hard extra (5 s each) are scaled by it, so the waits for them are too (ncclras 2.31 scales its waits
    #: by NCCL_RAS_TIMEOUT_FACTOR the same way).
    factor: float = 1.0

    def report(self, timeout: int | None) -> float | None:
        if timeout == 0:
            return None
        gather = SERVER_DEFAULT_TIMEOUT * self.factor if timeout is None else timeout
        return gather + self.report_extra + SERVER_DEFAULT_TIMEOUT * max(self.factor - 1.0, 0.0)


def timeout_factor(environ: Mapping[str, str], warn: Callable[[str], None]) -> float:
    """``TORCHRAS_TIMEOUT_FACTOR`` from ``environ`` (1 when unset); a value that is not a positive number is 1, said
    once through ``warn``."""
    text = environ.get(FACTOR_ENV, "").strip()
    if not text:
        return 1.0
    try:
        factor = float(text)
    except ValueError:
        factor = -1.0
    if not 0 < factor < float("inf"):
        warn(f"{FACTOR_ENV}={text!r} is not a positive number; waiting as for 1")
        return 1.0
    return factor


def setup_commands(options: Options) -> list[str]:
    """The commands between the handshake and the final one, each answered by ``OK``."""
    commands = []
    if options.timeout is not None:
        commands.append(f"TIMEOUT {options.timeout}")
    if options.format is not None:
        commands.append(f"SET FORMAT {options.format}")
    return commands


def final_command(options: Options) -> str:
    if options.command is not None:
        return options.command
    if options.monitor is not None:
        return f"MONITOR {options.monitor}" if options.monitor else "MONITOR"
    if options.diagnostics:
        return "DIAGNOSTICS"
    if options.stacks:
        return "STACKS" + (" ALL" if options.all_threads else "") + (f" RANKS {options.ranks}" if options.ranks else "")
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
    """Connect, shake hands and send the setup commands; the caller sends the final command.

    A connection that gets no answer, or whose connect times out (a stopped process whose accept queue is full
    drops new connections), is replaced by a fresh one until ``timeouts.retry_for`` seconds have passed; each
    retry is said on ``warn`` (stderr), as ncclras says ``Connection timed out; retrying...``.
    """
    start = time.monotonic()
    where = address(options.host, options.port)
    tries = 0
    while True:
        tries += 1
        conn: Connection | None = None
        final: RasCliError
        try:
            conn = Connection.open(options.host, options.port, timeouts.connect, options.default_addr)
            _handshake(conn, options, timeouts, warn)
            return conn
        except ConnectTimeout as timed_out:
            problem, final = f"connecting to {where} timed out", timed_out
        except _Silent as silent:
            assert conn is not None
            conn.close()
            problem = f"no answer from {where} to '{silent.args[0]}' within {timeouts.reply:g} s"
            final = RasCliError(
                f"no process of the job at {where} answered '{silent.args[0]}' in {time.monotonic() - start:.0f} s "
                f"({tries} connections, {timeouts.reply:g} s each): every connection went to a job process that "
                "is stopped or hung, or the service on the port is not a RAS service (--retry-for sets how long "
                "rascli keeps trying)",
                Exit.TIMEOUT,
            )
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if time.monotonic() - start >= timeouts.retry_for:
            raise final from None
        warn(f"{problem}; retrying on a new connection")
