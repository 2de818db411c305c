"""Launch a multi-process gloo job of ``inprocess_workload.py`` and read back what every rank reported."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = Path(__file__).with_name("inprocess_workload.py")
REPOSITORY = Path(__file__).resolve().parents[2]


def model_hash(model) -> str:
    """A short digest of a model's weights: ranks holding identical weights give the same one."""
    import hashlib

    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def data_parallel_step(model, optimizer, step: int, rank: int, world_size: int, features: int) -> None:
    """One step of the elastic tests' workloads: a batch seeded by (step, rank), gradients averaged by all-reduce."""
    import torch
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(step * 100 + rank)
    optimizer.zero_grad()
    model(torch.randn(8, features, generator=generator)).pow(2).mean().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world_size
    optimizer.step()


def free_ports(count: int) -> list[int]:
    """Distinct free ports (bound to port 0 together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclasses.dataclass
class Job:
    world_size: int
    directory: Path
    scenario: dict
    processes: list[subprocess.Popen] = dataclasses.field(default_factory=list)
    #: Per rank, the tests/netns.py host it runs in (``.popen``, ``.ip``); None: this machine, on loopback.
    hosts: list | None = None
    environment: dict = dataclasses.field(default_factory=dict)

    def start(self) -> Job:
        master_port, wrapper_port = free_ports(2)
        self.scenario = dict(
            self.scenario,
            out=str(self.directory / "rank{rank}.jsonl"),
            pidfile=str(self.directory / "monitor{rank}.pid"),
            logfile=str(self.directory / "monitor{rank}.log"),
            wrapper_port=wrapper_port,
        )
        for rank in range(self.world_size):
            env = dict(
                os.environ,
                **self.environment,
                RANK=str(rank),
                WORLD_SIZE=str(self.world_size),
                MASTER_ADDR=self.hosts[0].ip if self.hosts else "127.0.0.1",
                MASTER_PORT=str(master_port),
                INPROCESS_TEST_SCENARIO=json.dumps(self.scenario),
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
                TORCH_CPP_LOG_LEVEL="ERROR",
            )
            env.update(self.scenario.get("env", {}))  # e.g. TORCHRAS_TIMEOUT_FACTOR for the rasd mesh
            popen = self.hosts[rank].popen if self.hosts else subprocess.Popen
            debug = [os.environ["INPROCESS_TEST_DEBUG"]] if os.environ.get("INPROCESS_TEST_DEBUG") else []
            with open(self.directory / f"rank{rank}.stderr", "w") as log:  # the rank writes to its own copy
                self.processes.append(
                    popen([sys.executable, *debug, str(WORKLOAD)], env=env, stdout=log, stderr=subprocess.STDOUT)
                )
        return self

    def wait(self, timeout: float, ranks: list[int] | None = None) -> list[int | None]:
        """Exit codes of ``ranks`` (default: all; None: still running at the deadline)."""
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for rank, process in enumerate(self.processes):
            if ranks is not None and rank not in ranks:
                continue
            try:
                codes.append(process.wait(max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def events(self, rank: int) -> list[dict]:
        path = self.directory / f"rank{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def all_events(self) -> dict[int, list[dict]]:
        return {rank: self.events(rank) for rank in range(self.world_size)}

    def stderr(self, rank: int) -> str:
        """What the rank wrote to stderr and stdout (its log lines)."""
        path = self.directory / f"rank{rank}.stderr"
        return path.read_text(errors="replace") if path.exists() else ""

    def diagnostics(self) -> str:
        parts = []
        for path in sorted(self.directory.iterdir()):
            if path.suffix in (".stderr", ".log", ".jsonl"):
                parts.append(f"--- {path.name}\n{path.read_text()[-3000:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        """Kill every trainer and every monitor process still alive (teardown)."""
        for process in self.processes:
            if process.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        process.send_signal(sig)
                    except ProcessLookupError:
                        pass
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for pidfile in self.directory.glob("monitor*.pid"):
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass


def events(job: Job, rank: int, name: str) -> list[dict]:
    """The events called ``name`` that initial rank ``rank`` reported, in order."""
    return [event for event in job.events(rank) if event["event"] == name]


def iterations(job: Job, rank: int, name: str) -> list[int]:
    return [event["iteration"] for event in events(job, rank, name)]


def started(job: Job, rank: int, iteration: int) -> dict:
    """The "start" event of initial rank ``rank`` in ``iteration`` (asserted to exist)."""
    matches = [event for event in events(job, rank, "start") if event["iteration"] == iteration]
    assert matches, f"initial rank {rank} did not start iteration {iteration}\n{job.diagnostics()}"
    return matches[0]


def diagnostics(directory: Path) -> str:
    """The tail of every rank's stderr and event log in a job's directory, for an assertion message."""
    return "\n".join(
        f"--- {path.name}\n{path.read_text()[-2500:]}"
        for path in sorted(directory.iterdir())
        if path.suffix in (".stderr", ".jsonl")
    )


def reap(processes: list[subprocess.Popen], directory: Path, pidfiles: str = "*.pid") -> None:
    """Kill a job's ranks and the monitor processes whose pids they wrote to ``directory``."""
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(10)
    for pidfile in directory.glob(pidfiles):
        try:
            os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass
