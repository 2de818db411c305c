"""Processes joining a running inprocess.Wrapper job (docs/elastic.md section 5), with real gloo jobs.

Run as a script, this file is one process of the job (the workload); as a test module, it launches the jobs:

* the rules that need processes: a newcomer whose join timeout passes fails clearly (not retryable), and a
  pending newcomer fails as ``closed`` when the job completes;
* the discovery hook (a Horovod-style script) stops listing a host: its process leaves at the next round, cleanly
  (exit 0, the mesh sees it leave, not die), and the other trains on.

A kill -9 that shrinks a job (a fault-triggered round), then a process started later that waits, is admitted at a
round that a commit triggers and gets the state by ``state.sync()`` (identical weights on every rank): the
launcher's replacements do exactly that, tests/launch/test_launch_heal.py (and the demo's, with FSDP2,
tests/acceptance/test_demo.py, whose restart lines name the JOIN_WAITING round).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# ---- the workload (one process) -------------------------------------------------------------------------------


def workload() -> int:
    scenario = json.loads(os.environ["ELASTIC_JOIN_SCENARIO"])
    name = os.environ["ELASTIC_JOIN_NAME"]
    out = open(scenario["out"].format(name=name), "a", buffering=1)  # noqa: SIM115 - open until the process ends

    def emit(**fields: object) -> None:
        out.write(json.dumps(dict(fields, name=name, time=time.time())) + "\n")

    import faulthandler
    import logging

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a stuck run's stacks, for its diagnostics
    logging.basicConfig(level=logging.WARNING, format=f"[{name}] %(name)s %(levelname)s %(message)s")
    logging.getLogger("inprocess.wrap").setLevel(logging.INFO)  # "waits to join", "joins as rank", restarts

    import torch
    import torch.distributed as dist

    import inprocess
    from inprocess.elastic import HostRemoved, JoinFailed, Joining, TorchState
    from inprocess_jobs import data_parallel_step, model_hash

    seconds = datetime.timedelta(seconds=1)
    torch.manual_seed(1000 + len(name))  # a newcomer's initial weights differ: only the sync makes them equal
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = TorchState(model, optimizer, step=0)
    finish = Path(scenario["finish"])

    @inprocess.Wrapper(
        store_kwargs={"port": scenario["wrapper_port"], "timeout": 60 * seconds},
        monitor_thread_interval=0.1 * seconds,
        monitor_process_interval=0.1 * seconds,
        progress_watchdog_interval=0.1 * seconds,
        heartbeat_interval=0.5 * seconds,
        heartbeat_timeout=20 * seconds,
        soft_timeout=90 * seconds,
        hard_timeout=100 * seconds,
        barrier_timeout=120 * seconds,
        completion_timeout=80 * seconds,
        last_call_wait=0.1 * seconds,
        termination_grace_time=0.5 * seconds,
        monitor_process_pidfile=scenario["pidfile"].format(name=name),
        joining=Joining(
            max_nodes=scenario["max_nodes"],
            last_call=0.5,
            join_timeout=float(os.environ.get("ELASTIC_JOIN_TIMEOUT", 120)),
            check_every=scenario["check_every"],
            discovery=scenario.get("discovery"),
            discovery_interval=0.5,
        ),
    )
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iteration = call_wrapper.iteration
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "gloo", store=call_wrapper.store, rank=rank, world_size=world_size, timeout=120 * seconds
        )
        outcome = state.sync()
        emit(
            event="synced",
            iteration=iteration,
            rank=rank,
            world_size=world_size,
            step=state.step,
            hash=model_hash(model),
            source=outcome.source,
            broadcast=outcome.broadcast,
        )
        while True:
            stop = torch.tensor([float(finish.exists() and state.step >= scenario["steps"])])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if stop.item():
                break
            data_parallel_step(model, optimizer, state.step, rank, world_size, features=16)
            state.step += 1
            if state.step % 2 == 0:
                state.commit()
                emit(event="commit", iteration=iteration, step=state.step, world_size=world_size)
            time.sleep(0.02)
        dist.barrier()
        emit(event="done", iteration=iteration, step=state.step, hash=model_hash(model), world_size=world_size)
        dist.destroy_process_group()

    try:
        train()
    except JoinFailed as error:
        emit(event="failed", reason=error.reason, message=str(error))
        return 3
    except HostRemoved as error:
        emit(event="removed", host=error.host)
    return 0


# ---- the tests ------------------------------------------------------------------------------------------------

# The tests' helpers (this folder's, tests/polling.py); this runs in the workload's processes too.
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

from polling import wait_for, wait_until  # noqa: E402 - once the helpers' folders are on the path


class JoinJob:
    """The initial ranks of a job and the processes started into it later, each named (``r0``.., ``new1``..)."""

    def __init__(self, directory: Path, world_size: int, **scenario: object) -> None:
        from inprocess_jobs import REPOSITORY, free_ports

        self.directory = directory
        self.scenario = dict(
            scenario,
            out=str(directory / "{name}.jsonl"),
            pidfile=str(directory / "{name}.pid"),
            finish=str(directory / "finish"),
            wrapper_port=free_ports(1)[0],
        )
        #: The job's client port (STATUS), its own so that no other job on the machine answers.
        self.status_port = free_ports(1)[0]
        self.base_env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            WORLD_SIZE=str(world_size),
            TORCHRAS_ADDR=f"127.0.0.1:{self.status_port}",
            ELASTIC_JOIN_SCENARIO=json.dumps(self.scenario),
            TORCH_CPP_LOG_LEVEL="ERROR",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        )
        self.processes: dict[str, subprocess.Popen] = {}
        for rank in range(world_size):
            self.start(f"r{rank}", RANK=str(rank))

    def start(self, name: str, **env: str) -> subprocess.Popen:
        env = {**self.scenario.get("env", {}).get(name, {}), **env}  # type: ignore[union-attr]
        log = open(self.directory / f"{name}.stderr", "w")  # noqa: SIM115 - the child writes to its own copy
        environment = dict(self.base_env, ELASTIC_JOIN_NAME=name, **env)
        if name.startswith("new"):
            environment.pop("RANK", None)
            environment.update(INPROCESS_JOIN="1")
        process = subprocess.Popen([sys.executable, __file__], env=environment, stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = process
        return process

    def events(self, name: str, event: str | None = None) -> list[dict]:
        path = self.directory / f"{name}.jsonl"
        found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return [item for item in found if event is None or item["event"] == event]

    def wait_for(self, name: str, predicate, timeout: float, what: str) -> dict:
        """The first event of ``name`` that satisfies ``predicate``, once there is one; fails after ``timeout``."""
        return wait_until(
            lambda: next((item for item in self.events(name) if predicate(item)), None),
            timeout,
            what=lambda: f"{what} ({name})\n{self.diagnostics()}",
        )

    def finish(self) -> None:
        (self.directory / "finish").write_text("")

    def wait(self, names: list[str], timeout: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for name in names:
            try:
                codes[name] = self.processes[name].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes

    def status(self) -> str:
        """The job's text STATUS report, as ``echo status | nc`` prints it ("" when nobody answered)."""
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.status_port), 5) as connection:
                connection.settimeout(20)
                connection.sendall(b"CLIENT PROTOCOL 2\nSTATUS\n")
                chunks = []
                while data := connection.recv(65536):
                    chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
        except OSError:
            return ""

    def diagnostics(self) -> str:
        from inprocess_jobs import diagnostics

        return diagnostics(self.directory)

    def stop(self) -> None:
        signalled = [name for name, process in self.processes.items() if process.poll() is None]
        for name in signalled:
            self.processes[name].send_signal(signal.SIGUSR1)  # stacks into its .stderr, if the run failed

        def dumped(name: str) -> bool:
            stderr = (self.directory / f"{name}.stderr").read_text(errors="replace")
            return self.processes[name].poll() is not None or "most recent call first" in stderr

        try:
            wait_until(lambda: all(dumped(name) for name in signalled), 5, 0.05, what="the stacks")
        except AssertionError:
            pass  # diagnostics only: reap them anyway
        from inprocess_jobs import reap

        reap(list(self.processes.values()), self.directory)


@pytest.mark.slow
def test_a_join_timeout_fails_clearly_and_a_completed_job_is_closed_to_newcomers(tmp_path: Path) -> None:
    # check_every is so large that no commit starts a round: the newcomers wait. They start with the job (they find
    # it through the store once it runs), so that the three interpreters start together.
    job = JoinJob(tmp_path, 1, max_nodes=3, check_every=10**9, steps=10)
    try:
        job.start("new1", ELASTIC_JOIN_TIMEOUT="1.5")
        job.start("new2")
        codes = job.wait(["new1"], 90)
        assert codes == {"new1": 3}, job.diagnostics()
        failed = job.events("new1", "failed")
        assert [item["reason"] for item in failed] == ["timeout"], job.diagnostics()
        assert "join timeout" in failed[0]["message"]
        deadline = time.monotonic() + 60
        wait_until(lambda: "waits to join" in (tmp_path / "new2.stderr").read_text(), 60, what="new2 to wait")
        # While it waits, it is in the mesh: STATUS counts it and lists it under WAITING (issue 13).
        waiting = "WAITING\n  1 job process joined the job and waits to be admitted at its next round\n"
        report = wait_for(job.status, lambda r: waiting in r, deadline - time.monotonic(), 0.5, what="WAITING")
        assert f"Process {job.processes['new2'].pid} " in report, report
        job.wait_for("r0", lambda item: item["event"] == "commit", 60, "a commit")
        job.finish()
        codes = job.wait(["r0", "new2"], 60)
        assert codes == {"r0": 0, "new2": 3}, job.diagnostics()
        assert [item["reason"] for item in job.events("new2", "failed")] == ["closed"], job.diagnostics()
        assert all(item["world_size"] == 1 for item in job.events("r0", "commit"))
    finally:
        job.stop()


@pytest.mark.slow
def test_a_host_the_discovery_hook_no_longer_lists_leaves_cleanly_at_the_next_round(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("hostA:1\nhostB:1\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    placement = {"r0": {"INPROCESS_HOST": "hostA"}, "r1": {"INPROCESS_HOST": "hostB"}}
    job = JoinJob(tmp_path, 2, max_nodes=2, check_every=1, steps=10, discovery=str(script), env=placement)
    try:
        job.wait_for("r0", lambda item: item["event"] == "commit", 90, "a commit")
        hosts.write_text("hostA:1\n")
        assert job.wait(["r1"], 60) == {"r1": 0}, job.diagnostics()
        assert [item["host"] for item in job.events("r1", "removed")] == ["hostB"]
        survivor = job.wait_for("r0", lambda item: item["event"] == "synced" and item["iteration"] == 1, 30, "a round")
        assert survivor["world_size"] == 1, job.diagnostics()
        job.finish()
        assert job.wait(["r0"], 60) == {"r0": 0}, job.diagnostics()
        log = (tmp_path / "r0.stderr").read_text()
        assert "HOSTS_UPDATED: the discovery hook removed host(s) hostB; initial ranks 1 leave the job" in log
        assert "PEER_DEAD" not in log and "terminated initial ranks []" in log  # it left; nobody found it dead
        assert {item["world_size"] for item in job.events("r0", "done")} == {1}
    finally:
        job.stop()


if __name__ == "__main__":
    sys.exit(workload())
