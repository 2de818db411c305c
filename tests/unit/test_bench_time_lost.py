"""bench/time_lost.py's arithmetic and plan: what counts as recovered, and which figures one run produces.

Pure functions only (no processes): the benchmark itself is the real-process run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "time_lost.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("time_lost_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def step(time: float, iteration: int, rank: int, world_size: int, initial_rank: int | None = None) -> dict:
    return {
        "event": "step",
        "time": time,
        "system_iteration": iteration,
        "rank": rank,
        "world_size": world_size,
        "initial_rank": rank if initial_rank is None else initial_rank,
    }


def fault(time: float, iteration: int, kind: str = "kill") -> dict:
    return {"event": "fault", "time": time, "system_iteration": iteration, "kind": kind, "initial_rank": 2}


def test_recovered_when_every_rank_of_the_smaller_world_stepped(bench):
    events = [
        *(step(1.0, 0, rank, 4) for rank in range(4)),
        fault(10.0, 0),
        step(10.5, 1, 0, 3),
        step(10.7, 1, 2, 3, initial_rank=3),
        step(10.6, 1, 1, 3),
    ]
    ((_, result),) = bench.recoveries(events)
    assert result == pytest.approx((0.7, 3))


def test_not_recovered_while_one_rank_of_the_new_world_has_not_stepped(bench):
    events = [fault(10.0, 0), step(10.5, 1, 0, 4), step(10.6, 1, 1, 4), step(10.7, 1, 3, 4)]
    assert bench.recoveries(events) == [(events[0], None)]


def test_an_iteration_cut_by_a_second_restart_does_not_count(bench):
    # A fault during the restart: iteration 1 never completes a step on all ranks; iteration 2 does.
    events = [fault(10.0, 0), step(10.5, 1, 0, 3), step(13.0, 2, 0, 2), step(13.2, 2, 1, 2)]
    ((_, result),) = bench.recoveries(events)
    assert result == pytest.approx((3.2, 2))


def test_chained_faults_are_timed_each_from_its_own_fault(bench):
    events = [
        fault(10.0, 0, "exception"),
        *(step(10.4, 1, rank, 4) for rank in range(4)),
        fault(20.0, 1, "exception"),
        *(step(20.3 + rank / 100, 2, rank, 4) for rank in range(4)),
    ]
    results = [result for _, result in bench.recoveries(events)]
    assert results == [pytest.approx((0.4, 4)), pytest.approx((0.33, 4))]


def test_steps_logged_before_the_fault_are_not_a_recovery(bench):
    # Only what happened after the fault counts, whatever iteration number a step carries.
    events = [step(5.0, 1, 0, 1), fault(10.0, 0)]
    assert bench.recoveries(events) == [(events[1], None)]


def test_the_default_run_has_every_figure_the_issues_ask_for(bench):
    specs = bench.plan(quick=False, only=None, etcd={"factory": "x.Y", "kwargs": {}}, fault_filter=None)
    keys = bench.keys_of(specs)
    for system in (
        "torchras_default",
        "torchras_tuned",
        "nvrx_default",
        "nvrx_tuned",
        "nvrx_sockabort_default",
        "nvrx_sockabort_tuned",
        "torchrun",
    ):
        for kind in bench.FAULTS:
            assert f"{system}_{kind}_s" in keys
    for key in ("torchras_default_rank0_kill_s", "nvrx_default_rank0_kill_s", "torchras_tuned_etcd_exception_s"):
        assert key in keys
    samples: dict[str, int] = {}
    for spec in specs:
        for kind in spec.schedule:
            samples[f"{spec.prefix}_{kind}_s"] = samples.get(f"{spec.prefix}_{kind}_s", 0) + 1
    for prefix in ("torchras_default", "torchras_tuned"):
        assert all(samples[f"{prefix}_{kind}_s"] >= 3 for kind in bench.FAULTS)
    assert samples["nvrx_sockabort_tuned_kill_s"] >= 3 and samples["torchrun_exception_s"] >= 3


def test_quick_is_tuned_only_with_one_sample_and_no_etcd_rows_without_etcd(bench):
    specs = bench.plan(quick=True, only=None, etcd=None, fault_filter=None)
    assert {spec.setting for spec in specs if spec.system != "torchrun"} == {"tuned"}
    keys = bench.keys_of(specs)
    assert len(keys) == sum(len(spec.schedule) for spec in specs)
    assert not any("etcd" in key for key in keys)


def test_only_and_fault_select_jobs(bench):
    specs = bench.plan(quick=False, only="nvrx_sockabort", etcd=None, fault_filter="kill")
    assert specs and all(spec.prefix.startswith("nvrx_sockabort") and spec.schedule == ("kill",) for spec in specs)
    assert all(spec.abort == "socket" for spec in specs)


def test_a_chain_whose_faulty_rank_was_terminated_says_so(bench):
    # nvidia-resiliency-ext's hard timeout after a skip terminated initial rank 2, which was to make the next fault.
    events = [
        fault(10.0, 0, "skip"),
        step(100.0, 1, 0, 3),
        step(100.0, 1, 1, 3, initial_rank=1),
        step(100.0, 1, 2, 3, initial_rank=3),
    ]
    assert "terminated initial rank 2" in bench.next_fault_missing(events, fault_rank=2)
    events.append(step(100.0, 1, 3, 4, initial_rank=2))
    assert "no fault within" in bench.next_fault_missing(events, fault_rank=2)
