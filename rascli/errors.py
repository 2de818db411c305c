"""Exit codes and the one exception type that carries a user-facing message to ``main``.

Every failure a user can meet ends as a ``RasCliError``: one clear message on stderr, one documented exit code,
never a traceback.
"""

from __future__ import annotations

import enum


class Exit(enum.IntEnum):
    OK = 0  # done; with --check: the job is healthy; a monitor that the job or Ctrl+C ended
    UNHEALTHY = 1  # --check: the report lists errors or warnings
    USAGE = 2  # bad options or a bad TORCHRAS_ADDR
    NO_CONNECTION = 3  # host unknown, connection refused, nothing listening
    TIMEOUT = 4  # the service accepted the connection but did not answer in time
    PROTOCOL = 5  # not a RAS service on that port, or it rejected a command
    CONNECTION_LOST = 6  # the connection broke before the report was complete
    INTERRUPTED = 130  # Ctrl+C during a status query


EXIT_CODE_HELP = """\
Exit codes:
  0    success (with --check: the job is healthy; a monitor ended by the job or by Ctrl+C)
  1    --check: the report lists errors or warnings
  2    bad options, or a bad TORCHRAS_ADDR
  3    could not connect (unknown host, connection refused, nothing listening)
  4    timed out waiting for the service (a hung or silent process on the port)
  5    the service is not a RAS service, or it rejected a command
  6    the connection broke before the report was complete
  130  interrupted by Ctrl+C during a status query"""


class RasCliError(Exception):
    """A failure with the message to show the user and the exit code to leave with."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
