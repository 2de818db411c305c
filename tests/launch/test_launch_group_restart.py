"""A plain DDP script (no import of torchras, tests/launch/plain_ddp_job.py) under ``rasd launch`` (issue 40): a RAS
node in every worker from its first step, and torchrun's ``--max-restarts`` made fast: a kill -9 or a wedged rank
restarts the group (a fresh store, the checkpoint loaded) and the job finishes (a wedge: tests/launch/
test_launch_accelerate.py, an accelerate script, with the restart's journal records); ``--max-restarts`` used up
ends the job with the cause. After each, no process of the job is left. Deadlines are generous (2 shared cores).
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from launching import HERE, Launch, free_port, records
from polling import wait_until

pytestmark = pytest.mark.slow

JOB = str(HERE / "plain_ddp_job.py")
FAST = {"TORCHRAS_TIMEOUT_FACTOR": "0.5"}


def _launch(tmp_path: Path, *job: str, launcher: tuple[str, ...] = ("--max-restarts", "2"), env=None) -> Launch:
    out = tmp_path / "out"
    out.mkdir()
    argv = ["--nproc-per-node", "4", *launcher, JOB, "--out", str(out), "--checkpoint", str(out / "ckpt.pt"), *job]
    return Launch(tmp_path, *argv, env={**FAST, **(env or {})})


def _report(port: int) -> str:
    """``VERBOSE STATUS`` from the job's client port ('' while nobody answers)."""
    try:
        with socket.create_connection(("127.0.0.1", port), 5) as sock:
            sock.settimeout(10)
            sock.sendall(b"CLIENT PROTOCOL 2\n")
            if sock.recv(64) != b"SERVER PROTOCOL 2\n":
                return ""
            sock.sendall(b"VERBOSE STATUS\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def _finished(launch: Launch, out: Path, steps: int) -> list[dict]:
    assert launch.wait(300) == 0, launch.tail()
    done = [r for r in records(out) if r["event"] == "done"]
    assert len(done) == 4 and {r["step"] for r in done} == {steps}, done
    assert len({r["hash"] for r in done}) == 1, done  # one model: the group trained together again
    assert launch.lines()[-1].endswith("the job finished (4 worker(s) completed): status 0"), launch.tail()
    return done


def test_a_plain_script_has_a_ras_report_from_its_first_step_with_one_node_per_worker(tmp_path: Path) -> None:
    """The report counts 4 processes (not 8: the script's own rasd.install() joins the node the launcher gave it,
    and the data loaders' worker processes start none) and the world communicator, while the job trains."""
    port = free_port()
    launch = _launch(tmp_path, "--steps", "100000", "--loader", "--install", env={"TORCHRAS_ADDR": f"127.0.0.1:{port}"})
    out = tmp_path / "out"
    try:
        launch.wait_for_records(out, lambda r: r["event"] == "step" and r["step"] == 1, 4, 240)
        report = wait_until(
            lambda: (text := _report(port)) and re.search(r"^\s+1\s+4\s+0\s+4\s+0\s*$", text, re.M) and text,
            60,
            0.5,
            what=lambda: f"a report of 4 processes:\n{_report(port)}",
        )
        assert "RUNNING" in report, report
    finally:
        launch.close()
    launch.assert_nothing_left()


def test_max_restarts_used_up_ends_the_job_with_the_cause(tmp_path: Path) -> None:
    """--max-restarts 1: the kill -9 in the first group restarts the group once (a fresh store; every rank loads
    the checkpoint rank 0 wrote at step 10); the wedge the test causes in the second (SIGSTOP of a worker:
    PEER_HUNG) ends the job, non-zero, with that verdict in the last line. (A group restart that then finishes:
    tests/launch/test_launch_accelerate.py, test_launch_lightning.py.)"""
    launch = _launch(tmp_path, "--steps", "100000", "--kill", "1:12", launcher=("--max-restarts", "1"))
    out = tmp_path / "out"
    try:
        # The kill is seen first by the launcher (the worker's end) or by the mesh (PEER_DEAD): either restarts it.
        launch.wait_for(
            r"(worker 1 \(pid \d+, rank 1\) ended: killed by SIGKILL|PEER_DEAD of rank 1)"
            r".*: the group restarts \(1 of 1\)",
            240,
        )
        launch.wait_for(r"the group started again \(attempt 1\)", 60)
        launch.wait_for_records(out, lambda r: r["event"] == "step" and r["attempt"] == 1, 8, 240)
        synced = [r for r in records(out) if r["event"] == "synced" and r["attempt"] == 1]
        assert len(synced) == 4 and {r["step"] for r in synced} == {10}, synced  # from the checkpoint of step 10
        victim = next(r["pid"] for r in records(out) if r["event"] == "synced" and r["attempt"] == 1 and r["rank"] == 3)
        import os
        import signal

        os.kill(victim, signal.SIGSTOP)
        stopped = time.time()
        assert launch.wait(240) != 0, launch.tail()
    finally:
        launch.close()
    launch.assert_nothing_left()
    last = launch.lines()[-1]
    assert re.search(r"the job failed: (PEER_HUNG of rank 3|COMM_STUCK).*after 1 restart\(s\) of the group", last), last
    assert time.time() - stopped < 200


def test_a_job_that_mixes_wrapped_and_plain_workers_is_refused_at_once(tmp_path: Path) -> None:
    """Local rank 0 under inprocess.Wrapper, ranks 1-3 plain (tests/launch/mixed_job.py): the Wrapper's rank waits at
    its start-up barrier, the others inside init_process_group, for each other. Refused as soon as both kinds
    have said how they train, with the line that says why; non-zero; nothing left."""
    launch = Launch(tmp_path, "--nproc-per-node", "4", "--max-restarts", "2", str(HERE / "mixed_job.py"), env=FAST)
    try:
        launch.wait_for(r"the job mixes workers under inprocess\.Wrapper \(local rank\(s\) \[0\]\)", 120)
        refused = time.time()
        assert launch.wait(120) != 0, launch.tail()
    finally:
        launch.close()
    launch.assert_nothing_left()
    assert time.time() - refused < 60
    assert "the job was refused: it mixes workers with and without inprocess.Wrapper" in launch.lines()[-1], (
        launch.tail()
    )
