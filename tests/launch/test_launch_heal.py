"""``rasd launch`` with real torch.distributed (gloo) jobs: a torchrun script runs unchanged (the environment and
the store torchrun gives it), and a Wrapper-wrapped DDP job with ``inprocess.elastic`` state heals itself: a killed
worker is respawned and admitted (the world back to full size, identical model bytes on every rank, no checkpoint),
and a worker that keeps dying stops being respawned while the job goes on smaller.

Deadlines are generous (2 shared cores); how fast it heals is measured in bench/heal.py, never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launching import HERE, REPOSITORY, Launch, free_base_port, free_port, records
from polling import wait_until

pytestmark = pytest.mark.slow

JOB = str(HERE / "heal_job.py")


def test_a_worker_that_keeps_dying_is_respawned_max_respawns_times_and_the_job_goes_on_smaller(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--nproc-per-node", "3", "--max-respawns", "2", "--respawn-backoff", "0.5", JOB, "--out", str(out)]
    launch = Launch(tmp_path, *argv, "--kill", "2:6", "--die", "2", "--steps", "20")
    try:
        launch.wait_for(r"worker 2 .*ended: killed by SIGKILL; not respawned again: .*--max-respawns 2", 300)
        launch.wait_for_records(out, lambda r: r["event"] == "step" and r["world"] == 2 and r["step"] >= 12, 2, 120)
        (out / "finish").touch()
        assert launch.wait(180) == 0, launch.tail()  # training finished: the lost worker was survived
    finally:
        launch.close()
    lines = launch.lines()
    assert len([line for line in lines if "worker 2 respawned" in line]) == 2, lines
    assert len([line for line in lines if "worker 2 " in line and "ended: killed by SIGKILL" in line]) == 3, lines
    assert [line for line in lines if "respawning it (2 of 2) in 0.5 s" in line], lines  # the back-off
    done = [r for r in records(out) if r["event"] == "done"]
    assert len(done) == 2 and {r["world"] for r in done} == {2} and len({r["hash"] for r in done}) == 1, done


def test_a_torchrun_script_gets_torchruns_environment_and_store(tmp_path: Path) -> None:
    """``init_process_group("env://")`` connects to the store the launcher serves on MASTER_PORT; every variable
    but the run-specific paths is what torchrun gives, for the same command line."""
    port = free_port()
    common = ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    launch = Launch(tmp_path, *common, str(HERE / "env_job.py"), str(tmp_path / "ours-"))
    try:
        assert launch.wait(180) == 0, launch.tail()
    finally:
        launch.close()
    env = {"PYTHONPATH": str(REPOSITORY), "TORCH_CPP_LOG_LEVEL": "ERROR", "PATH": "/usr/bin:/bin"}
    theirs = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *common, str(HERE / "env_job.py"), str(tmp_path / "theirs-")],
        env=env,
        capture_output=True,
        timeout=180,
    )
    assert theirs.returncode == 0, theirs.stderr.decode()[-3000:]
    for rank in (0, 1):
        ours = json.loads((tmp_path / f"ours-{rank}.json").read_text())
        torchrun = json.loads((tmp_path / f"theirs-{rank}.json").read_text())
        assert ours.pop("TORCHELASTIC_ERROR_FILE").endswith(f"/attempt_0/{rank}/error.json")
        assert torchrun.pop("TORCHELASTIC_ERROR_FILE").endswith(f"/attempt_0/{rank}/error.json")
        assert ours["sum"] == 3.0
        assert {k: v for k, v in ours.items() if k != "argv"} == {k: v for k, v in torchrun.items() if k != "argv"}


def test_a_wrapped_user_job_written_for_torchrun_runs_unchanged(tmp_path: Path) -> None:
    """tests/acceptance/user_job.py: the Wrapper's store on MASTER_PORT + 1, its own on MASTER_PORT + 2 (2 ranks:
    what is tested is the ports and the environment, not the size)."""
    out = tmp_path / "out"
    out.mkdir()
    script = REPOSITORY / "tests" / "acceptance" / "user_job.py"
    argv = ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_base_port())]
    launch = Launch(tmp_path, *argv, str(script), "--model", "ddp", "--steps", "20", "--out", str(out))
    try:

        def finished() -> bool:
            assert launch.process.poll() is None, launch.tail()
            return len(list(out.glob("rank*.json"))) == 2  # each written whole when it appears

        wait_until(finished, 240, 0.5, what=lambda: f"every rank's results:\n{launch.tail()}")
        results = [json.loads(path.read_text()) for path in out.glob("rank*.json")]
        assert len(results) == 2 and {r["steps"] for r in results} == {20} and {r["world"] for r in results} == {2}
        (out / "release").touch()
        assert launch.wait(120) == 0, launch.tail()
    finally:
        launch.close()
