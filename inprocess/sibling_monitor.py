"""Sibling heartbeats: how a dead node (trainer and monitor process both gone) is found, without comparing clocks.

Each rank's monitor process runs one ``Heartbeat`` and one ``SiblingMonitor`` per iteration, both driven by the
monitor's own loop (no threads: ``inprocess.monitor_process`` asks each when it is next due and calls it then)::

    rank r's monitor                         the iteration's store
    Heartbeat.beat()       every interval    heartbeat_r += 1         (a counter, not a time)
    SiblingMonitor.check_heartbeats()        heartbeat_{r+1} moved?   (its successor in the ring)
        not for ``timeout`` on r's own clock:  r+1 UNRESPONSIVE: terminated, interruption recorded, registered at
                                               the iteration barrier and (its initial rank) the termination barrier;
                                               r watches r+2 from now on
        never yet, in the call's first         r+1's monitor may still be connecting to the store: its trainer
        iteration: ``startup_timeout``         waits ``barrier_timeout`` for that hand-shake, and so does r

The reference's ``SiblingMonitor`` writes ``time.time()`` and compares it with its own wall clock, so clocks of two
hosts that disagree by more than ``heartbeat_timeout`` declare healthy ranks dead; a counter measured on the
watcher's clock cannot. The names and constructor parameters are the reference's (timeouts as
``datetime.timedelta`` or seconds).

Nothing here imports torch: the monitor process uses it over ``inprocess.tcpstore_client``.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any

from . import exception, utils  # noqa: F401 - names of the reference's module
from .attribution import Interruption, InterruptionRecord

log = logging.getLogger(__name__)

HEARTBEAT_KEY = "heartbeat_{rank}"
#: Set when every rank passed the iteration barrier: the iteration is over, a verdict now would split the survivors.
ITERATION_OVER_KEY = "barrier:iteration:last_worker_arrived"


def _seconds(value: datetime.timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)


class Heartbeat:
    """This rank's heartbeat in ``store`` (the iteration's): the counter ``heartbeat_{rank}``, bumped every
    ``interval``. ``timeout`` is kept for the reference's signature (its heartbeat thread's join budget)."""

    def __init__(self, rank: int, store: Any, interval: datetime.timedelta | float, timeout: Any = None) -> None:
        self.rank = rank
        self.store = store
        self.interval = _seconds(interval)
        self.timeout = timeout
        self.count = 0
        self.next_due = time.monotonic()

    def beat(self, now: float | None = None) -> None:
        """Bump the counter if it is due (every ``interval``)."""
        now = time.monotonic() if now is None else now
        if now < self.next_due:
            return
        self.next_due = now + self.interval
        self.count += 1
        self.store.set(HEARTBEAT_KEY.format(rank=self.rank), str(self.count))


class SiblingMonitor:
    """Watches the heartbeat of the next rank of the ring (``(rank + 1) % world_size``) in ``store`` (the
    iteration's; ``store.base_store`` is the call's, where the termination barrier is), every ``interval``; a
    counter that has not moved for ``timeout`` makes that rank UNRESPONSIVE, and the watcher moves on to the next.

    A sibling whose counter has never appeared gets ``startup_timeout`` instead (at least ``timeout``; the monitor
    process passes ``barrier_timeout`` in a call's first iteration, ``timeout`` after it). Why: a monitor beats only
    once it is connected to the store, and in a job's start-up that hand-shake may take tens of seconds on a loaded
    host or to a remote etcd (20 s were seen), which its trainer allows for (``barrier_timeout``); a watcher that
    counted ``heartbeat_timeout`` from its own, earlier, connection terminated healthy ranks before they ever beat.
    After the first iteration every monitor of the call is connected, and a silent sibling is dead or hung."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        initial_world_size: int,
        timeout: datetime.timedelta | float,
        interval: datetime.timedelta | float,
        startup_timeout: datetime.timedelta | float | None = None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.initial_world_size = initial_world_size
        self.timeout = _seconds(timeout)
        self.startup_timeout = max(self.timeout, _seconds(startup_timeout) if startup_timeout is not None else 0.0)
        self.interval = _seconds(interval)
        self.seen_unresponsive_ranks: set[int] = set()
        self.sibling_rank: int | None = (rank + 1) % world_size if world_size > 1 else None
        now = time.monotonic()
        # A world of one watches nobody: never due (a due time in the past would spin the monitor's loop).
        self.next_due = now + self.interval if self.sibling_rank is not None else float("inf")
        self._value: bytes | None = None
        self._since = now

    def check_heartbeats(self, now: float | None = None) -> None:
        """Read the sibling's counter if it is due; declare it unresponsive after ``timeout`` without a change."""
        now = time.monotonic() if now is None else now
        if self.sibling_rank is None or now < self.next_due:
            return
        self.next_due = now + self.interval
        key = HEARTBEAT_KEY.format(rank=self.sibling_rank)
        value = self.store.get(key) if self.store.check([key]) else None
        if value != self._value:
            self._value, self._since = value, now
        elif now - self._since > (self.timeout if value is not None else self.startup_timeout):
            self.terminate_unresponsive_ranks({self.sibling_rank}, now - self._since)
            self._since = now  # the next sibling's silence counts from here

    def terminate_unresponsive_ranks(self, unresponsive_ranks: set[int], silence: float | None = None) -> None:
        """Do for ``unresponsive_ranks`` what their own monitors would have done (docs/inprocess.md section 3):
        terminated, an ``UNRESPONSIVE`` record, the iteration barrier, their initial ranks' termination barrier.
        Then watch the rank after the last of them."""
        store = self.store
        if store.check([ITERATION_OVER_KEY]):
            return  # the iteration is over; a verdict now could split the survivors' views
        ranks = sorted(set(unresponsive_ranks) - self.seen_unresponsive_ranks)
        if not ranks:
            return
        named = ", ".join(map(str, ranks))
        silent = "no heartbeat" + (f" for {silence:.1f} s" if silence is not None else "")
        log.warning("rank %s is unresponsive (%s): terminating it", named, silent)
        store.record_terminated_ranks(ranks)
        store.record_interrupted(
            [InterruptionRecord(rank, Interruption.UNRESPONSIVE) for rank in ranks],
            reason=f"UNRESPONSIVE rank {named}: {silent}",
        )
        store.iteration_barrier(ranks, self.world_size, 0)
        published = [rank for rank in ranks if store.check([f"initial_rank_{rank}"])]
        initial = [rank for rank in store.get_initial_ranks(published) if rank < self.initial_world_size]
        if initial:  # a process that joined later is no initial rank
            store.base_store.termination_barrier(initial, self.initial_world_size, 0)
        self.seen_unresponsive_ranks.update(ranks)
        following = (ranks[-1] + 1) % self.world_size
        self.sibling_rank = None if following == self.rank else following
        self._value, self._since = None, time.monotonic()
