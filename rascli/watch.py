"""``--watch SECONDS``: the status report again and again, with what changed since the previous one marked.

On a terminal the screen is redrawn each round: new or changed Errors and Warnings items are tagged NEW, items
that went away are listed as resolved, changed communicator rows are shown in reverse. In a pipe each round is
a header line, the job's text unchanged, and one line saying what changed. A round that fails (the job is
restarting, a process hangs) shows its error and the watch goes on; Ctrl+C ends it with exit code 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from .changes import Changes, describe, diff
from .errors import Exit, RasCliError
from .options import Options
from .output import Streams
from .protocol import Timeouts
from .render import render_report
from .report import Report, ReportFormatError, parse_report
from .status import fetch

log = logging.getLogger(__name__)


def _parse(data: bytes) -> Report | None:
    try:
        return parse_report(data.decode("utf-8", "replace"))
    except ReportFormatError as err:
        log.debug("a report that does not parse: %s", err)
        return None


def _draw(console: Console, report: Report | None, data: bytes, changes: Changes) -> None:
    if report is not None:
        try:
            console.print(render_report(report, changes))
            return
        except Exception as err:  # noqa: BLE001 - as in a single query: show the text as the job sent it
            log.debug("showing the report as text: %s", err)
    console.print(Text(data.decode("utf-8", "replace")), end="")


def run(
    options: Options,
    timeouts: Timeouts,
    streams: Streams,
    rounds: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    assert options.watch is not None
    where = f"{options.host}:{options.port}"
    previous: Report | None = None
    done = 0
    try:
        while True:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            try:
                data, error = fetch(options, timeouts, streams.error), None
            except RasCliError as err:
                data, error = None, err
            report = _parse(data) if data is not None else None
            changes = diff(previous, report) if report is not None else Changes()
            title = f"rascli --watch {options.watch:g}s   {where}   {stamp}"
            if streams.console is not None:
                console = streams.console
                console.clear()
                console.print(Text(title, style="bold reverse"))
                if error is not None:
                    console.print(Text(f"rascli: {error.message}", style="bold red"))
                else:
                    _draw(console, report, data or b"", changes)
            else:
                streams.write(f"=== {title} ===\n".encode())
                if error is not None:
                    streams.write(f"rascli: {error.message}\n".encode())
                else:
                    streams.write(data or b"")
                    if report is not None and previous is not None:
                        streams.write(f"--- {describe(changes)}\n".encode())
            if report is not None:
                previous = report
            done += 1
            if rounds is not None and done >= rounds:
                break
            sleep(options.watch)
    except KeyboardInterrupt:
        streams.message("Watching stopped by user.")
    return Exit.OK
