"""A Hugging Face accelerate script on the CPU, unchanged, under ``rasd launch --max-restarts 2`` (issue 40):
``Accelerator()`` initializes torch.distributed from torchrun's variables; a rank wedged in one call is named by the
mesh (COMM_STUCK), the group restarts, resumes from ``accelerator.save_state``'s folder (``load_state``) and
finishes, and the new group's nodes journal the restart with its cause. No process of the job is left. (A kill -9
restarts the group the same way: the Lightning and plain-script tests hold it.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launching import HERE, Launch, records

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

JOB = str(HERE / "accelerate_job.py")


def test_an_accelerate_script_survives_a_wedged_rank(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--nproc-per-node", "2", "--max-restarts", "2", JOB, "--out", str(out), "--steps", "20", "--stall", "0:8"]
    launch = Launch(tmp_path, *argv, env={"TORCHRAS_TIMEOUT_FACTOR": "0.5"})
    try:
        launch.wait_for(r"COMM_STUCK.*rank 0 behind.*: the group restarts \(1 of 2\)", 300)
        assert launch.wait(300) == 0, launch.tail()
    finally:
        launch.close()
    launch.assert_nothing_left()
    found = records(out)
    assert [r["rank"] for r in found if r["event"] == "stalling"] == [0]
    # The new group's nodes journal the restart with its cause (a RESTART event and the torchras_restarts_total
    # metric come from the same call, rasd.record_restart).
    folder = Path(re.search(r"verdict journals in (\S+)/attempt_0/journal\)", launch.err()).group(1))  # type: ignore[union-attr]
    journal = [json.loads(line) for path in (folder / "attempt_1" / "journal").glob("*.jsonl") for line in path.open()]
    restarts = [r for r in journal if r["record"] == "restart"]
    assert len(restarts) == 2 and all("COMM_STUCK" in r["restart"]["cause"] for r in restarts), restarts
    resumed = [r for r in found if r["event"] == "synced" and r["attempt"] == 1]
    assert len(resumed) == 2 and all(r["step"] == 5 for r in resumed), resumed  # from the saved state, not step 0
    done = [r for r in found if r["event"] == "done"]
    assert len(done) == 2 and {r["step"] for r in done} == {20} and {r["attempt"] for r in done} == {1}, done
