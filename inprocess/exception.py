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


class RepeatedFault(RestartAbort, SystemExit):
    """The Wrapper gave up: the same fault ended ``count`` iterations in a row with no progress between them
    (``inprocess.repeated_faults``). A ``RestartAbort``, as ``RetryController``'s giving up is; also a
    ``SystemExit`` with code 1, so that a script that lets it go exits with status 1 without every rank printing
    it again (the rank that decided has logged the fault and its traceback, once)."""

    def __init__(self, message: str, fault: object = None, count: int = 0) -> None:
        super().__init__(message)
        self.code = 1
        self.fault = fault  # an inprocess.repeated_faults.Fault
        self.count = count
