"""PyTorch Lightning's DDP strategy on the CPU, unchanged, under ``rasd launch --max-restarts 2`` (issue 40): Lightning
sees torchrun's variables and starts no process of its own; a kill -9 and a wedged rank restart the group, which
resumes from ``last.ckpt`` (``trainer.fit(..., ckpt_path="last")``) and finishes. No process of the job is left.
A wedged rank restarts the group through the mesh's verdict: tests/launch/test_launch_accelerate.py holds that path
(an accelerate script), tests/launch/test_launch_group_restart.py for a plain script, and bench/heal.py --group
measures it for this Lightning script.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launching import HERE, Launch, records

pytest.importorskip("pytorch_lightning")
pytestmark = pytest.mark.slow

JOB = str(HERE / "lightning_job.py")


def _run(tmp_path: Path, fault: str, line: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--nproc-per-node", "2", "--max-restarts", "2", JOB, "--out", str(out), "--steps", "20", *fault.split()]
    launch = Launch(tmp_path, *argv, env={"TORCHRAS_TIMEOUT_FACTOR": "0.5"})
    try:
        launch.wait_for(line + r".*: the group restarts \(1 of 2\)", 300)
        assert launch.wait(300) == 0, launch.tail()
    finally:
        launch.close()
    launch.assert_nothing_left()
    found = records(out)
    resumed = [r for r in found if r["event"] == "synced" and r["attempt"] == 1]
    assert len(resumed) == 2 and all(r["step"] >= 5 for r in resumed), resumed  # from last.ckpt, not step 0
    done = [r for r in found if r["event"] == "done"]
    assert len(done) == 2 and {r["step"] for r in done} == {20} and {r["attempt"] for r in done} == {1}, done


def test_lightning_ddp_survives_a_kill_9(tmp_path: Path) -> None:
    # Whichever sees the death first restarts the group: the launcher, as it reaps the worker, or the mesh's
    # PEER_DEAD (rank 0's node finds the process gone), which a quiet machine often sees first.
    killed = r"(worker 1 \(pid \d+, rank 1\) ended: killed by SIGKILL|PEER_DEAD of rank 1 \(pid \d+ .*no longer exists)"
    _run(tmp_path, "--kill 1:8", killed)
