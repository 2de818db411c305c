"""A status query: send STATUS (or VERBOSE STATUS) and receive the report, streamed or whole.

The report ends when the job closes the connection. A report that stops arriving, or that the job cuts short,
ends as a ``ReportCut`` error that carries what did arrive, so the caller can still show it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .errors import Exit, RasCliError
from .options import Options
from .protocol import SERVER_DEFAULT_TIMEOUT, Timeouts, final_command, open_session
from .report import is_complete_json, is_complete_text


class ReportCut(RasCliError):
    """The report did not arrive whole; ``received`` is what did."""

    def __init__(self, message: str, code: Exit, received: bytes) -> None:
        super().__init__(message, code)
        self.received = received


def chunks(options: Options, timeouts: Timeouts, warn: Callable[[str], None]) -> Iterator[bytes]:
    """The report's bytes as they arrive; raises ``ReportCut`` (carrying them all) if it stops early or stalls."""
    received = bytearray()
    limit = timeouts.report(options.timeout)
    with open_session(options, timeouts, warn) as conn:
        conn.send_line(final_command(options))
        stream = conn.chunks(limit)
        while True:
            try:
                data = next(stream)
            except StopIteration:
                break
            except TimeoutError:
                gather = SERVER_DEFAULT_TIMEOUT if options.timeout is None else options.timeout
                raise ReportCut(
                    f"the report from {conn.where} stopped: nothing more arrived for {limit:g} s "
                    f"({len(received)} bytes received). A job process may be hung; the job's "
                    f"gathering timeout is {gather} s (-t).",
                    Exit.TIMEOUT,
                    bytes(received),
                ) from None
            except RasCliError as err:
                raise ReportCut(
                    f"{err.message} ({len(received)} bytes of the report received)",
                    Exit.CONNECTION_LOST,
                    bytes(received),
                ) from None
            received += data
            yield data
        complete = is_complete_json if options.json else is_complete_text
        if not complete(received.decode("utf-8", "replace")):
            raise ReportCut(
                f"the job closed the connection to {conn.where} before the report was complete "
                f"({len(received)} bytes received); a job process may have exited",
                Exit.CONNECTION_LOST,
                bytes(received),
            )


def fetch(options: Options, timeouts: Timeouts, warn: Callable[[str], None]) -> bytes:
    """The whole report."""
    return b"".join(chunks(options, timeouts, warn))
