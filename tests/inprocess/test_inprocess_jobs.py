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


def test_an_exception_restarts_every_rank_atomic_holds_the_restart_back_and_the_retry_limit_ends_a_call(launch):
    # Two calls of the wrapped function in a row, at most 2 iterations each. Call 0: an exception (while rank 1 is
    # inside an atomic section) restarts every rank once, and the call returns. Call 1: an exception in each of its
    # two iterations: the retry controller ends the call with RestartAbort on every rank.
    job = launch(
        {
            "steps": 10,
            "calls": 2,
            "wrapper": {"max_iterations": 2},
            "faults": [
                {"iteration": 0, "rank": 2, "step": 4, "kind": "exception", "delay": 0.5},
                {"iteration": 0, "rank": 1, "step": 4, "kind": "atomic", "hold": 1.5},
                {"call": 1, "iteration": 0, "rank": 0, "step": 3, "kind": "exception"},
                {"call": 1, "iteration": 1, "rank": 0, "step": 3, "kind": "exception"},
            ],
        }
    )
    assert finish(job) == [3, 3, 3, 3], job.diagnostics()
    for rank in range(4):
        starts = [(e["call"], e["iteration"]) for e in events(job, rank, "start")]
        assert starts == [(0, 0), (0, 1), (1, 0), (1, 1)], job.diagnostics()
        assert iterations(job, rank, "done") == [1], job.diagnostics()  # call 0 finished in iteration 1
        assert started(job, rank, 1)["world_size"] == 4 and started(job, rank, 1)["rank"] == rank
        returns = events(job, rank, "return")
        assert [(r["call"], r["value"]) for r in returns] == [(0, rank)]
        assert returns[0]["env_rank"] == str(rank) and returns[0]["env_world"] == "4"  # environment restored
        (raised,) = events(job, rank, "raised")
        assert raised["call"] == 1 and raised["type"] == "RestartAbort" and "iteration=2" in raised["message"]
    # The restart reached rank 1 only after its atomic section ended, never inside it.
    assert iterations(job, 1, "atomic_end") == [0], job.diagnostics()
    assert events(job, 1, "atomic_end")[0]["time"] <= started(job, 1, 1)["time"]


# A kill -9 of a rank: test_a_reserve_rank_replaces_a_dead_active_rank below (rank 1, the ranks shifted and
# restored), tests/inprocess/test_elastic_jobs.py (rank 3); of rank 0: tests/acceptance/test_demo.py.


def test_a_stopped_rank_0_and_a_gil_holding_rank_wait_for_the_soft_timeout_and_end_at_the_hard_timeout(launch):
    """SIGSTOP of rank 0 (no rank is special: the process groups are built on the Wrapper's store, served by a
    process of its own) and a rank holding the GIL in one C call, with the rasd wiring off (``TORCHRAS_ENABLE=0``:
    no node, no mesh verdict). They are found only by the Wrapper's own soft timeout (3 s here), never sooner: the
    mesh wiring is what makes the restarts of tests/inprocess/test_mesh_restarts.py fast. The two others restart
    without them, and the monitor process of each kills it at its hard timeout."""
    soft_timeout = 3
    job = launch(
        {
            "steps": 10,
            "user_store": True,
            "env": {"TORCHRAS_ENABLE": "0"},
            "log_levels": {"inprocess": "INFO", "inprocess.wrap": "DEBUG", "rasd": "INFO"},
            "wrapper": {"soft_timeout": soft_timeout, "hard_timeout": 5, "barrier_timeout": 60},
            "faults": [
                {"iteration": 0, "rank": 0, "step": 3, "kind": "stop"},
                {"iteration": 0, "rank": 2, "step": 3, "kind": "gil"},
            ],
        }
    )
    codes = finish(job, deadline=300)  # 300 s: torch imports on 2 busy cores can take a minute or more
    assert codes[0] < 0 and codes[2] < 0 and codes[1] == codes[3] == 0, job.diagnostics()
    assert not any(started(job, rank, 0)["mesh"] for rank in range(4))
    faulted_at = min(events(job, rank, "fault")[0]["time"] for rank in (0, 2))
    for rank in (1, 3):
        assert started(job, rank, 1)["world_size"] == 2
        assert started(job, rank, 1)["time"] - faulted_at >= soft_timeout, job.diagnostics()
        restart = started(job, rank, 1)["restart"]
        assert restart is not None and "SOFT_TIMEOUT of rank" in restart["cause"], job.diagnostics()
        assert restart["terminated"] == [0, 2], restart
        assert "external verdict" not in job.stderr(rank) and "rasd:" not in job.stderr(rank)
        assert iterations(job, rank, "done") == [1]
    for rank in (0, 2):
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
    # A livelock spins a core: to the Wrapper's busy evidence (inprocess.busy) it is work, so its soft timeout is
    # postponed (one line says so), and the iteration ends all the same (the started iteration 1 above).
    monitor1 = (job.directory / "monitor1.log").read_text()
    assert "soft timeout in iteration 0" in monitor1 or "soft timeout postponed: rank 1" in monitor1, monitor1
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
    assert started(job, 2, 1)["rank"] == 1  # shifted down
    assert all(iterations(job, rank, "done") == [1] for rank in (0, 2, 3))
    # The shifted ranks are not left in the environment: each process returns with its own RANK again.
    assert [events(job, rank, "return")[0]["env_rank"] for rank in (0, 2, 3)] == ["0", "2", "3"]


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
