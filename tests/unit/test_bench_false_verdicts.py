"""bench/false_verdicts.py's pure logic: counting verdicts, restarts and events, percentiles, the soak's plan.

No processes: the benchmark itself is the real-process run.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # the benchmark imports bench/time_lost.py as its scripts do
    spec = importlib.util.spec_from_file_location("false_verdicts_under_test", BENCH / "false_verdicts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        sys.path.remove(str(BENCH))


def verdict(kind: str, epoch: float, comm: str | None = None, addr: str = "127.0.0.1:1", incarnation: int = 7) -> dict:
    subject = None if comm else {"addr": addr, "incarnation": incarnation, "pid": 1, "rank": 2}
    return {"record": "verdict", "kind": kind, "epoch": epoch, "comm_hash": comm, "subject": subject}


def test_a_verdict_journaled_by_every_process_is_one(bench):
    records = [verdict("COMM_STUCK", 100.0 + i * 0.01, comm="aa") for i in range(4)]
    records += [verdict("PEER_HUNG", 101.0 + i * 0.2) for i in range(3)]
    records.append({"record": "restart", "kind": "RESTART", "epoch": 102.0})
    found = bench.distinct_verdicts(records)
    assert [(r["kind"], r["epoch"]) for r in found] == [("COMM_STUCK", 100.0), ("PEER_HUNG", 101.0)]


def test_verdicts_apart_in_time_or_subject_are_distinct(bench):
    records = [
        verdict("COMM_STUCK", 100.0, comm="aa"),
        verdict("COMM_STUCK", 100.5, comm="bb"),  # another communicator (a restart's new one)
        verdict("COMM_STUCK", 200.0, comm="aa"),  # the same one, much later: a second verdict
        verdict("PEER_HUNG", 100.0, incarnation=8),
        verdict("PEER_HUNG", 100.1, incarnation=9),  # another process on the same address
    ]
    assert len(bench.distinct_verdicts(records)) == 5


def test_kind_counts_take_the_larger_of_journal_and_monitor(bench):
    journal = [verdict("COMM_STUCK", 10.0 + i * 0.1, comm="aa") for i in range(4)]
    monitor = [{"event": "COMM_SLOW", "received": 5.0}, {"event": "COMM_SLOW", "received": 6.0}]
    monitor.append({"event": "COMM_STUCK", "received": 10.2})
    counts = bench.kind_counts(journal, monitor, ("PEER_DEAD", "COMM_STUCK", "COMM_SLOW"))
    assert counts == {"PEER_DEAD": 0, "COMM_STUCK": 1, "COMM_SLOW": 2}


def test_restarts_one_per_new_iteration_with_its_cause(bench):
    def start(iteration: int, time: float, cause: str | None) -> dict:
        return {"event": "iteration", "iteration": iteration, "time": time, "cause": cause}

    events = [start(0, 1.0, None) for _ in range(4)]
    events += [start(1, 30.0, None), start(1, 30.1, "COMM_STUCK of ... ranks 0 behind")]
    events += [start(2, 90.0, "SOFT_TIMEOUT of rank 1 (pid 5 made no progress)")] * 3
    events.append({"event": "step", "time": 2.0, "system_iteration": 0, "rank": 0, "world_size": 4})
    found = bench.restarts(events)
    assert [iteration for iteration, _ in found] == [1, 2]
    assert [bench.cause_kind(cause) for _, cause in found] == ["COMM_STUCK", "SOFT_TIMEOUT"]
    assert bench.cause_kind("?") == "?"


def test_nvrx_interruptions_named_in_its_log(bench):
    log = "\n".join(
        [
            "restart_ex ... InterruptionRecord(rank=1, interruption=<Interruption.SOFT_TIMEOUT: 4>)",
            "x Interruption.SOFT_TIMEOUT Interruption.SOFT_TIMEOUT",  # one line counts a name once
            "y Interruption.HARD_TIMEOUT",
            "nothing here",
        ]
    )
    assert bench.nvrx_interruptions(log) == {"SOFT_TIMEOUT": 2, "HARD_TIMEOUT": 1}


def test_percentile_is_linear_between_ranks(bench):
    assert bench.percentile([], 50) is None
    assert bench.percentile([7.0], 90) == 7.0
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert bench.percentile([float(v) for v in range(1, 11)], 90) == pytest.approx(9.1)
    assert bench.percentile([1.0, 2.0], 100) == 2.0


def test_first_after_is_inside_the_window(bench):
    assert bench.first_after([1.0, 5.0, 9.0], 2.0, 9.0) == 5.0
    assert bench.first_after([1.0, 9.0], 2.0, 9.0) is None


def test_monitor_stream_splits_pretty_printed_events_across_reads(bench):
    events = [
        {"timestamp": "t", "group": "LIFECYCLE", "event": "COMM_STUCK", "details": "AllReduce {x}", "ranks": [0, 2]},
        {"timestamp": "t", "group": "TRACE", "event": "PEER_UNRESPONSIVE", "peer": {"pid": 3}, "details": ""},
    ]
    text = "OK\nOK\n" + "".join(json.dumps(event, indent=2) + "\n" for event in events)
    stream = bench.MonitorStream()
    found = []
    for cut in range(0, len(text), 7):
        found += stream.feed(text[cut : cut + 7])
    assert found == events
    assert stream.feed("") == []


@pytest.mark.parametrize("minutes", [10.0, 30.0, 60.0])
def test_the_soak_plan_covers_every_phase_within_its_time(bench, minutes):
    phases, starves = bench.soak_plan(minutes, seed=39, quick=False)
    total = minutes * 60
    kinds = {phase.kind for phase in phases}
    assert kinds == {"first_step", "checkpoint", "eval", "jitter", "gc"}
    assert phases[0].kind == "first_step" and phases[0].at == 0
    assert [phase.index for phase in phases] == list(range(len(phases)))
    for before, after in zip(phases, phases[1:], strict=False):
        assert after.at >= before.at + (before.duration or bench.GC_PHASE_S) + bench.GAP_S[0] - 1e-6
    for phase in phases:
        assert phase.at + (phase.duration or bench.GC_PHASE_S) <= total - 30
        if phase.kind == "checkpoint":
            assert 30 <= phase.duration <= 120
        if phase.kind == "eval":
            assert 20 <= phase.duration <= 60
        if phase.kind == "gc":
            assert phase.objects in bench.GC_OBJECTS and 0 <= phase.rank < 4
    if minutes >= 30:
        assert {p.duration for p in phases if p.kind == "checkpoint"} == set(bench.CHECKPOINT_S)
    ((start, seconds),) = starves
    assert start > 0 and start + seconds <= total and seconds <= bench.STARVE_S


def test_the_quick_plan_has_one_of_each_in_two_minutes(bench):
    phases, starves = bench.soak_plan(2.0, seed=0, quick=True)
    assert sorted(phase.kind for phase in phases) == sorted(["first_step", "checkpoint", "eval", "jitter", "gc"])
    assert all(phase.at + phase.duration <= 120 for phase in phases)
    assert starves and all(start + seconds <= 120 for start, seconds in starves)


def test_the_wedges_summary(bench):
    def wedge(verdict: float | None, restart: float | None, lost: float | None = None):
        return bench.Wedge(
            "torchras",
            "ddp",
            1,
            at=100.0,
            verdict_s=verdict,
            restart_s=restart,
            lost_s=lost,
            verdict="COMM_STUCK" if verdict else "",
        )

    found = [wedge(20.0, 21.0), wedge(22.0, 23.0), wedge(None, None, 91.0), bench.Wedge("nvrx", "ddp", 0)]
    summary = bench.summarise_wedges(found)
    assert summary["n"] == 4 and summary["made"] == 3
    assert summary["verdict_p50_s"] == pytest.approx(21.0) and summary["verdict_p90_s"] == pytest.approx(21.8)
    assert summary["restart_count"] == 2 and summary["lost"] == 1 and summary["lost_p50_s"] == 91.0
    assert summary["verdict_kinds"] == {"COMM_STUCK": 2}


def test_training_everywhere_needs_every_rank_of_the_newest_iteration(bench):
    def step(iteration: int, rank: int, world: int = 4) -> dict:
        return {"event": "step", "system_iteration": iteration, "rank": rank, "world_size": world, "time": 0.0}

    assert not bench.training_everywhere([])
    assert bench.training_everywhere([step(0, r) for r in range(4)])
    assert not bench.training_everywhere([step(0, r) for r in range(4)] + [step(1, 0)])
    assert bench.training_everywhere([step(1, r, world=3) for r in range(3)])
