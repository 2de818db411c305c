"""The endpoint registry removes what dead processes leave behind: the file of a process killed with -9, of a
zombie, of a pid now reused by a newer process, and a half-written file (docs/operations.md §2)."""

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
from rasd.net.endpoints import TMP_STALE_S, EndpointRegistry


def write(directory: Path, port: int, pid: int, started: float, job: str = "job") -> Path:
    path = directory / f"{port}-{pid}.json"
    path.write_text(
        json.dumps(
            {"host": "localhost", "port": port, "job_id": job, "pid": pid, "started": started, "hostname": "here"}
        )
    )
    return path


def exited_pid() -> int:
    """The pid of a process that ran and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_files_go_and_live_ones_stay(tmp_path: Path) -> None:
    registry = EndpointRegistry(tmp_path)
    me = psutil.Process()
    mine = registry.register("localhost", 28028, "job")
    killed = write(tmp_path, 28028, exited_pid(), time.time())
    reused = write(tmp_path, 28029, os.getpid(), me.create_time() - 3600)  # registered by an older holder of the pid
    torn = tmp_path / "28030-1.tmp"
    torn.write_text("{")
    os.utime(torn, (time.time() - 2 * TMP_STALE_S,) * 2)
    fresh_tmp = tmp_path / "28031-2.tmp"
    fresh_tmp.write_text("{")  # being written right now: left alone
    foreign = tmp_path / "notes-1.json"
    foreign.write_text("not an endpoint")  # not ours to judge
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 30, 0.02, what="a zombie")
    undead = write(tmp_path, 28032, zombie.pid, time.time())
    try:
        assert registry.clean() == 1
        assert sorted(tmp_path.iterdir()) == sorted([mine, fresh_tmp, foreign, tmp_path / ".lock"])
        for gone in (killed, reused, torn, undead):
            assert not gone.exists()
    finally:
        zombie.wait()


def test_unregistering_also_cleans_up_after_others(tmp_path: Path) -> None:
    registry = EndpointRegistry(tmp_path)
    mine = registry.register("localhost", 28028, "job")
    killed = write(tmp_path, 28028, exited_pid(), time.time())
    registry.unregister(mine)
    assert not mine.exists() and not killed.exists()


def test_a_registry_it_cannot_use_is_no_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    registry = EndpointRegistry(blocker / "endpoints")
    assert registry.clean() == 0
    registry.unregister(blocker / "endpoints" / "1-1.json")


def test_a_file_with_an_impossible_pid_is_left_alone_and_breaks_nothing(tmp_path: Path) -> None:
    """psutil raises ValueError on a negative pid: such a file is no endpoint, so it is never asked about."""
    registry = EndpointRegistry(tmp_path)
    odd = write(tmp_path, 28028, -1, time.time())
    assert registry.clean() == 0 and odd.exists()


def test_an_endpoint_whose_process_cannot_be_inspected_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking it for gone would delete a live job's file for good and let another job take its port."""
    registry = EndpointRegistry(tmp_path)
    kept = write(tmp_path, 28028, exited_pid(), time.time())

    def denied(pid: int) -> psutil.Process:
        raise psutil.AccessDenied(pid)

    monkeypatch.setattr(psutil, "Process", denied)
    assert [e.port for e in registry.live()] == [28028] and kept.exists()


def test_an_explicit_endpoint_says_so_and_older_files_are_not_explicit(tmp_path: Path) -> None:
    from torchras_formats.endpoint_files import parse_endpoint, write_endpoint

    given = parse_endpoint(write_endpoint(tmp_path, "localhost", 30001, "job", explicit=True).read_text())
    assert given.explicit and given.port == 30001
    older = json.loads(write(tmp_path, 30002, os.getpid(), time.time()).read_text())  # written before the field
    assert not parse_endpoint(json.dumps(older)).explicit
    with pytest.raises(ValueError, match="explicit"):
        parse_endpoint(json.dumps({**older, "explicit": "yes"}))
