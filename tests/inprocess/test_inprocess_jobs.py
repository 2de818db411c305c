"""Real 4-rank gloo jobs on the CPU: faults injected, restarts observed from what every rank reports.

Each test starts one job (four trainers, four monitor processes). Deadlines are generous: they only keep a
broken build from hanging the suite; nothing here asserts speed (bench/restart.py measures that).
"""

from __future__ import annotations

import signal

import pytest

from inprocess_jobs import events, iterations, started

JOB_DEADLINE = 120  # seconds for a whole job, start-up (torch imports on 2 busy cores) included

pytestmark = pytest.mark.slow


def finish(job, ranks=None, deadline: float = JOB_DEADLINE) -> list:
    codes = job.wait(deadline, ranks)
    assert None not in codes, f"job did not finish: {codes}\n{job.diagnostics()}"
    return codes


def test_an_exception_restarts_every_rank_and_atomic_holds_the_restart_back(launch):
    # Two calls of the wrapped function in a row; the faults are in the first one.
    job = launch(
        {
            "steps": 10,
            "calls": 2,
            "faults": [
                {"iteration": 0, "rank": 2, "step": 4, "kind": "exception", "delay": 0.5},
                {"iteration": 0, "rank": 1, "step": 4, "kind": "atomic", "hold": 1.5},
            ],
        }
    )
    assert finish(job) == [0, 0, 0, 0], job.diagnostics()
    for rank in range(4):
        assert [(e["call"], e["iteration"]) for e in events(job, rank, "start")] == [(0, 0), (0, 1), (1, 0)]
        assert iterations(job, rank, "done") == [1, 0], job.diagnostics()  # call 0 finished in iteration 1
        assert started(job, rank, 1)["world_size"] == 4 and started(job, rank, 1)["rank"] == rank
        returns = events(job, rank, "return")
        assert [(r["call"], r["value"]) for r in returns] == [(0, rank), (1, rank)]
        assert returns[0]["env_rank"] == str(rank) and returns[0]["env_world"] == "4"  # environment restored
    # The restart reached rank 1 only after its atomic section ended, never inside it.
    assert iterations(job, 1, "atomic_end") == [0], job.diagnostics()
    assert events(job, 1, "atomic_end")[0]["time"] <= started(job, 1, 1)["time"]


def test_kill_9_of_a_rank_continues_on_three(launch):
    job = launch({"steps": 10, "faults": [{"iteration": 0, "rank": 2, "step": 4, "kind": "kill"}]})
    assert finish(job) == [0, 0, -signal.SIGKILL, 0], job.diagnostics()
    assert [started(job, rank, 1)["rank"] for rank in (0, 1, 3)] == [0, 1, 2]
    assert {started(job, rank, 1)["world_size"] for rank in (0, 1, 3)} == {3}
    assert all(iterations(job, rank, "done") == [1] for rank in (0, 1, 3))
    assert events(job, 3, "return")[0]["env_rank"] == "3"  # the shifted rank is not left in the environment


def test_sigstop_and_a_gil_holding_hang_are_killed_by_the_hard_timeout(launch):
    job = launch(
        {
            "steps": 10,
            "wrapper": {"soft_timeout": 2, "hard_timeout": 4},
            "faults": [
                {"iteration": 0, "rank": 3, "step": 4, "kind": "stop"},
                {"iteration": 0, "rank": 2, "step": 4, "kind": "gil"},
            ],
        }
    )
    codes = finish(job)
    assert codes[:2] == [0, 0] and codes[2] < 0 and codes[3] < 0, job.diagnostics()
    for rank in (0, 1):
        assert started(job, rank, 1)["world_size"] == 2
        assert iterations(job, rank, "done") == [1]
    for rank in (2, 3):
        log = (job.directory / f"monitor{rank}.log").read_text()
        assert "hard timeout" in log and "died in iteration 0" in log, log


def test_a_soft_timeout_restarts_a_livelock_whatever_the_intervals(launch):
    # Stamps arrive 50x faster than the monitor's interval: the reference's monitor never checks its timeouts
    # in this configuration (its loop `continue`s on every stamp); deadlines here are checked on every turn.
    # In iteration 1, after its last collective, rank 2 sleeps past the soft timeout inside
    # disable_hang_protection() while the others wait at the completion barrier: no restart.
    job = launch(
        {
            "steps": 10,
            "wrapper": {
                "soft_timeout": 2,
                "hard_timeout": 10,
                "progress_watchdog_interval": 0.01,
                "monitor_process_interval": 0.5,
            },
            "faults": [
                {"iteration": 0, "rank": 1, "step": 4, "kind": "livelock"},
                {"iteration": 1, "rank": 2, "step": 9, "kind": "quiet_sleep", "seconds": 3},
            ],
        }
    )
    assert finish(job) == [0, 0, 0, 0], job.diagnostics()
    for rank in range(4):
        assert started(job, rank, 1)["world_size"] == 4
        assert iterations(job, rank, "done") == [1]
    assert "soft timeout in iteration 0" in (job.directory / "monitor1.log").read_text()
    assert iterations(job, 2, "quiet_sleep_end") == [1]
    assert "timeout in iteration 1" not in (job.directory / "monitor2.log").read_text()


def test_a_dead_node_is_found_by_its_sibling_heartbeat(launch):
    # Trainer and monitor of rank 2 die together: nobody on its "node" is left to report it. Rank 1's monitor
    # watches rank 2's heartbeat counter and declares it unresponsive. The rasd mesh would find the death first
    # (tests/inprocess/test_mesh_restarts.py): off here, so that the heartbeat path is what is tested.
    job = launch(
        {
            "env": {"TORCHRAS_ENABLE": "0"},
            "steps": 10,
            "wrapper": {"heartbeat_interval": 0.3, "heartbeat_timeout": 5},
            "faults": [{"iteration": 0, "rank": 2, "step": 4, "kind": "node"}],
        }
    )
    assert finish(job) == [0, 0, -signal.SIGKILL, 0], job.diagnostics()
    assert [started(job, rank, 1)["world_size"] for rank in (0, 1, 3)] == [3, 3, 3]
    assert all(iterations(job, rank, "done") == [1] for rank in (0, 1, 3))
    assert "rank 2 is unresponsive" in (job.directory / "monitor1.log").read_text()


def test_a_reserve_rank_replaces_a_dead_active_rank(launch):
    job = launch(
        {
            "steps": 10,
            "wrapper": {"max_active": 3},
            "faults": [{"iteration": 0, "rank": 1, "step": 4, "kind": "kill"}],
        }
    )
    assert finish(job) == [0, -signal.SIGKILL, 0, 0], job.diagnostics()
    assert iterations(job, 3, "start") == [1]  # idle in iteration 0
    assert started(job, 3, 1)["rank"] == 2 and started(job, 3, 1)["world_size"] == 3
    assert all(iterations(job, rank, "done") == [1] for rank in (0, 2, 3))


def test_retry_controller_stops_after_its_limit(launch):
    job = launch(
        {
            "steps": 10,
            "wrapper": {"max_iterations": 2},
            "faults": [
                {"iteration": 0, "rank": 0, "step": 3, "kind": "exception"},
                {"iteration": 1, "rank": 0, "step": 3, "kind": "exception"},
            ],
        }
    )
    assert finish(job) == [3, 3, 3, 3], job.diagnostics()
    for rank in range(4):
        assert iterations(job, rank, "start") == [0, 1]
        raised = events(job, rank, "raised")[0]
        assert raised["type"] == "RestartAbort" and "iteration=2" in raised["message"]


def test_an_external_verdict_restarts_without_the_hung_rank(launch):
    """Rank 3 stops itself; no local timeout fires before the job ends (soft 100 s), so only the verdict that the
    test injects through rank 0 (PEER_HUNG for initial rank 3, reported twice) can restart the job. After the
    restart, verdicts naming rank 1 for the old iteration and for a future one are ignored, and a COMM_STUCK
    verdict for the current iteration restarts everyone once more without terminating anybody."""
    job = launch(
        {
            "steps": 40,  # long enough that the COMM_STUCK verdict lands inside iteration 1
            # A rank between two collectives when its peers abort for COMM_STUCK can start one more on a
            # connection gloo already dropped, which waits for this timeout (docs/inprocess.md section 2, item 8).
            "pg_timeout": 15,
            "wrapper": {"soft_timeout": 100, "hard_timeout": 110, "barrier_timeout": 200},
            "faults": [
                {"iteration": 0, "rank": 3, "step": 4, "kind": "stop"},
                {"iteration": 0, "rank": 0, "step": 4, "kind": "verdict", "victims": [3], "stale_victims": [1]},
            ],
        }
    )
    assert finish(job, ranks=[0, 1, 2]) == [0, 0, 0], job.diagnostics()
    verdict = events(job, 0, "verdict")[0]
    assert verdict["first"] is True and verdict["again"] is True
    assert events(job, 0, "stale_verdict")[0]["applied"] is False
    assert events(job, 0, "future_verdict")[0]["applied"] is False
    assert events(job, 0, "stuck_verdict")[0]["applied"] is True
    assert [started(job, rank, 1)["world_size"] for rank in (0, 1, 2)] == [3, 3, 3]
    assert [started(job, rank, 2)["world_size"] for rank in (0, 1, 2)] == [3, 3, 3]  # COMM_STUCK: nobody left
    assert all(iterations(job, rank, "done") == [2] for rank in (0, 1, 2))
    assert iterations(job, 3, "start") == [0]
    monitor_log = (job.directory / "monitor3.log").read_text()
    assert "soft timeout" not in monitor_log and "hard timeout" not in monitor_log
