"""--list: the jobs serving on this node, from the endpoint files of their live processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from polling import wait_until
from rascli.listing import group_jobs
from rascli.processes import process_alive
from rascli_helpers import rascli_run, run_cli
from torchras_formats.endpoint_files import Endpoint, parse_endpoint, read_endpoints, run_dir, scan, write_endpoint

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
    jobs = group_jobs(read_endpoints(tmp_path, process_alive))
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
    jobs = group_jobs(read_endpoints(tmp_path, process_alive))
    assert [(job.port, job.job_id) for job in jobs] == [(28028, "aa11")]


def test_process_alive() -> None:
    assert process_alive(ME, MY_START + 1)
    assert not process_alive(dead_pid(), time.time())
    assert not process_alive(ME, MY_START - 100)


class _Uninspectable:
    """A psutil.Process whose every question fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __call__(self, pid: int) -> _Uninspectable:
        return self

    def status(self) -> str:
        raise self.error

    def create_time(self) -> float:
        raise self.error


@pytest.mark.parametrize(
    ("error", "alive"),
    [
        (psutil.NoSuchProcess(4242), False),
        (psutil.ZombieProcess(4242), False),  # a NoSuchProcess too: exited, not reaped
        (psutil.AccessDenied(4242), True),  # it exists; we may not look: never taken for gone
        (psutil.Error("unknown"), True),
        (PermissionError(13, "denied"), True),
    ],
)
def test_only_evidence_of_absence_makes_a_process_gone(
    monkeypatch: pytest.MonkeyPatch, error: Exception, alive: bool
) -> None:
    """A live job whose process cannot be inspected keeps its endpoint: taking it for gone would delete its file for
    good, hide the job from --list and free its port for another job."""
    monkeypatch.setattr(psutil, "Process", _Uninspectable(error))
    assert process_alive(4242, time.time()) is alive


def test_a_zombie_serves_nothing() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30, 0.02, what="a zombie")
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


def test_written_endpoints_read_back(tmp_path: Path) -> None:
    path = write_endpoint(tmp_path, "localhost", 28028, "3f2a9c")
    assert path == tmp_path / f"28028-{ME}.json" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    (endpoint,) = read_endpoints(tmp_path, process_alive)
    assert (endpoint.host, endpoint.port, endpoint.job_id, endpoint.pid) == ("localhost", 28028, "3f2a9c", ME)
    assert parse_endpoint(path.read_text()) == endpoint
    assert json.loads(path.read_text()) == endpoint.as_json()


@pytest.mark.parametrize(
    "change",
    [
        {"pid": -1},  # psutil raises ValueError on it: never asked
        {"pid": 0},
        {"pid": True},
        {"port": "28028"},
        {"port": 70000},
        {"job_id": 7},
        {"started": "now"},
        {"started": float("nan")},
        {"hostname": None},
        {"host": None},
    ],
)
def test_a_file_with_a_field_of_the_wrong_kind_is_no_endpoint(tmp_path: Path, change: dict[str, object]) -> None:
    good = Endpoint("localhost", 28028, "aa11", ME, MY_START + 1, "node7").as_json()
    parse_endpoint(json.dumps(good))
    with pytest.raises(ValueError):
        parse_endpoint(json.dumps({**good, **change}))
    (tmp_path / f"28028-{ME}.json").write_text(json.dumps({**good, **change}))
    assert scan(tmp_path, process_alive) == ([], [])  # neither live nor stale: not ours to judge


def test_every_field_but_the_hostname_is_required() -> None:
    good = Endpoint("localhost", 28028, "aa11", ME, MY_START + 1, "node7").as_json()
    assert parse_endpoint(json.dumps({k: v for k, v in good.items() if k != "hostname"})).hostname == ""
    for name in ("host", "port", "job_id", "pid", "started"):
        with pytest.raises(ValueError):
            parse_endpoint(json.dumps({k: v for k, v in good.items() if k != name}))


def test_scan_tells_stale_files_apart(tmp_path: Path) -> None:
    register(tmp_path, 28028, ME, "aa11")
    register(tmp_path, 28030, dead_pid(), "cc33")
    live, stale = scan(tmp_path, process_alive)
    assert [e.port for e in live] == [28028] and [p.name for p in stale] == [next(tmp_path.glob("28030-*")).name]
    assert scan(tmp_path / "missing", process_alive) == ([], [])
