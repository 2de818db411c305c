"""Busy is not hung: the Wrapper's soft and hard timeouts wait for a rank that works, bounded by the busy limit.

Real processes (tests/inprocess/busy_worker.py), each call with its RAS node (the Wrapper starts one), its monitor
process and the store server; the soft and hard timeouts are small (seconds) and so is the busy limit
(``TORCHRAS_BUSY_LIMIT``), so that its bound is tested too. After each job, no process of it is left. What is
checked, against nvidia-resiliency-ext's soft timeout, which restarts a checkpoint that does not ping:

* a rank that works (a ``torch.save`` loop, then a CPU loop) long past its soft and hard timeouts is neither
  restarted nor killed, and is restarted once its time without progress passes the busy limit;
* (a rank idle in ``time.sleep`` still soft-times-out and then hard-times-out: tests/inprocess/test_hard_timeout.py,
  nvidia-resiliency-ext's ``TestHard.test_sleep``);
* two ranks, rank 0 writing while rank 1 waits idle in ``dist.barrier()`` (the mesh holds the barrier SLOW): no
  restart, no kill; the job completes.

Deadlines are generous (torch imports on two busy cores); what is asserted is what happened, not how fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from inprocess import store_server
from inprocess_jobs import free_ports

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
REPOSITORY = HERE.parents[1]
DEADLINE_S = 240


class BusyJob:
    def __init__(
        self, directory: Path, steps: dict[int, list], soft: float, hard: float, env: dict[str, str], repeat: bool
    ):
        self.directory = directory
        self.world_size = len(steps)
        master_port, self.port = free_ports(2)
        scenario = dict(
            out=str(directory / "rank{rank}.jsonl"),
            pidfile=str(directory / "monitor{rank}.pid"),
            logfile=str(directory / "monitor{rank}.log"),
            port=self.port,
            soft=soft,
            hard=hard,
            steps={str(rank): rank_steps for rank, rank_steps in steps.items()},
            repeat=repeat,
        )
        self.processes: list[subprocess.Popen] = []
        for rank in range(self.world_size):
            environment = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(self.world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(master_port),
                BUSY_SCENARIO=json.dumps(scenario),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
                TORCH_CPP_LOG_LEVEL="ERROR",
                **{store_server.LINGER_ENVIRONMENT: "1"},
                **env,
            )
            for name in ("TORCHRAS_ENABLE", "TORCHRAS_REPEATED_FAULTS", "TORCHRAS_WAKE_SIGNAL"):
                if name not in env:
                    environment.pop(name, None)
            with open(directory / f"rank{rank}.stderr", "w") as log:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, str(HERE / "busy_worker.py")], env=environment, stdout=log, stderr=log
                    )
                )

    def wait(self) -> list[int | None]:
        deadline = time.monotonic() + DEADLINE_S
        codes: list[int | None] = []
        for process in self.processes:
            try:
                codes.append(process.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def events(self, rank: int, name: str) -> list[dict]:
        path = self.directory / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [event for event in map(json.loads, lines) if event["event"] == name]

    def monitor_log(self, rank: int) -> str:
        path = self.directory / f"monitor{rank}.log"
        return path.read_text() if path.exists() else ""

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.directory.iterdir())
            if path.suffix in (".stderr", ".log", ".jsonl")
        )

    def leftovers(self) -> list[psutil.Process]:
        """The job's trainers, monitor processes (their pid files) and store server, while they run."""
        found = [psutil.Process(p.pid) for p in self.processes if p.poll() is None]
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if any(part.endswith("store_server.py") for part in cmdline) and str(self.port) in cmdline:
                found.append(process)
        for pidfile in self.directory.glob("monitor*.pid"):
            try:
                monitor = psutil.Process(int(pidfile.read_text()))
                if monitor.status() != psutil.STATUS_ZOMBIE:
                    found.append(monitor)
            except (ValueError, psutil.NoSuchProcess):
                pass
        return found

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 60
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not self.leftovers(), self.diagnostics()

    def kill(self) -> None:
        for process in self.leftovers():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def jobs(tmp_path: Path):
    started: list[BusyJob] = []

    def start(steps: dict[int, list], soft: float, hard: float, repeat: bool = False, **env: str) -> BusyJob:
        directory = tmp_path / f"job{len(started)}"
        directory.mkdir()
        started.append(BusyJob(directory, steps, soft, hard, env, repeat))
        return started[-1]

    yield start
    for job in started:
        job.kill()


def test_a_working_rank_outlives_its_timeouts_and_is_restarted_past_the_busy_limit(jobs) -> None:
    """Soft 2 s, hard 4 s, busy limit 9 s. Iteration 0 writes checkpoints for 6 s (past both timeouts), pings, and
    then computes for 60 s: its soft timeout restarts it once 9 s pass without progress, and nobody kills it."""
    busy_limit = 9.0
    job = jobs({0: [["save", 6], ["ping"], ["cpu", 60]]}, soft=2, hard=4, TORCHRAS_BUSY_LIMIT=str(busy_limit))
    try:
        codes = job.wait()
        report = f"exit codes {codes}\n{job.diagnostics()}"
        assert codes == [0], report
        assert [event["iteration"] for event in job.events(0, "start")] == [0, 1], report
        ends = {event["step"]: event["time"] for event in job.events(0, "end")}
        assert "save" in ends and "ping" in ends and "cpu" not in ends, report  # 6 s of saving, not restarted
        (left,) = job.events(0, "left")
        assert left["error"] == "RankShouldRestart", report
        waited = left["time"] - ends["ping"]
        print(f"computing since the last ping: restarted after {waited:.1f} s (busy limit {busy_limit} s)")
        assert waited >= busy_limit - 0.5, report  # postponed until the bound, not restarted at 2 s
        log = job.monitor_log(0)
        assert log.count("soft timeout postponed: rank 0's process is working (CPU or I/O), not hung") == 1, log
        assert "soft timeout in iteration 0" in log and "hard timeout in iteration" not in log, log
        job.assert_nothing_left()
    finally:
        job.kill()


def test_ranks_waiting_in_a_barrier_for_a_working_rank_are_not_restarted(jobs) -> None:
    """Rank 0 writes checkpoints for 12 s while rank 1 waits idle in ``dist.barrier()``: the mesh holds the barrier
    SLOW (timers scaled by 0.2), which postpones rank 1's timeouts (soft 4 s, hard 8 s) as rank 0's work postpones
    its own. Nobody is restarted or killed; the job completes."""
    job = jobs(
        {0: [["save", 12], ["barrier"]], 1: [["barrier"]]},
        soft=4,
        hard=8,
        TORCHRAS_TIMEOUT_FACTOR="0.2",
        TORCHRAS_BUSY_LIMIT="300",  # 60 s once scaled
    )
    try:
        codes = job.wait()
        report = f"exit codes {codes}\n{job.diagnostics()}"
        assert codes == [0, 0], report
        for rank in (0, 1):
            assert [event["iteration"] for event in job.events(rank, "start")] == [0], report
            assert not job.events(rank, "left"), report
            log = job.monitor_log(rank)
            assert "soft timeout in iteration" not in log and "hard timeout in iteration" not in log, log
        assert "soft timeout postponed: rank 0's process is working" in job.monitor_log(0), report
        waited = job.events(1, "end")[0]["time"] - job.events(1, "begin")[0]["time"]
        print(f"rank 1 waited {waited:.1f} s in the barrier")
        assert waited > 8, report  # past its hard timeout
        assert "soft timeout postponed: rank 1 waits in a collective" in job.monitor_log(1), report
        job.assert_nothing_left()
    finally:
        job.kill()
