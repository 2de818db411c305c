"""External fault sources: verdicts from outside the rank (the rasd mesh) that act like a local detection.

A verdict names ranks by their *initial* rank (the ``RANK`` the process was launched with, which is what rasd
calls the global rank), the restart iteration it refers to, and what was found::

    ExternalVerdict(iteration=3, ranks=frozenset({17}), kind=VerdictKind.PEER_DEAD, reason="no keepalive 5 s")

``report_fault(verdict)`` hands it to the one wrapper call active in this process. For ``PEER_DEAD`` and
``PEER_HUNG`` it performs, in the verdict's iteration, exactly what the monitor process does for a dead trainer:

1. append the ranks (translated to the iteration's numbering) to ``terminated_ranks``,
2. record an ``EXTERNAL`` interruption, which wakes every monitor thread and so restarts every rank,
3. register the ranks at the iteration barrier, so survivors do not wait for them,
4. register their initial ranks at the termination barrier, so the store host does not wait for them at exit.

``COMM_STUCK`` names ranks that are alive but cannot make progress together: it records the interruption only
(step 2), like a soft timeout, and nobody is terminated. Every step is idempotent (set semantics, reentrant
barriers, records appended once per distinct verdict), so several processes may report the same verdict. A
verdict that names an older iteration than the current one is ignored: it refers to a world that no longer
exists and would otherwise kill a healthy restart. Only one wrapper call is active per process; the registry
below is the one piece of module-level state, and it is guarded by a lock.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Protocol

from . import logs

log = logs.get_logger(__name__)


class VerdictKind(str, enum.Enum):
    PEER_DEAD = "PEER_DEAD"
    PEER_HUNG = "PEER_HUNG"
    COMM_STUCK = "COMM_STUCK"

    @property
    def terminates(self) -> bool:
        return self is not VerdictKind.COMM_STUCK


#: ``ExternalVerdict.iteration`` for a verdict about processes rather than an iteration (a death, a hang): it is
#: applied to the newest iteration in which the named ranks take part, so a death noticed while the survivors
#: are between two iterations still reaches the iteration that must drop it.
LATEST_ITERATION = -1


@dataclasses.dataclass(frozen=True)
class ExternalVerdict:
    iteration: int
    ranks: frozenset[int]
    reason: str = ""
    kind: VerdictKind | str = VerdictKind.PEER_DEAD
    #: Ranks in the iteration's own numbering (a communicator verdict names those), translated by the wrapper.
    iteration_ranks: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", frozenset(int(rank) for rank in self.ranks))
        object.__setattr__(self, "iteration_ranks", frozenset(int(rank) for rank in self.iteration_ranks))
        object.__setattr__(self, "kind", VerdictKind(self.kind))


class FaultSink(Protocol):
    """What ``report_fault`` and the abort (``inprocess.abort``) talk to: the running ``CallWrapper``."""

    @property
    def iteration(self) -> int: ...

    def report_fault(self, verdict: ExternalVerdict) -> bool: ...

    def store_ports(self) -> set[int]:
        """Ports of the wrapper's stores: the abort leaves connections to them open."""
        ...

    def protected_connections(self) -> set[tuple]:
        """Connections the abort leaves open (the rasd mesh's, the stores')."""
        ...


class _ActiveCall:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call: FaultSink | None = None

    def set(self, call: FaultSink) -> None:
        with self._lock:
            if self._call is not None and self._call is not call:
                log.warning("a second wrapper call became active in this process; verdicts go to the newest")
            self._call = call

    def clear(self, call: FaultSink) -> None:
        with self._lock:
            if self._call is call:
                self._call = None

    def get(self) -> FaultSink | None:
        with self._lock:
            return self._call


_ACTIVE = _ActiveCall()


def register_active_call(call: FaultSink) -> None:
    _ACTIVE.set(call)


def unregister_active_call(call: FaultSink) -> None:
    _ACTIVE.clear(call)


def active_call() -> FaultSink | None:
    """The wrapper call running in this process, or None."""
    return _ACTIVE.get()


def current_iteration() -> int | None:
    call = _ACTIVE.get()
    return None if call is None else call.iteration


def report_fault(verdict: ExternalVerdict) -> bool:
    """Apply ``verdict`` to this process's active wrapper call; False if ignored (stale, or no active call)."""
    call = _ACTIVE.get()
    if call is None:
        log.info("verdict %s ignored: no wrapper call is active", verdict)
        return False
    return call.report_fault(verdict)
