"""``rasd launch`` and a Wrapper that gives up (``gave_up``, ``inprocess.launch_events``): the job ends.

Before, the launcher respawned the workers that gave up, and the replacements waited for a job that had ended
(``RetryController(max_iterations=2)`` under ``--max-respawns 3``: still there 5 minutes later). Now the launcher
respawns nothing, lets the workers end, says once that the job gave up and why, and exits 1.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launching import HERE, Launch

pytestmark = pytest.mark.slow

#: Far longer than the job needs (two imports of torch, three short iterations): it is not a speed test.
DEADLINE_S = 300


def test_a_job_whose_wrapper_gives_up_ends_non_zero_and_nothing_is_respawned(tmp_path: Path) -> None:
    launch = Launch(tmp_path, "--nproc-per-node", "2", "--max-respawns", "3", str(HERE / "give_up_job.py"))
    try:
        assert launch.wait(DEADLINE_S) == 1, launch.tail()
    finally:
        launch.close()
    lines = launch.lines()
    assert len(set(launch.pids())) == 2, lines  # the two workers started first, and no other
    assert not [line for line in lines if re.search(r"respawning it|respawned: pid", line)], lines
    ended = [line for line in lines if re.search(r"worker \d \(pid \d+, rank \d\) ended: ", line)]
    assert len(ended) == 2, lines
    assert all(line.endswith("ended: exit code 1; not respawned: its Wrapper gave up") for line in ended), ended
    said = [line for line in lines if "its inprocess.Wrapper gave up: the job ends" in line]
    assert len(said) == 1, lines  # once, for the first worker that gave up
    last = lines[-1]
    assert last.startswith("rasd launch: every worker has exited: the job gave up (worker "), lines
    assert "RestartAbort: state.iteration=2 self.max_iterations=2" in last and last.endswith("): status 1"), last
    assert [line for line in lines if "the job gave up (" in line] == [last], lines  # the reason said once


def test_a_replacement_still_waiting_when_the_job_gives_up_is_stopped(tmp_path: Path) -> None:
    """Local rank 1 dies first and is respawned; rank 0 gives up before (or just after) the replacement is admitted:
    the replacement never waits for the job that ended (SIGTERM; or it gave up with the job), nothing more is
    respawned, and the status is the Wrapper's give-up (1), not the crash's (3)."""
    argv = ["--nproc-per-node", "2", "--max-respawns", "3", str(HERE / "give_up_job.py"), "--crash-first"]
    launch = Launch(tmp_path, *argv)
    try:
        assert launch.wait(DEADLINE_S) == 1, launch.tail()
    finally:
        launch.close()
    lines = launch.lines()
    assert len(set(launch.pids())) == 3, lines  # two workers, one replacement
    assert len([line for line in lines if "worker 1 respawned: pid" in line]) == 1, lines
    (replacement,) = [line for line in lines if re.search(r"worker 1 \(pid \d+, rank 1\) ended: ", line)][1:]
    assert replacement.endswith(
        ("killed by SIGTERM; not respawned: the job gave up", "exit code 1; not respawned: its Wrapper gave up")
    ), lines
    assert lines[-1].endswith("): status 1") and "the job gave up (worker " in lines[-1], lines
