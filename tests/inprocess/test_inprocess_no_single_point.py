"""No process is special on one host: an exception or the departure of initial rank 0, and the death of the store
server. SIGSTOP of rank 0, ended by its monitor process at its hard timeout while the others go on:
tests/inprocess/test_inprocess_jobs.py. kill -9 of rank 0, the survivors going on at 3 ranks on the Wrapper's store
(the same store server and ``call_wrapper.store`` as here): tests/acceptance/test_demo.py (``--max-respawns 0``),
and healed back to 4 ranks: tests/launch/test_launch_heal.py.

The Wrapper's store runs in a store server process of its own (``inprocess.store_server``) and the process
groups are built on the Wrapper's per-iteration store (``call_wrapper.store``), so rank 0 fails like any other
rank: the survivors restart and finish. Real 4-rank gloo jobs (tests/inprocess/inprocess_workload.py).
"""

from __future__ import annotations

import pytest

from test_inprocess_jobs import events, finish, iterations, started

pytestmark = pytest.mark.slow

DEADLINE = 300  # seconds for a whole job: generous, as torch imports on 2 busy cores can take a minute or more


def test_an_exception_in_rank_0_restarts_all_and_its_departure_leaves_three(launch):
    # Iteration 0: rank 0 raises before its init_process_group while the others wait in theirs; all four restart,
    # and every rank's next init names its group alike (inprocess/abort.py, forget_unfinished_init; left counted,
    # the three would wait for rank 0 under another name until a timeout). Iteration 1: rank 0 leaves the wrapper
    # (SystemExit) at step 3 and its process exits; the other three restart once more, on three ranks, and finish.
    job = launch(
        {
            "steps": 10,
            "user_store": True,
            "faults": [
                {"iteration": 0, "rank": 0, "step": "init", "kind": "exception"},
                {"iteration": 1, "rank": 0, "step": 3, "kind": "leave"},
            ],
        }
    )
    assert finish(job, deadline=DEADLINE) == [3, 0, 0, 0], job.diagnostics()
    assert [event["type"] for event in events(job, 0, "raised")] == ["SystemExit"]
    assert [(e["iteration"], e["kind"]) for e in events(job, 0, "fault")] == [(0, "exception"), (1, "leave")]
    assert [started(job, rank, 1)["world_size"] for rank in range(4)] == [4, 4, 4, 4]
    assert [started(job, rank, 2)["rank"] for rank in (1, 2, 3)] == [0, 1, 2]
    assert all(iterations(job, rank, "done") == [2] for rank in (1, 2, 3)), job.diagnostics()


def test_the_death_of_the_store_server_ends_the_call_on_every_rank_with_a_clear_error(launch):
    # Rare (the server runs no user code), but never a silent hang: every rank's monitor thread sees the store
    # connection drop, logs it and leaves the call with inprocess.store.StoreUnavailable.
    job = launch(
        {
            "steps": 200,
            "user_store": True,
            "faults": [{"iteration": 0, "rank": 1, "step": 4, "kind": "kill_store_server"}],
        }
    )
    assert finish(job, deadline=DEADLINE) == [3, 3, 3, 3], job.diagnostics()
    for rank in range(4):
        raised = events(job, rank, "raised")
        assert [event["type"] for event in raised] == ["StoreUnavailable"], job.diagnostics()
        assert "store is unreachable" in raised[0]["message"]
        assert not events(job, rank, "done")  # it left long before the end of its 200 steps
