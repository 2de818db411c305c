"""Log lines for an outer restarter (NVIDIA's in-job restarter, ``ft_launcher``) that watches this job's output.

The outer restarter reads the progress of in-process restarts from lines such as::

    [2026-11-22 23:10:00,123] [INFO] [InprocessRestarter@node7] active_rank=0 [NestedRestarter] \
        name=[InProcess] state=handling stage=starting

Each callback below prints one such line, on the rank whose *initial* rank is ``special_rank`` (rank 0 by
default), and is meant for one parameter of the ``Wrapper``, as in the reference::

    Wrapper(
        initialize=NestedRestarterHandlingCompleted(),   # first call: state=initialize, later: handling/completed
        abort=Compose(AbortTorchDistributed(), NestedRestarterHandlingStarting()),   # handling/starting
        completion=NestedRestarterFinalized(),           # state=finalized
        terminate=NestedRestarterAborted(),              # state=aborted
    )

The lines go to the ``inprocess.nested_restarter`` logger (``NestedRestarterLogger.restarter_logger``), which
prints them to stderr and does not propagate; it is set up when the first callback is built, never on import.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import sys

from .abort import Abort
from .completion import Completion
from .initialize import Initialize
from .state import FrozenState
from .terminate import Terminate

RESTARTER_LOGGER_NAME = "inprocess.nested_restarter"


class NestedRestarterLogger:
    """Writes the restarter's lines; ``restarter_logger`` is the stdlib logger (tests swap its handlers)."""

    def __init__(self, name: str = "InprocessRestarter") -> None:
        self.name = name
        self.hostname = socket.gethostname()
        self.connected_rank: int | None = None
        self.restarter_logger = logging.getLogger(RESTARTER_LOGGER_NAME)
        if not self.restarter_logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(
                logging.Formatter(f"[%(asctime)s] [%(levelname)s] [{self.name}@{self.hostname}] %(message)s")
            )
            self.restarter_logger.addHandler(handler)
            self.restarter_logger.setLevel(logging.INFO)
            self.restarter_logger.propagate = False

    def set_connected_rank(self, rank: int | None) -> None:
        self.connected_rank = rank

    def log_for_restarter(self, message: str) -> None:
        self.restarter_logger.info(message)


@dataclasses.dataclass
class NestedRestarterCallback:
    """Logs ``[NestedRestarter] name=[InProcess] state=<state> stage=<stage>`` on ``special_rank``."""

    restarter_state: str
    restarter_stage: str | None = None
    logger: NestedRestarterLogger = dataclasses.field(default_factory=NestedRestarterLogger)
    special_rank: int = 0

    def __call__(self, state: FrozenState) -> FrozenState:
        if state is not None and state.initial_rank == self.special_rank:
            self.logger.set_connected_rank(state.initial_rank)
            message = f"active_rank={state.active_rank} [NestedRestarter] name=[InProcess] state={self.restarter_state}"
            if self.restarter_stage is not None:
                message += f" stage={self.restarter_stage}"
            self.logger.log_for_restarter(message)
        return state


class NestedRestarterHandlingCompleted(Initialize, NestedRestarterCallback):
    """An ``Initialize``: ``state=initialize`` on the first iteration, ``state=handling stage=completed`` after."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "initialize", None, special_rank=special_rank)
        self._called_once = False

    def __call__(self, state: FrozenState) -> FrozenState:
        NestedRestarterCallback.__call__(self, state)
        if not self._called_once:
            self._called_once = True
            self.restarter_state, self.restarter_stage = "handling", "completed"
        return state


class NestedRestarterHandlingStarting(Abort, NestedRestarterCallback):
    """An ``Abort`` (compose it with the real abort): ``state=handling stage=starting`` when a restart begins."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "handling", "starting", special_rank=special_rank)

    # An Abort's signature (no state outside an iteration), which the callback's own (a state in, the same out)
    # cannot also be: the two bases disagree, and an Abort is what the Wrapper calls this as.
    def __call__(self, state: FrozenState | None) -> FrozenState | None:  # type: ignore[override]
        if state is not None:
            NestedRestarterCallback.__call__(self, state)
        return state


class NestedRestarterFinalized(Completion, NestedRestarterCallback):
    """A ``Completion``: ``state=finalized`` when the wrapped function completed on every rank."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "finalized", None, special_rank=special_rank)

    def __call__(self, state: FrozenState) -> FrozenState:
        return NestedRestarterCallback.__call__(self, state)


class NestedRestarterAborted(Terminate, NestedRestarterCallback):
    """A ``Terminate``: ``state=aborted`` when the rank leaves the wrapper by an exception."""

    def __init__(self, special_rank: int = 0) -> None:
        NestedRestarterCallback.__init__(self, "aborted", None, special_rank=special_rank)

    def __call__(self, state: FrozenState) -> FrozenState:
        return NestedRestarterCallback.__call__(self, state)
