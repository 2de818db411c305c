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
    assert {spec.workload for spec in specs} == {"ddp", "fsdp"}
    for workload in bench.WORKLOADS:
        # Every fault under torchrun, for every system at every setting.
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
                assert f"{system}_{workload}_{kind}_s" in keys
        # The faults after which a process exits or is left behind, with the survivors kept.
        for system in ("torchras_default", "torchras_tuned", "nvrx_default", "nvrx_sockabort_default"):
            for kind in ("kill", "stop"):
                assert f"{system}_spawn_{workload}_{kind}_s" in keys
    for key in (
        "torchras_default_spawn_rank0_ddp_kill_s",
        "nvrx_default_spawn_rank0_ddp_kill_s",
        "torchras_tuned_etcd_ddp_exception_s",
    ):
        assert key in keys
    samples: dict[str, int] = {}
    for spec in specs:
        for kind in spec.schedule:
            samples[spec.key(kind)] = samples.get(spec.key(kind), 0) + 1
    for workload in bench.WORKLOADS:
        for prefix in ("torchras_default", "torchras_tuned"):
            assert all(samples[f"{prefix}_{workload}_{kind}_s"] >= 3 for kind in ("exception", "stall", "skip"))
            assert all(samples[f"{prefix}_spawn_{workload}_{kind}_s"] >= 3 for kind in ("kill", "stop"))
        assert samples[f"nvrx_sockabort_tuned_spawn_{workload}_kill_s"] >= 3
        assert samples[f"torchrun_{workload}_exception_s"] >= 3


def test_every_wrapper_runs_under_torchrun_but_the_spawn_rows(bench):
    specs = bench.plan(quick=False, only=None, etcd=None, fault_filter=None)
    for spec in specs:
        assert (spec.launch == "spawn") == ("_spawn" in spec.prefix), spec
        if spec.launch == "spawn":
            assert spec.system != "torchrun" and set(spec.schedule) <= {"kill", "stop"}


def test_a_fault_that_may_lose_a_torchrun_job_ends_its_chain(bench):
    # Under torchrun, a kill, a stop or a rank a Wrapper cannot reach (stall: hard timeout) may end every worker:
    # nothing of the chain may come after it, or its figure would be "not reached" whatever the system does.
    for spec in bench.plan(quick=False, only=None, etcd=None, fault_filter=None):
        if spec.system != "torchrun":
            assert all(kind not in ("kill", "stop", "stall") for kind in spec.schedule[:-1]), spec


def test_quick_is_tuned_only_with_one_sample_and_no_etcd_rows_without_etcd(bench):
    specs = bench.plan(quick=True, only=None, etcd=None, fault_filter=None)
    assert {spec.setting for spec in specs if spec.system != "torchrun"} == {"tuned"}
    keys = bench.keys_of(specs)
    assert len(keys) == sum(len(spec.schedule) for spec in specs)
    assert not any("etcd" in key for key in keys)


def test_only_fault_and_workload_select_jobs(bench):
    specs = bench.plan(quick=False, only="nvrx_sockabort", etcd=None, fault_filter="kill", workloads=("fsdp",))
    assert specs and all(spec.prefix.startswith("nvrx_sockabort") and spec.schedule == ("kill",) for spec in specs)
    assert all(spec.abort == "socket" and spec.workload == "fsdp" for spec in specs)
    assert {spec.launch for spec in specs} == {"torchrun", "spawn"}
    # The rows of issue 10 are DDP's only.
    assert not any("rank0" in spec.prefix for spec in bench.plan(False, None, None, None, workloads=("fsdp",)))


def test_a_rank_left_behind_under_torchrun_has_an_aftermath(bench):
    found = [(fault(10.0, 0, "stop"), (9.5, 3))]
    under_torchrun = bench.Spec("torchras_default", "torchras", "default", "ddp", ("stop",), 130.0)
    assert bench.aftermath_deadline(under_torchrun, found) == 10.0 + bench.AFTERMATH_S
    # Every rank kept, the survivors kept (spawn), or torchrun restarting everything: nothing to wait for.
    assert bench.aftermath_deadline(under_torchrun, [(fault(10.0, 0, "skip"), (25.0, 4))]) is None
    spawned = bench.Spec("torchras_default_spawn", "torchras", "default", "ddp", ("stop",), 130.0, launch="spawn")
    assert bench.aftermath_deadline(spawned, found) is None
    baseline = bench.Spec("torchrun", "torchrun", "default", "ddp", ("stop",), 130.0)
    assert bench.aftermath_deadline(baseline, found) is None


def test_a_job_lost_after_a_recovery_voids_that_figure_only(bench):
    spec = bench.Spec("torchras_default", "torchras", "default", "ddp", ("skip", "stop"), 130.0)
    found = [(fault(10.0, 0, "skip"), (24.0, 4)), (fault(40.0, 1, "stop"), (11.0, 3))]
    results = bench.outcomes(spec, found, "job lost 95 s after the fault under torchrun: ...", {1})
    assert results[0] == ("skip", 24.0, 4, "")
    kind, seconds, _, reason = results[1]
    assert kind == "stop" and seconds is None
    assert reason.startswith("job lost") and "after it had recovered on 3 ranks in 11.0 s" in reason
    outcome = bench.Outcome(failures=[reason])
    assert outcome.lost and bench.format_value(outcome) == "lost*"


def test_faults_a_job_never_reached_say_why(bench):
    spec = bench.Spec("nvrx_default", "nvrx", "default", "ddp", ("exception", "skip"), 130.0)
    results = bench.outcomes(spec, [(fault(10.0, 0, "exception"), None)], "not recovered within the 130 s cap", set())
    assert results[0] == ("exception", None, 0, "not recovered within the 130 s cap")
    assert results[1][1] is None and results[1][3].startswith("not reached (not recovered")


TORCHRUN_FAILURE = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
bench/time_lost_worker.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_01:42:03
  host      : localhost
  rank      : 2 (local_rank: 2)
  exitcode  : -9 (pid: 7542)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 7542
============================================================
"""


def test_torchruns_account_of_a_lost_job(bench):
    assert bench.torchrun_account(TORCHRUN_FAILURE) == (
        "worker rank 2 exited (killed by SIGKILL) and torchrun ended the others"
    )
    assert "exit code 1" in bench.torchrun_account(TORCHRUN_FAILURE.replace(": -9 (pid", ": 1 (pid"))
    assert bench.torchrun_account("") == "torchrun ended the workers"


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
