"""What one restart of a call was (``RestartInfo``: ``CallWrapper.last_restart``), read from the records of the
iteration it ended, and how a call tells this process's RAS node about it, if one runs.

Belongs here: the value, the order of the recorded reasons (the cause first), and the reads of the iteration's store
that make it (the initial ranks of the terminated ranks, the fault's time). The restart itself is
``CallWrapper._restart``'s.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from . import logs, store as store_module

log = logs.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class RestartInfo:
    """One restart of a call, as ``CallWrapper.last_restart`` and the mesh's RESTART event tell it."""

    iteration: int  # the iteration that starts
    count: int  # restarts of this call so far
    #: What was recorded, the cause first, e.g. ("PEER_DEAD of rank 2 (Process 4711 on node 10.0.0.3 managing
    #: CPU)", "RuntimeError on rank 1: Connection closed by peer ..."): the others are usually its consequences.
    reasons: tuple[str, ...]
    terminated_ranks: tuple[int, ...]  # initial ranks that left the job at this restart
    seconds_lost: float  # from the fault being recorded to this rank being ready to run the function again

    @property
    def cause(self) -> str:
        more = len(self.reasons) - 1
        return self.reasons[0] + (f" (and {more} more)" if more > 0 else "") if self.reasons else "unknown"


def order_reasons(reasons: list[str]) -> list[str]:
    """The reasons recorded in the iteration, verdicts first: a crash also makes its peers' collectives fail,
    and those exceptions (recorded a few milliseconds earlier) are consequences, not the cause. Verdicts and the
    monitor process's findings start with an upper-case word (``PEER_DEAD of rank 2 ...``), exceptions with
    their class name."""
    return sorted(dict.fromkeys(reasons), key=lambda reason: not reason.split(" ", 1)[0].isupper())


def initial_ranks(store: Any, ranks: set[int]) -> list[int]:
    """Initial ranks of the iteration ranks that published theirs (a rank may die before publishing)."""
    keys = [f"initial_rank_{rank}" for rank in sorted(ranks)]
    return sorted({int(store.get(key)) for key in keys if store.check([key])})


def fault_time(store: Any) -> float | None:
    if not store.check([store_module.FAULT_TIME_KEY]):
        return None
    try:
        return float(store.get(store_module.FAULT_TIME_KEY))
    except ValueError:
        return None


def tell_rasd(function: str, *args: Any) -> None:
    """Call ``rasd.<function>(*args)`` if rasd is loaded in this process (the Wrapper never imports it just for
    this); never raises into training."""
    rasd = sys.modules.get("rasd")
    record = getattr(rasd, function, None) if rasd is not None else None
    if record is None:
        return
    try:
        record(*args)
    except Exception:  # never raise into training
        log.debug("could not tell rasd (%s)", function, exc_info=True)


def announce_waiting(waiting: bool) -> None:
    """Tell this process's RAS node whether it waits to be admitted (WAITING in STATUS), if one runs."""
    tell_rasd("record_waiting", waiting)


def announce_restart(info: RestartInfo) -> None:
    """Tell this process's RAS node (a RESTART event for ``rascli -m``, the counts in STATUS), if one runs."""
    tell_rasd("record_restart", info.iteration, info.cause, info.terminated_ranks, info.seconds_lost)
