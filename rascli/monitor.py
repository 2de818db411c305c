"""MONITOR mode: events as the job pushes them, one line each, until the job closes the connection or Ctrl+C.

In a pipe, with --no-color or in JSON, the bytes are relayed unchanged. On a terminal each text event line is
coloured by what it means: red for a verdict that something is wrong, yellow for trouble that may pass, green
for recovery and arrivals, cyan for RESTART (the job restarted in place: what it did about a fault).
"""

from __future__ import annotations

import re

from rich.text import Text

from .connection import Connection
from .errors import Exit, RasCliError
from .options import Options
from .output import Streams
from .protocol import SERVER_DEFAULT_TIMEOUT, Timeouts, final_command, open_session
from .render import RESTART_HIGHLIGHTS, detail_text

BANNER = "RAS Monitor Mode - watching for peer changes (Ctrl+C to exit)...\n" + "=" * 64
EVENT_LINE = re.compile(r"\[(?P<time>[^\]]*)\] (?P<event>[A-Z][A-Z_]*):(?P<rest>.*)")

EVENT_STYLES = {
    **dict.fromkeys(("PEER_DEAD", "PEER_HUNG", "PEER_TIMEOUT_DEAD", "COMM_STUCK"), "bold red"),
    **dict.fromkeys(
        (
            "PEER_UNRESPONSIVE",
            "PEER_KEEPALIVE_TIMEOUT",
            "PEER_INIT_TIMEOUT",
            "PEER_SEND_STUCK",
            "PEER_DISCONNECTED",
            "PEER_RETRY",
            "PEER_LEFT",
            "COMM_SLOW",
        ),
        "yellow",
    ),
    **dict.fromkeys(("PEER_NEW", "PEER_CONNECTING", "PEER_CONNECTED", "PEER_RECOVERED", "COMM_RECOVERED"), "green"),
    "RESTART": "bold cyan",
}


def event_text(line: str) -> Text:
    """One event line, coloured; a line that is not an event is shown as it is."""
    match = EVENT_LINE.fullmatch(line)
    if not match:
        return Text(line)
    text = Text()
    text.append(f"[{match.group('time')}] ", style="dim")
    text.append(match.group("event"), style=EVENT_STYLES.get(match.group("event"), "bold"))
    text.append(":")
    rest = detail_text(match.group("rest"))
    if match.group("event") == "RESTART":
        for pattern, style in RESTART_HIGHLIGHTS:
            rest.highlight_regex(pattern, style)
    text.append_text(rest)
    return text


class _LinePrinter:
    """Prints complete lines to the console as they arrive, holding back a partial one."""

    def __init__(self, streams: Streams) -> None:
        assert streams.console is not None
        self.console = streams.console
        self.pending = b""

    def feed(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            self.print(line)

    def print(self, line: bytes) -> None:
        self.console.print(event_text(line.rstrip(b"\r").decode("utf-8", "replace")), soft_wrap=True)

    def finish(self) -> None:
        if self.pending:
            self.print(self.pending)
            self.pending = b""


def activate(conn: Connection, options: Options, timeouts: Timeouts) -> None:
    command = final_command(options)
    conn.send_line(command)
    # The process answered the handshake: it is given as long as for a report (ncclras reads this OK with its
    # report timeout), bounded even with -t 0.
    wait = (options.timeout or SERVER_DEFAULT_TIMEOUT) + timeouts.report_extra
    try:
        reply = conn.read_line(wait)
    except TimeoutError:
        raise RasCliError(f"no answer from {conn.where} to '{command}' within {wait:g} s", Exit.TIMEOUT) from None
    if reply is None:
        raise RasCliError(
            f"the job closed the connection to {conn.where} instead of answering '{command}'", Exit.CONNECTION_LOST
        )
    if reply != "OK":
        raise RasCliError(f"monitor mode activation failed: the job answered '{command}' with: {reply}", Exit.PROTOCOL)


def run(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    printer = _LinePrinter(streams) if streams.console is not None and not options.json else None
    feed = printer.feed if printer else streams.write
    with open_session(options, timeouts, streams.error) as conn:
        activate(conn, options, timeouts)
        streams.message(BANNER)
        try:
            for data in conn.chunks(None):
                feed(data)
            ending = "Connection closed by the job."
        except RasCliError as err:
            ending = f"Connection to the job lost: {err.message}"
        except KeyboardInterrupt:
            ending = "Monitoring stopped by user."
        finally:
            if printer:
                printer.finish()
    streams.message(ending)
    return Exit.OK
