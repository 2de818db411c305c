"""The pure pieces of "busy is not hung" (``inprocess.busy``), without a job: the excuse a work state gives, the
monitor process's ladder of timeouts held while the evidence lasts (on a clock made up here), and
``rasd.work_state``. The real processes are tests/inprocess/test_busy_timeouts.py's."""

from __future__ import annotations

import logging
import time
import types
from typing import Any

import pytest

import rasd
from inprocess import busy
from inprocess.monitor_process import Message, _Monitor
from rasd.api import WorkState, _waits_on_slow
from rasd.core.stuck_verdict import StuckVerdict


def test_the_excuse_of_a_work_state() -> None:
    assert busy.judge(None) is None  # no RAS node: the reference's timeouts
    assert busy.judge(WorkState(0.4, False, 300.0, 0.5)) == busy.Excuse(busy.WORKING, 300.0)
    assert busy.judge(WorkState(busy.WORKING_WINDOW + 0.1, False, 300.0, 0.5)) is None  # idle in a call
    assert busy.judge(WorkState(None, False, 300.0, 0.5)) is None  # not measured: no excuse
    assert busy.judge(WorkState(30.0, True, 300.0, 0.5)) == busy.Excuse(busy.WAITING, 300.0)  # waits for a worker
    assert busy.judge(WorkState(3.5, False, 300.0, 1.0)) == busy.Excuse(busy.WORKING, 300.0)  # 4 measurements


class _Records:
    def __init__(self) -> None:
        self.found: list[str] = []

    def iteration_store(self, iteration: int) -> _Records:
        return self

    def record_terminated_ranks(self, ranks: list[int]) -> None:
        self.found.append("terminated")

    def record_interrupted(self, records: list[Any], reason: str = "") -> None:
        self.found.append(reason.split(" ", 1)[0])


class Monitor(_Monitor):
    """The monitor process's loop body on a clock of the test's: stamps at given times, checks at given times."""

    def __init__(self, soft: float = 60.0, hard: float = 90.0) -> None:
        config = dict(trainer_pid=0, rank=3, world_size=4, soft_timeout=soft, hard_timeout=hard, interval=1.0) | dict(
            heartbeat_interval=1.0, termination_grace_time=0.0
        )
        super().__init__(None, config)  # type: ignore[arg-type]
        self.base_store = _Records()
        self.killed_at: float | None = None
        self.now = 0.0
        self.start(0)

    def start(self, iteration: int) -> None:
        self.handle(
            dict(
                t=Message.ITERATION_START,
                rank=3,
                world_size=4,
                iteration=iteration,
                initial_rank=3,
                initial_world_size=4,
            )
        )
        self.baseline = self.iteration_started = self.now
        self.stamp(manual=True)

    def stamp(self, manual: bool = False, until: float | None = None, why: str = busy.WORKING) -> None:
        message: dict = dict(t=Message.TIMESTAMP, auto=self.now, manual=self.now if manual else self.manual)
        if until is not None:
            message.update(until=until, why=why, busy=300.0)
        self.handle(message)

    def kill_trainer(self) -> None:
        self.killed_at = self.now

    def run_until(self, end: float, evidence_until: float | None = None, why: str = busy.WORKING) -> list[str]:
        """Check every 0.1 s up to ``end``; the trainer's main thread runs (auto stamps), and its evidence, renewed
        every turn, lasts until ``evidence_until``. What was found, with when."""
        found: list[str] = []
        while self.now < end:
            self.now = round(self.now + 0.1, 6)
            renewed = evidence_until is not None and self.now <= evidence_until
            self.stamp(until=self.now + 1.0 if renewed else None, why=why)
            before = len(self.base_store.found)
            self.check(self.now)
            assert self.next_wakeup(self.now) > 0  # never a busy loop while the timeouts wait
            found += [f"{what}@{self.now:.1f}" for what in self.base_store.found[before:] if what != "terminated"]
        return found

    def at(self, found: list[str], what: str) -> float:
        return next(float(item.split("@")[1]) for item in found if item.startswith(what))


def test_without_evidence_the_timeouts_are_the_references() -> None:
    monitor = Monitor()
    found = monitor.run_until(100)
    assert monitor.at(found, "SOFT_TIMEOUT") == pytest.approx(60.1) and monitor.at(found, "HARD_TIMEOUT") == 90.1


def test_a_rank_that_works_is_neither_restarted_nor_killed_until_it_stops(caplog) -> None:
    monitor = Monitor()
    with caplog.at_level(logging.INFO, logger="inprocess.monitor_process"):
        found = monitor.run_until(200, evidence_until=120)  # a checkpoint of two minutes, no ping
    # It stops working at 120 s (an idle wedge after the checkpoint): the soft timeout the grace after that (time to
    # stamp progress once a wait ends: half the soft timeout, at most AFTER_EXCUSE_GRACE), the hard one 30 s later.
    assert monitor.at(found, "SOFT_TIMEOUT") == pytest.approx(130.1, abs=0.15)
    assert monitor.at(found, "HARD_TIMEOUT") == pytest.approx(160.1, abs=0.15)
    lines = [r.getMessage() for r in caplog.records if "timeout postponed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "soft timeout postponed: rank 3's process is working (CPU or I/O), not hung; no progress stamp for 50.1 s"
    ), lines


def test_the_busy_limit_bounds_the_postponement() -> None:
    monitor = Monitor()
    found = monitor.run_until(400, evidence_until=400, why=busy.WAITING)  # works for ever
    assert monitor.at(found, "SOFT_TIMEOUT") == pytest.approx(310.1, abs=0.15)  # the busy limit, 300 s, and the grace
    assert monitor.at(found, "HARD_TIMEOUT") == pytest.approx(340.1, abs=0.15)  # the ladder goes on from there


def test_progress_pays_off_what_was_held() -> None:
    monitor = Monitor()
    assert monitor.run_until(100, evidence_until=100) == []
    monitor.stamp(manual=True)  # a ping at 100 s, then an idle wedge: the ladder counts from the ping, fully
    found = monitor.run_until(200)
    assert monitor.at(found, "SOFT_TIMEOUT") == pytest.approx(160.1, abs=0.15)


def test_once_the_soft_timeout_fired_the_hard_timeout_bounds_the_restart() -> None:
    monitor = Monitor()
    found = monitor.run_until(61)  # idle: soft at 60 s
    found += monitor.run_until(120, evidence_until=120)  # works, but does not leave the function for the restart
    assert monitor.at(found, "HARD_TIMEOUT") == pytest.approx(90.1, abs=0.15)


def test_a_soft_timeout_that_keeps_firing_still_ends_at_the_hard_timeout() -> None:
    """The reference's TestHard.test_sleep (soft 0.5 s, hard 1 s) with evidence that lasts 2 s into each iteration
    (its restart is work): one restart, then the hard timeout, however long the evidence held each ladder."""
    monitor = Monitor(soft=0.5, hard=1.0)
    found = monitor.run_until(2.4, evidence_until=2)
    assert found == ["SOFT_TIMEOUT@2.3"]  # the evidence lapsed at 2 s; the grace, half the soft timeout
    monitor.start(1)  # the restart; its own work lasts 2 s
    found = monitor.run_until(20, evidence_until=monitor.now + 2)
    assert [item.split("@")[0] for item in found] == ["HARD_TIMEOUT"], found


def test_work_state_is_none_without_a_node_and_never_raises() -> None:
    assert rasd.node() is None
    assert rasd.work_state() is None


def test_a_running_node_measures_this_process() -> None:
    handle = rasd.start(None, host="127.0.0.1")
    assert handle is not None
    try:
        deadline = time.monotonic() + 30
        state = rasd.work_state()
        while (state is None or state.idle is None) and time.monotonic() < deadline:
            sum(range(100_000))
            state = rasd.work_state()
        assert state is not None and state.idle is not None and state.idle < 5, state
        assert not state.slow and state.busy_limit > 0 and state.interval > 0
    finally:
        handle.stop()
    assert rasd.work_state() is None


def test_waiting_inside_an_operation_of_a_slow_communicator() -> None:
    """By the verdict's ranks inside (global ranks, as the sweep that confirmed it counted them): this process is
    global rank 5, inside a barrier the mesh holds SLOW while rank 4 works."""
    barrier = 8  # OP_TYPES' Barrier
    slow = StuckVerdict(7, barrier, 3, (0,), (1,), (4,), (5,), slow=True, busy=(0,))
    node: Any = types.SimpleNamespace(standing_stuck=lambda: {7: slow}, me=types.SimpleNamespace(rank=5))
    assert _waits_on_slow(node)
    node.me.rank = 4  # the working rank itself: behind, not inside
    assert not _waits_on_slow(node)
    node.me.rank = 5
    node.standing_stuck = lambda: {}  # cleared: the barrier completed
    assert not _waits_on_slow(node)
    node.standing_stuck = lambda: {7: StuckVerdict(7, barrier, 3, (0,), (1,), (4,), (5,))}
    assert not _waits_on_slow(node)  # COMM_STUCK, not SLOW: no excuse
