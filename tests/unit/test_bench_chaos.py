"""bench/chaos.py's classifier and matrix: what outcome a run's facts make, what its output says, which cells apply.

Pure functions only (no processes): the benchmark itself is the real-process run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
STEPS = 60


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("chaos_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def seen(bench, **facts):
    base = dict(
        status=0,
        last_step=STEPS,
        last_world=4,
        restarts=1,
        fault_seen=True,
        cause=None,
        exit_is_right=False,
        looped=False,
    )
    return bench.Observed(**{**base, **facts})


def test_finished_at_full_size_with_status_0_is_recovered_full(bench):
    assert bench.classify(seen(bench), STEPS) == "RECOVERED_FULL"


def test_finished_on_fewer_ranks_is_recovered_smaller(bench):
    assert bench.classify(seen(bench, last_world=3), STEPS) == "RECOVERED_SMALLER"


def test_status_0_before_the_last_step_is_a_wrong_status(bench):
    assert bench.classify(seen(bench, last_step=30), STEPS) == "WRONG_STATUS"
    assert bench.classify(seen(bench, last_step=None, last_world=None), STEPS) == "WRONG_STATUS"


def test_non_zero_though_the_training_finished_is_a_wrong_status(bench):
    # issue 38: a SIGSTOPped rank, the job trained every step, the launcher exited 137
    facts = seen(bench, status=137, cause="rasd launch: every worker has exited: the job failed: status 137")
    assert bench.classify(facts, STEPS) == "WRONG_STATUS"


def test_a_sigterm_may_end_a_finished_job_with_a_non_zero_status(bench):
    facts = seen(bench, status=143, exit_is_right=True, cause="rasd launch: stopped by SIGTERM: status 143")
    assert bench.classify(facts, STEPS) == "CLEAR_FAILURE"


def test_non_zero_with_a_cause_is_a_clear_failure_without_one_an_unclear_one(bench):
    cause = "rasd launch: every worker has exited: the job gave up (...): status 1"
    assert bench.classify(seen(bench, status=1, last_step=20, cause=cause), STEPS) == "CLEAR_FAILURE"
    assert bench.classify(seen(bench, status=1, last_step=20, cause=None), STEPS) == "UNCLEAR_FAILURE"


def test_still_running_at_the_bound_is_a_hang(bench):
    assert bench.classify(seen(bench, status=None, last_step=20), STEPS) == "HANG"


def test_where_a_clear_exit_is_the_right_end_non_zero_is_right_after_the_last_step(bench):
    """A function that raises at every end (the same exception each time); under torchrun, the survivors of a hung
    rank that finished before its hard timeout ended it, and torchrun failed the job for that death."""
    facts = dict(status=1, cause="rasd launch: ... the job gave up (...): status 1")
    assert bench.classify(seen(bench, **facts), STEPS) == "WRONG_STATUS"  # a fault healed: 0 was due
    assert bench.classify(seen(bench, **facts, exit_is_right=True), STEPS) == "CLEAR_FAILURE"


def test_restarts_past_the_bound_without_progress_are_a_loop_whatever_the_status(bench):
    assert bench.classify(seen(bench, restarts=11, stalled=11), STEPS, loop_bound=10) == "LOOP"
    assert bench.classify(seen(bench, restarts=11, stalled=10), STEPS, loop_bound=10) == "RECOVERED_FULL"
    assert bench.classify(seen(bench, status=None, looped=True, restarts=3), STEPS) == "LOOP"


def test_a_clean_run_whose_fault_never_came_does_not_count(bench):
    assert bench.classify(seen(bench, fault_seen=False, restarts=0), STEPS) == "NO_FAULT"


def test_the_output_gives_the_last_step_the_latest_world_restarts_and_injections(bench):
    lines = [
        "[default0]:step    20  world (4 ranks, DDP): loss 0.0409",
        "[default1]:rank 1: injecting kill at step 25",
        "[default3]:rank 3: injecting exception at step 15",  # the trigger of a restart or join cell: not the fault
        "[default0]:restart 1 after PEER_DEAD of rank 1 (...): 3 ranks continue from step 20, 1.3 s lost",
        "[default0]:step    50  world (3 ranks, DDP): loss 0.0239",
        "[default0]:restart 2 after RuntimeError on rank 0: ...: 3 ranks continue from step 40, 1.1 s lost",
        "[default0]:step    50  world (3 ranks, DDP): loss 0.0240",  # replayed from the commit at 40
        "[default0]:step    60  world (4 ranks, DDP): loss 0.0171",
        # a restart after the last step (a rank lost in the shutdown) trains nothing: the job ended at 4
        "[default0]:restart 3 after PEER_DEAD of rank 1 (...): 3 ranks continue from step 60, 1.3 s lost",
        "rasd launch: every worker has exited: the job finished (3 worker(s) completed): status 0",
    ]
    last_step, last_world, highest, injections, cause = bench.observe_lines(lines, STEPS)
    assert (last_step, last_world, highest, injections) == (60, 4, 3, 1)
    assert cause is None  # a finished job's last lines name no failure


def test_restarts_in_a_row_count_only_without_a_new_step_between_them(bench):
    def restart(n):
        return f"[default0]:restart {n} after RuntimeError on rank 1: ...: 4 ranks continue from step 10, 1.2 s lost"

    def step(n):
        return f"[default0]:step {n:5d}  world (4 ranks, DDP): loss 0.04"

    # a fault at every commit: each restart resumes and trains 10 steps further (the matrix's `commit repeat`)
    assert bench.stalled_restarts([line for n in range(1, 13) for line in (step(10 * n), restart(n))]) == 1
    # the same fault before any step: every restart in a row
    assert bench.stalled_restarts([step(20)] + [restart(n) for n in range(1, 13)]) == 12
    # a replay of steps already trained is no progress
    assert bench.stalled_restarts([step(20), restart(1), step(15), step(20), restart(2)]) == 2
    hooks = ["chaos: rank 1 (pid 42): injecting repeat at init"] * 3
    assert bench.stalled_restarts(hooks) == 3


def test_a_hook_line_counts_as_an_injection(bench):
    lines = ["chaos: rank 1 (pid 42): injecting repeat at init"] * 3
    assert bench.observe_lines(lines, STEPS)[3] == 3


def test_the_cause_is_the_last_line_that_names_one(bench):
    lines = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "RuntimeError: chaos: injected exception at startup",
        "rasd launch: every worker has exited: the job failed: worker 1 (pid 7) exit code 1 first: status 1",
    ]
    assert bench.failure_cause(lines).startswith("rasd launch: every worker has exited: the job failed")
    assert bench.failure_cause(lines[:3]) == "RuntimeError: chaos: injected exception at startup"
    assert bench.failure_cause(["step    10  world (4 ranks, DDP): loss 0.1"]) is None


def test_every_cell_is_listed_and_the_inapplicable_ones_say_why(bench):
    cells = bench.matrix()
    assert len(cells) == 2 * 2 * 8 * 7
    na = {cell.key: bench.not_applicable(cell) for cell in cells if bench.not_applicable(cell)}
    assert "torchrun_ddp_join_kill" in na and "nobody joins" in na["torchrun_ddp_join_kill"]
    assert "rasd_ddp_commit_skip" in na and "rasd_ddp_init_sigterm" in na
    assert bench.not_applicable(bench.Cell("rasd", "ddp", "steady", "kill")) is None
    assert bench.not_applicable(bench.Cell("rasd", "fsdp", "join", "sigterm")) is None


def test_only_filters_meet_across_dimensions_and_join_within_one(bench):
    cells = bench.selected(bench.matrix(), ["rasd,steady", "kill,stop"])
    assert {cell.key for cell in cells} == {
        f"rasd_{model}_steady_{fault}" for model in ("ddp", "fsdp") for fault in ("kill", "stop")
    }
    with pytest.raises(ValueError, match="nonsense"):
        bench.selected(bench.matrix(), ["nonsense"])


def test_each_fault_is_made_once_by_inject_by_a_hook_or_from_outside(bench):
    for cell in bench.matrix():
        if bench.not_applicable(cell):
            continue
        argv = bench.worker_arguments(cell)
        faulty = [a for a in argv if a.startswith(f"{cell.fault}:rank={bench.FAULT_RANK},")]
        repeats = [a for a in argv if a.startswith(f"exception:rank={bench.FAULT_RANK},")]
        ways = [bool(faulty) or (cell.fault == "repeat" and bool(repeats)), bench.in_worker(cell)]
        ways.append(bench.external(cell) is not None)
        assert sum(ways) == 1, cell
    steady = bench.worker_arguments(bench.Cell("rasd", "ddp", "steady", "repeat"))
    assert steady.count(f"exception:rank=1,step={bench.STEADY_STEP}") > bench.LOOP_BOUND


def test_a_later_folder_replaces_a_cells_runs_unless_the_passes_are_combined(bench, tmp_path):
    import dataclasses
    import json

    def folder(name: str, *cells: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        runs = [bench.Run(cell, 0, "RECOVERED_FULL", 30.0, 40.0, None, 120, 4, 1, 0, [], None) for cell in cells]
        (path / "runs.jsonl").write_text("".join(json.dumps(dataclasses.asdict(run)) + "\n" for run in runs))
        return path

    first = folder("first", "rasd_ddp_steady_kill", "rasd_ddp_end_kill")
    second = folder("second", "rasd_ddp_steady_kill")
    replaced = bench.earlier_runs([first, second])
    combined = bench.earlier_runs([first, second], combine=True)
    assert {cell: len(runs) for cell, runs in replaced.items()} == {"rasd_ddp_steady_kill": 1, "rasd_ddp_end_kill": 1}
    assert {cell: len(runs) for cell, runs in combined.items()} == {"rasd_ddp_steady_kill": 2, "rasd_ddp_end_kill": 1}
