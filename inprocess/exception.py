"""Exceptions of the in-process restart wrapper.

The hierarchy matters more than the names: everything that should lead to another restart attempt is an
``Exception`` (``RestartError`` and its subclasses), everything that must end the wrapper for this rank is a
``BaseException`` (``RestartAbort``), so that a workload's ``except Exception`` never swallows it.
"""


class RestartError(Exception):
    """Base class of the wrapper's own errors."""


class RestartAbort(BaseException):
    """Terminal: the wrapper stops restarting and the rank leaves (raised e.g. by ``RetryController``)."""


class HealthCheckError(RestartError):
    """A health check failed: before ``fn`` this restarts, during a restart the rank leaves."""


class InternalError(RestartError):
    """An invariant of the wrapper was broken."""


class TimeoutError(RestartError):  # the reference shadows the builtin name, and so do we
    """A bounded operation of the wrapper (health check, finalize, thread shutdown, hand-shake) ran out of time."""
