"""--list: the jobs serving on this node, from the endpoint files of their live processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from rascli.endpoints import group_jobs, process_alive, read_endpoints, run_dir
from rascli_helpers import rascli_run, run_cli

ME = os.getpid()
MY_START = psutil.Process(ME).create_time()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(30)
    return process.pid


def register(directory: Path, port: int, pid: int, job_id: str, started: float | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{port}-{pid}.json").write_text(
        json.dumps(
            {
                "host": "localhost",
                "port": port,
                "job_id": job_id,
                "pid": pid,
                "started": MY_START + 1 if started is None else started,
                "hostname": "node7",
            }
        )
    )


def live_pids(n: int) -> list[int]:
    """Processes that exist: this one and its ancestors (each started before the endpoints claim)."""
    pids = [ME] + [p.pid for p in psutil.Process(ME).parents()]
    return pids[:n]


def test_jobs_are_grouped_by_port_and_job_id(tmp_path: Path) -> None:
    pids = live_pids(2)
    register(tmp_path, 28028, pids[0], "aa11", started=MY_START + 5)
    register(tmp_path, 28028, pids[1], "aa11", started=MY_START + 3)
    register(tmp_path, 28029, pids[0], "bb22")
    jobs = group_jobs(read_endpoints(tmp_path))
    assert [(job.port, job.job_id, len(job.pids)) for job in jobs] == [
        (28028, "aa11", len(set(pids))),
        (28029, "bb22", 1),
    ]
    assert jobs[0].started == MY_START + 3


def test_files_of_gone_processes_and_junk_are_ignored(tmp_path: Path) -> None:
    register(tmp_path, 28028, ME, "aa11")
    register(tmp_path, 28030, dead_pid(), "cc33")
    register(tmp_path, 28031, ME, "dd44", started=MY_START - 3600)  # the pid now belongs to a newer process
    (tmp_path / "28032-1.json").write_text("{not json")
    (tmp_path / "28033-1.json").write_text(json.dumps({"port": "x", "pid": 1, "job_id": "e"}))
    (tmp_path / "28034-1.json").write_text(json.dumps([1, 2]))
    (tmp_path / "notes.txt").write_text("ignored")
    jobs = group_jobs(read_endpoints(tmp_path))
    assert [(job.port, job.job_id) for job in jobs] == [(28028, "aa11")]


def test_process_alive() -> None:
    assert process_alive(ME, MY_START + 1)
    assert not process_alive(dead_pid(), time.time())
    assert not process_alive(ME, MY_START - 100)


def test_a_zombie_serves_nothing() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not process_alive(zombie.pid, time.time())
    finally:
        zombie.wait()


def test_run_dir() -> None:
    assert run_dir({"TORCHRAS_RUN_DIR": "/x/y"}) == Path("/x/y")
    assert run_dir({}) == Path(f"/tmp/torchras-{os.getuid()}/endpoints")


def test_list_output_in_a_pipe(tmp_path: Path) -> None:
    register(tmp_path, 28028, ME, "3f2a9c")
    register(tmp_path, 28029, ME, "77b1e0")
    result = run_cli(["--list"], environ={"TORCHRAS_RUN_DIR": str(tmp_path)})
    assert result.code == 0
    lines = result.out.decode().splitlines()
    assert lines[0].split() == ["PORT", "JOB", "ID", "PROCESSES", "STARTED"]
    assert lines[1].split()[:3] == ["28028", "3f2a9c", "1"]
    assert lines[2].split()[:3] == ["28029", "77b1e0", "1"]
    assert "ago)" in lines[1]


def test_list_on_a_terminal_and_as_json(tmp_path: Path) -> None:
    register(tmp_path, 28028, ME, "3f2a9c")
    screen = run_cli(["--list"], tty=True, environ={"TORCHRAS_RUN_DIR": str(tmp_path)}).screen
    assert "torchras jobs serving on this node" in screen and "28028" in screen and "3f2a9c" in screen
    result = run_cli(["--list", "-f", "json"], environ={"TORCHRAS_RUN_DIR": str(tmp_path)})
    assert json.loads(result.out) == [
        {"host": "localhost", "port": 28028, "job_id": "3f2a9c", "processes": 1, "pids": [ME], "started": MY_START + 1}
    ]


def test_list_with_no_jobs(tmp_path: Path) -> None:
    result = run_cli(["--list"], environ={"TORCHRAS_RUN_DIR": str(tmp_path / "missing")})
    assert result.code == 0
    assert result.out == b""
    assert "No torchras job is serving on this node" in result.err


def test_list_as_a_command(tmp_path: Path) -> None:
    register(tmp_path, 28040, ME, "abcdef")
    done = rascli_run(["--list"], env={"TORCHRAS_RUN_DIR": str(tmp_path)})
    assert done.returncode == 0
    assert b"28040" in done.stdout and b"abcdef" in done.stdout
