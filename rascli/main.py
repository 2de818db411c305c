"""``rascli``: the entry point. Parses the options and hands over to one mode: status (the default), --check,
--watch, --monitor or --list. Every failure ends here as one message on stderr and a documented exit code.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from importlib import metadata

from torchras_formats import endpoint_files

from . import __version__, commands, journal, listing, monitor, watch
from .errors import Exit, RasCliError
from .options import USAGE, Options, parse
from .output import Streams, from_sys
from .processes import process_alive
from .protocol import FACTOR_ENV, PROTOCOL_VERSION, Timeouts, timeout_factor
from .render import render_report
from .report import ReportFormatError, parse_report
from .status import ReportCut, chunks, fetch

log = logging.getLogger(__name__)

LOG_ENV = "TORCHRAS_LOG_LEVEL"
#: --check names at most this many problems on its one line.
CHECK_ITEMS_SHOWN = 5


def version() -> str:
    try:
        number = metadata.version("torchras")
    except metadata.PackageNotFoundError:
        number = __version__
    return f"rascli (torchras) {number}, RAS client protocol {PROTOCOL_VERSION}"


def show_status(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    if streams.console is None or options.json:
        for data in chunks(options, timeouts, streams.error):
            streams.write(data)
        return Exit.OK
    with streams.waiting(f"Asking the job at {options.host}:{options.port}..."):
        data = fetch(options, timeouts, streams.error)
    try:
        # Rich writes nothing until the whole renderable is drawn, so a failure here prints nothing.
        streams.console.print(render_report(parse_report(data.decode("utf-8", "replace"))))
    except Exception as err:  # noqa: BLE001 - whatever the text holds, the user sees it as the job sent it
        log.debug("showing the report as text: %s", err)
        streams.write(data)
    return Exit.OK


def check(options: Options, timeouts: Timeouts, streams: Streams) -> int:
    data = fetch(options, timeouts, streams.error)
    try:
        report = parse_report(data.decode("utf-8", "replace"))
    except ReportFormatError as err:
        raise RasCliError(
            f"cannot tell whether the job is healthy: the report does not parse ({err})", Exit.PROTOCOL
        ) from None
    where = f"{options.host}:{options.port}"
    # A job that restarted in place says so at the end of the line ("iteration 2 after 2 restarts"); the
    # restarts never make it unhealthy: they are what it did about a fault.
    restarts = f" ({report.restart_summary})" if report.restart_summary else ""
    if report.healthy:
        streams.write(f"healthy: the job at {where} reports no errors and no warnings{restarts}\n".encode())
        return Exit.OK
    problems = [f"error {item.header}" for item in report.errors]
    problems += [f"warning {item.header}" for item in report.warnings]
    shown = "; ".join(problems[:CHECK_ITEMS_SHOWN])
    if len(problems) > CHECK_ITEMS_SHOWN:
        shown += f"; and {len(problems) - CHECK_ITEMS_SHOWN} more"
    streams.write(f"unhealthy: the job at {where} reports {shown}{restarts}\n".encode())
    return Exit.UNHEALTHY


def list_jobs(options: Options, streams: Streams, environ: Mapping[str, str]) -> int:
    directory = endpoint_files.run_dir(environ)
    jobs = listing.group_jobs(endpoint_files.read_endpoints(directory, process_alive))
    now = time.time()
    if options.json:
        streams.write((json.dumps([job.as_json() for job in jobs], indent=2) + "\n").encode())
    elif not jobs:
        streams.message(f"No torchras job is serving on this node (no live endpoints in {directory}).")
    elif streams.console is not None:
        streams.console.print(listing.rich_table(jobs, now))
    else:
        streams.write(listing.plain_table(jobs, now).encode())
    return Exit.OK


def run(
    argv: Sequence[str],
    streams: Streams | None = None,
    environ: Mapping[str, str] | None = None,
    timeouts: Timeouts = Timeouts(),
) -> int:
    """Run rascli with ``argv`` (without the program name); returns the exit code."""
    environ = os.environ if environ is None else environ
    err = streams.err if streams is not None else sys.stderr
    try:
        options = parse(argv, environ)
    except RasCliError as error:
        err.write(f"rascli: {error.message}\n")
        return error.code
    if options.help:
        (streams.out if streams else sys.stdout.buffer).write(USAGE.encode())
        return Exit.OK
    if options.version:
        (streams.out if streams else sys.stdout.buffer).write((version() + "\n").encode())
        return Exit.OK
    if options.retry_for is not None:
        timeouts = replace(timeouts, retry_for=options.retry_for)
    streams = streams if streams is not None else from_sys(options.no_color)
    if FACTOR_ENV in environ:
        timeouts = replace(timeouts, factor=timeout_factor(environ, streams.error))
    if options.no_color:
        streams.console = streams.progress = None
    try:
        if options.list:
            return list_jobs(options, streams, environ)
        if options.journal is not None:
            return journal.run(options, streams)
        if options.monitor is not None:
            return monitor.run(options, timeouts, streams)
        if options.watch is not None:
            return watch.run(options, timeouts, streams)
        if options.check:
            return check(options, timeouts, streams)
        if options.command is not None:
            return commands.command(options, timeouts, streams)
        if options.diagnostics or options.stacks:
            return commands.report(options, timeouts, streams)
        return show_status(options, timeouts, streams)
    except ReportCut as cut:
        if streams.console is not None and cut.received and not options.json:
            streams.write(cut.received)
        streams.error(cut.message)
        return cut.code
    except RasCliError as error:
        streams.error(error.message)
        return error.code
    except KeyboardInterrupt:
        streams.error("interrupted")
        return Exit.INTERRUPTED


def main(argv: Sequence[str] | None = None) -> None:
    level = os.environ.get(LOG_ENV, "").strip().upper() or "WARNING"
    known = isinstance(logging.getLevelName(level), int)  # a name such as BASIC_FORMAT is no level
    logging.basicConfig(level=level if known else logging.WARNING, format="rascli: %(name)s: %(message)s")
    try:
        code = run(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (rascli | head): not an error of ours. Point stdout at /dev/null so the
        # interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = Exit.OK
    sys.exit(int(code))


if __name__ == "__main__":
    main()
