"""``rasd launch`` with real processes that need no torch (``plain_worker.py``): a worker's end never ends the
others, the job's status, signals reaching every worker and its children, output lines never interleaved,
torchrun's ``--log-dir``/``--tee``/``--redirects``/``--local-ranks-filter``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import pytest

from launching import HERE, Launch, alive
from polling import wait_for

pytestmark = pytest.mark.slow

WORKER = str(HERE / "plain_worker.py")


def _run(tmp_path: Path, *argv: str, timeout: float = 120) -> Launch:
    launch = Launch(tmp_path, *argv)
    try:
        launch.wait(timeout)
    finally:
        launch.close()
    return launch


def test_a_job_whose_workers_all_finish_exits_0(tmp_path: Path) -> None:
    launch = _run(tmp_path, "--nproc-per-node", "3", WORKER, "exit", str(tmp_path), "0", "0", "0.2")
    assert launch.process.returncode == 0, launch.tail()
    assert len(list(tmp_path.glob("*.done"))) == 2
    assert (
        launch.lines()[-1] == "rasd launch: every worker has exited: the job finished (3 worker(s) completed): status 0"
    )


@pytest.mark.parametrize(("code", "status", "how"), [(3, 3, "exit code 3"), (-9, 137, "killed by SIGKILL")])
def test_a_failed_worker_leaves_the_others_running_and_is_the_jobs_status(
    tmp_path: Path, code: int, status: int, how: str
) -> None:
    launch = _run(tmp_path, "--nproc-per-node", "3", WORKER, "exit", str(tmp_path), str(code), "1", "3")
    assert launch.process.returncode == status, launch.tail()
    assert sorted(p.name for p in tmp_path.glob("*.done")) == ["0.done", "2.done"]  # trained on to their end
    # It ended before any worker said it runs inprocess.Wrapper: the launcher waits for that verdict (a Wrapper job
    # would restart its group), and once the others ended without a word it is a plain script's failure.
    lines = [line for line in launch.lines() if "worker 1 (pid" in line and "rank 1)" in line]
    assert len(lines) == 2 and how in lines[0] and "before the job started" in lines[0], lines
    assert "the other workers ended without saying that they run inprocess.Wrapper" in lines[1], lines
    assert "nothing could admit a replacement" in lines[1], lines
    assert "the job failed: worker 1 (pid " in launch.lines()[-1] and f"status {status}" in launch.lines()[-1]


@pytest.mark.parametrize("ignore", [False, True], ids=["workers-exit", "a-worker-ignores-SIGTERM"])
def test_sigterm_to_the_launcher_ends_every_worker_and_its_children(tmp_path: Path, ignore: bool) -> None:
    extra = ["--ignore-term"] if ignore else []
    launch = Launch(
        tmp_path, "--nproc-per-node", "3", "--shutdown-timeout", "3", WORKER, "sleep", str(tmp_path), *extra
    )
    try:
        pids = wait_for(  # each worker's pid and its child's
            lambda: [int(pid) for path in tmp_path.glob("*.pids") for pid in path.read_text().split()],
            lambda found: len(found) == 6,
            90,
            0.2,
            what=lambda: f"3 workers' pids\n{launch.tail()}",
        )
        assert all(alive(pid) for pid in pids)
        launch.process.send_signal(signal.SIGTERM)
        assert launch.wait(60) == 128 + signal.SIGTERM, launch.tail()
        wait_for(
            lambda: [pid for pid in pids if alive(pid)],
            lambda living: not living,
            10,
            what=lambda: f"every worker and child to end (the last value: those alive)\n{launch.tail()}",
        )
        assert any("received SIGTERM: passing it to every worker" in line for line in launch.lines())
        forced = any("still running 3 s after the signal: SIGKILL" in line for line in launch.lines())
        assert forced == ignore, launch.tail()
        assert launch.lines()[-1] == "rasd launch: stopped by SIGTERM: status 143"
    finally:
        launch.close()


LINE = re.compile(r"^\[default(\d)\]:(\d):(\d+):(x*):end$")


def test_output_lines_of_different_workers_never_interleave(tmp_path: Path) -> None:
    """Four workers write long lines in pieces, on stdout and stderr at once: every line arrives whole."""
    lines = 40
    launch = _run(tmp_path, "--nproc-per-node", "4", WORKER, "chatter", str(lines), timeout=240)
    assert launch.process.returncode == 0, launch.tail()
    for text in (launch.out(), launch.err()):
        seen: dict[int, list[int]] = {rank: [] for rank in range(4)}
        for line in text.splitlines():
            if line.startswith("rasd launch: "):
                continue
            match = LINE.match(line)
            assert match, f"a line not whole: {line[:200]!r}"
            prefix_rank, rank, index, xs = int(match[1]), int(match[2]), int(match[3]), match[4]
            assert prefix_rank == rank and len(xs) == (index * 997 + rank * 131) % 20000
            seen[rank].append(index)
        assert seen == {rank: list(range(lines)) for rank in range(4)}


def test_log_dir_tee_and_local_ranks_filter_as_torchrun(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    argv = ["--nproc-per-node", "2", "--log-dir", str(logs), "--tee", "3", "--local-ranks-filter", "0"]
    launch = _run(tmp_path, *argv, WORKER, "streams")
    assert launch.process.returncode == 0, launch.tail()
    assert "[default0]:out 0" in launch.out().splitlines() and "out 1" not in launch.out()
    assert "[default0]:err 0" in launch.err().splitlines() and "err 1" not in launch.err()
    (run,) = logs.iterdir()  # <log-dir>/<run id>_<random>, as torchrun's
    for rank in (0, 1):
        folder = run / "attempt_0" / str(rank)
        assert (folder / "stdout.log").read_text() == f"out {rank}\n"
        assert (folder / "stderr.log").read_text() == f"err {rank}\n"


def test_redirects_send_a_stream_to_its_file_only(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    launch = _run(tmp_path, "--nproc-per-node", "2", "--log-dir", str(logs), "--redirects", "1", WORKER, "streams")
    assert launch.process.returncode == 0, launch.tail()
    assert "out " not in launch.out()
    assert {"[default0]:err 0", "[default1]:err 1"} <= set(launch.err().splitlines())
    (run,) = logs.iterdir()
    assert (run / "attempt_0" / "1" / "stdout.log").read_text() == "out 1\n"
    assert not (run / "attempt_0" / "1" / "stderr.log").exists()


def test_no_python_runs_an_executable(tmp_path: Path) -> None:
    launch = _run(tmp_path, "--nproc-per-node", "2", "--no-python", "/bin/sh", "-c", "echo rank $RANK of $WORLD_SIZE")
    assert launch.process.returncode == 0, launch.tail()
    assert sorted(launch.out().splitlines()) == ["[default0]:rank 0 of 2", "[default1]:rank 1 of 2"]
    assert os.path.exists(tmp_path)


def test_module_mode_runs_python_dash_m(tmp_path: Path) -> None:
    launch = _run(tmp_path, "--nproc-per-node", "2", "-m", "tests.launch.plain_worker", "streams")
    assert launch.process.returncode == 0, launch.tail()
    assert sorted(launch.out().splitlines()) == ["[default0]:out 0", "[default1]:out 1"]


def test_a_master_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launch = _run(tmp_path, "--master-addr", "127.0.0.1", "--master-port", str(port), WORKER, "streams")
    assert launch.process.returncode == 1, launch.tail()
    assert any(f"cannot serve the job's store on port {port}" in line for line in launch.lines()), launch.tail()
    assert "out 0" not in launch.out()  # no worker started
