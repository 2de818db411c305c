"""Time lost to a fault: torchras against nvidia-resiliency-ext and torchrun on torch's DDP and FSDP2, in one run.

4 gloo ranks on the CPU train a small MLP with torch's own modules (``bench/time_lost_worker.py``): ``ddp``
(``DistributedDataParallel``) and ``fsdp`` (FSDP2's ``fully_shard`` on a CPU ``DeviceMesh``), both in a full run
(``--workload`` picks one). Every restart iteration creates its process group (60 s timeout, the same for every
system), the DDP or FSDP2 module and the optimizer, restored from the state each rank keeps in memory.

Time lost = from the fault (the faulty rank's clock just before it raises, kills or stops itself, blocks in its data
loader, or runs a step without its gradient collectives) until every rank of the restarted job has completed a
training step again (the first iteration after the fault in which all its ranks, however many the system kept,
logged a step). Faults, injected by initial rank 2 after 2 s of steady training:

    exception  raise in the training function          kill   SIGKILL of the process
    stop       SIGSTOP of the process, never resumed   stall  ONE time.sleep of an hour in the data loader's call
                                                              before the forward pass (a wedged loader)
    skip       one step without its gradient collectives (DDP: under no_sync(), its bucket all-reduce is missing;
               FSDP2: set_requires_gradient_sync(False), its reduce-scatters are missing): a deadlock follows

Launch. Every system runs under plain torchrun, as its users run it: ``python -m torch.distributed.run
--nproc-per-node 4 --master-port P bench/time_lost_worker.py ...`` (torchrun's default static rendezvous; its agent
serves the store at MASTER_PORT = P, a free port below the ephemeral range with P + 1 and P + 2 free for the
Wrappers' stores; ``--max-restarts`` at its default, 0, under a Wrapper, N for the torchrun baseline). torchrun ends
every worker when one exits, so a fault after which a process exits (a kill; a rank that a Wrapper terminates at its
hard timeout) loses the job: the figure is ``null``, "job lost", with torchrun's account of it. A torchrun-launched
job whose recovery left a rank behind (a stop) trains on until ``AFTERMATH_S`` after the fault, past the 90 s hard
timeout at which that rank is terminated; if torchrun ends the job meanwhile, the figure is ``null`` too. What a
Wrapper does when the survivors are kept (as ``rasd launch``, issue 25, will) is timed in the ``spawn`` rows (kill,
stop, rank 0): the benchmark starts the 4 workers itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and the store on
MASTER_PORT that torchrun's agent would serve) and ends none of them.

Systems, every one measured in this same run (what each is exactly: bench/README.md):

    torchras          this repository's ``inprocess.Wrapper`` (store at MASTER_PORT + 1): DEFAULTS, and TUNED
                      (last_call_wait 0.1 s, every interval 0.1 s); the rasd mesh's verdicts restart it
    nvrx              nvidia-resiliency-ext 0.4.1's ``inprocess.Wrapper`` (store at MASTER_PORT + 2; a separate venv
                      this script makes, sharing this venv's torch), at its defaults and tuned the same way, stock abort
    nvrx_sockabort    the same with this repository's gloo-unblocking abort passed in
    torchrun          ``torchrun --max-restarts N``: every worker a new process per attempt
    rank 0            kill -9 of initial rank 0 (issue 10), spawn: torchras and nvrx at their defaults (DDP)
    etcd              torchras TUNED with the Wrapper's store on etcd (issue 10), where an etcd store exists (DDP)

The application's store (for ``init_process_group``) is the one at MASTER_PORT, outside every rank: torchrun's agent's,
or the benchmark's under ``spawn``. Faults that keep every rank are chained in one job (one per restart iteration); a
fault that may lose the job or leaves a rank behind ends a chain. Two lanes: crash faults are timed one job at a time
(the next job imports meanwhile and is paused with SIGSTOP while a fault is being timed); hangs and stuck
collectives, bound by fixed timers of 10 to 90 s, run afterwards, six jobs at once, since they wait rather than
compute. A system that does not recover within the cap (60 s for crashes, 130 s for hangs) gets ``null``, with the
reason in the table.

    .venv/bin/python bench/time_lost.py              # every row, both workloads, one run: about 35-50 min on 2 cores
    .venv/bin/python bench/time_lost.py --quick      # one sample of each, tuned only, short caps: a smoke check
    .venv/bin/python bench/time_lost.py --only torchras --workload ddp --fault stall   # a system, a workload, a fault

Prints a table per workload, then, as its last line, one JSON object with a key per (system, setting, launch,
workload, fault): ``{prefix}_{workload}_{fault}_s``, e.g. ``torchras_default_ddp_stall_s``,
``torchras_default_spawn_fsdp_kill_s``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import importlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from torchras_formats import ports

REPOSITORY = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("time_lost_worker.py")
OUTPUT = REPOSITORY / "bench" / "out" / "time_lost"
WORLD_SIZE = 4
WORKLOADS = ("ddp", "fsdp")
FAULTS = ("exception", "kill", "stop", "stall", "skip")
NVRX_VERSION = "0.4.1"
DEFAULT_NVRX_VENV = Path("/tmp/torchras-bench-nvrx-venv")
STARTUP_S = 600.0  # until the first fault: 8 to 48 torch imports on 2 cores that other work shares
NEXT_FAULT_S = 60.0  # from a recovery to the chain's next fault (due 2 s after the first step)
EXIT_GRACE_S = 10.0  # after the finish, for the processes to end on their own before they are killed
# A torchrun-launched job whose recovery left a rank behind trains on until this long after the fault: past the
# Wrappers' 90 s hard timeout (and 5 s termination grace) at which that rank is terminated and torchrun may end the job.
AFTERMATH_S = 110.0
PORT_OFFSETS = (1, 2)  # the Wrappers' stores beside MASTER_PORT (torchras + 1, nvidia-resiliency-ext + 2)
PARALLEL_JOBS = 6
STARTING = 2  # jobs of the parallel lane starting at once


@dataclasses.dataclass(frozen=True)
class Spec:
    """One job: a system at a setting, on a workload, launched one way, and the faults it suffers, the i-th in
    restart iteration i.

    Results are keyed ``{prefix}_{workload}_{fault}_s``. Faults that keep every rank (exception, and stall and skip
    where the system restarts every rank in place) are chained in one job, one per iteration, which spares the costly
    start of a job per sample; a fault that takes a rank away or may lose the job ends its chain.
    """

    prefix: str  # torchras_default, nvrx_tuned, nvrx_sockabort_default_spawn, torchrun, torchras_default_spawn_rank0
    system: str  # torchras | nvrx | torchrun (the worker's --system)
    setting: str  # default | tuned
    workload: str  # ddp | fsdp
    schedule: tuple[str, ...]
    cap_s: float
    launch: str = "torchrun"  # torchrun | spawn (the benchmark starts the workers and keeps the survivors)
    abort: str = "stock"
    store: str = "tcp"
    fault_rank: int = 2
    parallel: bool = False  # timeout-bound: runs beside other such jobs, after the exclusive ones

    def key(self, fault: str) -> str:
        return f"{self.prefix}_{self.workload}_{fault}_s"


@dataclasses.dataclass
class Outcome:
    samples: list[float] = dataclasses.field(default_factory=list)
    worlds: list[int] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)

    @property
    def value(self) -> float | None:
        return round(statistics.median(self.samples), 3) if self.samples else None

    @property
    def lost(self) -> bool:
        """No sample, and the job was lost (rather than not recovered within the cap)."""
        return not self.samples and any(failure.startswith("job lost") for failure in self.failures)


# ---- the plan ----------------------------------------------------------------------------------------------------


def plan(
    quick: bool,
    only: str | None,
    etcd: dict | None,
    fault_filter: str | None,
    workloads: tuple[str, ...] = WORKLOADS,
) -> list[Spec]:
    """Every job of one run. Our rows and the crash rows get 3 samples; rows bound by a 60-90 s timer, and faults
    that lose a torchrun job whatever happens, get one."""
    settings = ("tuned",) if quick else ("default", "tuned")
    repeat = 1 if quick else 3
    crash_cap, slow_cap = (30.0, 45.0) if quick else (60.0, 130.0)
    specs: list[Spec] = []

    def add(
        count: int,
        prefix: str,
        system: str,
        setting: str,
        workload: str,
        schedule: tuple[str, ...],
        *,
        cap: float | None = None,
        **extra: Any,
    ) -> None:
        if fault_filter:
            schedule = tuple(fault for fault in schedule if fault == fault_filter)
        if not schedule or (only and not any(prefix.startswith(part) for part in only.split(","))):
            return
        cap = cap or (slow_cap if extra.get("parallel") else crash_cap)
        specs.extend(Spec(prefix, system, setting, workload, schedule, cap, **extra) for _ in range(count))

    # Under torchrun a kill loses a Wrapper's job (torchrun ends the other workers): it ends the chain.
    crashes = ("exception",) * repeat + ("kill",)
    spawn: dict[str, Any] = dict(launch="spawn")
    slow: dict[str, Any] = dict(parallel=True)
    for workload in workloads:
        for setting in settings:
            ours = f"torchras_{setting}"
            add(1, ours, "torchras", setting, workload, crashes)
            add(repeat, f"{ours}_spawn", "torchras", setting, workload, ("kill",), **spawn)
            # A stuck collective (skip: a desynchronised rank; stall: a rank blocked in its data loader) waits for
            # the mesh's COMM_STUCK, a stop for its PEER_HUNG: timer-bound, so in the parallel lane. The skip comes
            # first: a stall the Wrapper cannot reach loses a torchrun job at the hard timeout. A stop under torchrun
            # leaves a rank behind, terminated at the hard timeout: one sample, with its aftermath.
            add(repeat, ours, "torchras", setting, workload, ("skip", "stall"), **slow)
            add(1, ours, "torchras", setting, workload, ("stop",), **slow)
            add(repeat, f"{ours}_spawn", "torchras", setting, workload, ("stop",), **spawn, **slow)
        for setting in settings:
            # The stock abort leaves gloo blocked until the application's 60 s process-group timeout, and hangs wait
            # for the 60/90 s soft/hard timeouts: one sample each, in the parallel lane; stall, kill and stop each in
            # a job of their own (the hard timeout or the kill loses a torchrun job).
            stock = f"nvrx_{setting}"
            add(1, stock, "nvrx", setting, workload, ("exception", "skip"), **slow)
            for fault in ("stall", "kill", "stop"):
                add(1, stock, "nvrx", setting, workload, (fault,), **slow)
            if setting == "default":
                for fault in ("kill", "stop"):
                    add(1, f"{stock}_spawn", "nvrx", setting, workload, (fault,), **spawn, **slow)
            sockets = f"nvrx_sockabort_{setting}"
            socket_abort: dict[str, Any] = dict(abort="socket")
            add(1, sockets, "nvrx", setting, workload, crashes, **socket_abort)
            add(repeat, f"{sockets}_spawn", "nvrx", setting, workload, ("kill",), **socket_abort, **spawn)
            add(1, sockets, "nvrx", setting, workload, ("skip", "stall"), **socket_abort, **slow)
            add(1, sockets, "nvrx", setting, workload, ("stop",), **socket_abort, **slow)
            add(1, f"{sockets}_spawn", "nvrx", setting, workload, ("stop",), **socket_abort, **spawn, **slow)
        torchrun_crashes = ("exception",) * repeat + ("kill",) * repeat
        add(1, "torchrun", "torchrun", "default", workload, torchrun_crashes)
        add(1, "torchrun", "torchrun", "default", workload, ("stop",), **slow)
        add(1, "torchrun", "torchrun", "default", workload, ("stall", "skip"), **slow)
    if "ddp" in workloads:
        # Issue 10: kill -9 of initial rank 0, the rank that hosts the reference's store; survivors kept (spawn).
        first = settings[0]
        rank0: dict[str, Any] = dict(fault_rank=0, launch="spawn")
        add(repeat, f"torchras_{first}_spawn_rank0", "torchras", first, "ddp", ("kill",), **rank0)
        # nvidia-resiliency-ext's store lives in initial rank 0: the survivors block on it until the cap.
        add(1, f"nvrx_{first}_spawn_rank0", "nvrx", first, "ddp", ("kill",), cap=crash_cap, **rank0, **slow)
        if etcd is not None:
            add(1, "torchras_tuned_etcd", "torchras", "tuned", "ddp", ("exception",) * repeat, store="etcd")
    return specs


def keys_of(specs: list[Spec]) -> list[str]:
    keys: list[str] = []
    for spec in specs:
        for fault in spec.schedule:
            key = spec.key(fault)
            if key not in keys:
                keys.append(key)
    return keys


# ---- one job -----------------------------------------------------------------------------------------------------


def free_port(beside: tuple[int, ...] = ()) -> int:
    """A free port below the ephemeral range (``torchras_formats.ports``: an ephemeral port can be taken meanwhile),
    with the ports ``port + offset`` for each offset in ``beside`` free too."""
    high = min(32000, ports.ephemeral_low()) - max(beside, default=0)
    while True:
        port = random.randrange(20000, high)
        if all(_bindable(port + offset) for offset in (0, *beside)):
            return port


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            pass
    return events


def recoveries(events: list[dict]) -> list[tuple[dict, tuple[float, int] | None]]:
    """For every fault: (fault, (seconds lost, ranks after)) or (fault, None) while not recovered.

    Recovered = the first iteration after the fault's in which every rank (its world size, as the system set
    it) has completed a step after the fault; the time is the last of those steps.
    """
    steps: dict[int, list[dict]] = {}
    for event in events:
        if event["event"] == "step":
            steps.setdefault(event["system_iteration"], []).append(event)
    result = []
    for fault in (event for event in events if event["event"] == "fault"):
        found = None
        for iteration in sorted(i for i in steps if i > fault["system_iteration"]):
            after = [event for event in steps[iteration] if event["time"] >= fault["time"]]
            world_size = after[0]["world_size"] if after else 0
            if after and len({event["rank"] for event in after}) == world_size:
                found = (max(event["time"] for event in after) - fault["time"], world_size)
                break
        result.append((fault, found))
    return result


def next_fault_missing(events: list[dict], fault_rank: int) -> str:
    """Why the next fault of a chain never came: usually the system terminated the rank that was to make it."""
    steps = [event for event in events if event["event"] == "step"]
    latest = max(event["system_iteration"] for event in steps)
    if fault_rank not in {event["initial_rank"] for event in steps if event["system_iteration"] == latest}:
        return f"not reached: the previous fault's restart terminated initial rank {fault_rank}, which makes it"
    return f"not reached: no fault within {NEXT_FAULT_S:.0f} s of the previous recovery"


def torchrun_account(log: str) -> str:
    """torchrun's own account of a job it ended: the root cause it prints (worker rank and exit code)."""
    cause = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", log, re.DOTALL)
    if cause is None:
        return "torchrun ended the workers"
    rank, code = int(cause.group(1)), int(cause.group(2))
    how = f"exit code {code}"
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"worker rank {rank} exited ({how}) and torchrun ended the others"


class Job:
    """The processes of one training job, tagged so that every descendant can be found, paused and ended.

    Started with a closed gate: the processes import torch and the restart system, then wait for ``open``. Launched
    by torchrun (``spec.launch == "torchrun"``), or as four processes of the benchmark's (``"spawn"``), which serves
    their store at MASTER_PORT as torchrun's agent would.
    """

    def __init__(self, spec: Spec, directory: Path, python: str, etcd: dict | None) -> None:
        self.spec = spec
        self.directory = directory
        self.events_path = directory / "events.jsonl"
        self.gate = directory / "gate"
        self.finish = directory / "finish"
        self.tag = uuid.uuid4().hex
        directory.mkdir(parents=True, exist_ok=True)
        path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
        env = dict(
            os.environ,
            PYTHONPATH=path,
            TORCH_CPP_LOG_LEVEL="ERROR",
            TIME_LOST_TAG=self.tag,
            PYTHONUNBUFFERED="1",
        )
        if spec.system != "torchras":
            env["TORCHRAS_ENABLE"] = "0"  # the baselines run without the mesh
        if etcd is not None and spec.store == "etcd":
            env.update(
                TIME_LOST_ETCD_STORE=etcd["factory"],
                TIME_LOST_ETCD_KWARGS=json.dumps(etcd["kwargs"]),
                INPROCESS_ETCD_PREFIX=f"/time_lost/{self.tag}",
            )
        arguments = [
            "--system",
            spec.system,
            "--workload",
            spec.workload,
            "--setting",
            spec.setting,
            "--abort",
            spec.abort,
            "--store",
            spec.store,
            "--schedule",
            ",".join(spec.schedule),
            "--fault-rank",
            str(spec.fault_rank),
            "--events",
            str(self.events_path),
            "--gate",
            str(self.gate),
            "--finish",
            str(self.finish),
        ]
        self.log_path = directory / "output.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed by end()
        self.store: Any = None
        # MASTER_PORT, with the Wrappers' stores beside it free too (torchrun's own choice, with --standalone, is an
        # ephemeral port, whose neighbours a busy host's outgoing connections may hold).
        port = free_port(beside=PORT_OFFSETS)
        if spec.launch == "torchrun":
            restarts = [f"--max-restarts={len(spec.schedule)}"] if spec.system == "torchrun" else []
            command = [
                python,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={WORLD_SIZE}",
                f"--master-port={port}",
                *restarts,
                str(WORKER),
                *arguments,
            ]
            self.processes = [subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)]
            return
        import torch.distributed as dist

        # What torchrun's agent serves its workers (TORCHELASTIC_USE_AGENT_STORE): a store outside every worker.
        self.store = dist.TCPStore(
            "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
        )
        env.update(WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        self.processes = []
        for rank in range(WORLD_SIZE):
            self.processes.append(
                subprocess.Popen(
                    [python, str(WORKER), *arguments],
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE)),
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                )
            )

    def open(self) -> None:
        self.gate.touch()

    def tagged(self) -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("TIME_LOST_TAG") == self.tag:
                    found.append(process)
            except psutil.Error:
                pass
        return found

    def signal(self, number: int) -> None:
        for process in self.tagged():
            try:
                process.send_signal(number)
            except psutil.Error:
                pass

    def alive(self) -> int:
        count = 0
        for process in self.tagged():
            try:
                if process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    count += 1
            except psutil.Error:
                pass
        return count

    def finished(self) -> bool:
        return all(process.poll() is not None for process in self.processes)

    def lost_reason(self, since: float | None) -> str:
        """Why the job ended on its own before it was told to: torchrun's account, or every worker gone."""
        when = f" {time.time() - since:.0f} s after the fault" if since is not None else ""
        if self.spec.launch == "torchrun":
            self.log.flush()
            account = torchrun_account(self.log_path.read_text(errors="replace"))
            return f"job lost{when} under torchrun: {account}"
        return f"job lost{when}: every process exited"

    def end(self) -> None:
        self.signal(signal.SIGKILL)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.log.close()
        self.store = None  # the spawn launch's store server, served by this process


def _signaller(job: Job | None, number: int) -> Callable[[], None]:
    """Sends ``number`` to every process of ``job`` (if any) when called: the next job pauses while one is timed."""
    return lambda: None if job is None else job.signal(number)


def aftermath_deadline(spec: Spec, found: list[tuple[dict, tuple[float, int] | None]]) -> float | None:
    """Until when (wall clock) a recovered torchrun-launched job trains on before it is told to finish, or None.

    Only a Wrapper under torchrun whose recovery left a rank behind has an aftermath: that rank is terminated at
    the Wrapper's hard timeout, and torchrun then ends every worker (a lost job) unless something keeps it.
    """
    if spec.launch != "torchrun" or spec.system == "torchrun":
        return None
    behind = [fault["time"] for fault, result in found if result is not None and result[1] < WORLD_SIZE]
    return max(behind) + AFTERMATH_S if behind else None


def watch(
    job: Job, steady: Callable[[], None], measured: Callable[[], None]
) -> list[tuple[str, float | None, int, str]]:
    """Open the gate, follow the job until every fault recovered (each within the cap) or cannot; end it.

    ``steady`` runs once the job's ranks have all stepped (the window in which faults are timed begins),
    ``measured`` once the last fault recovered or the job failed. Once every fault recovered (and a rank left
    behind under torchrun had its aftermath), the job is told to finish. Returns (fault, seconds or None, ranks
    after, reason) per fault of the schedule; a job lost after a fault's recovery voids that fault's figure.
    """
    spec = job.spec
    job.open()
    started = time.monotonic()
    reason = ""
    recovered_at: float | None = None
    finishing_at: float | None = None
    voided: set[int] = set()  # recovered faults whose aftermath lost the job
    announced = False
    try:
        while True:
            time.sleep(0.1)
            events = read_events(job.events_path)
            if not announced and len({e["initial_rank"] for e in events if e["event"] == "step"}) >= WORLD_SIZE:
                announced = True
                steady()
            found = recoveries(events)
            if sum(result is not None for _, result in found) >= len(spec.schedule):
                if recovered_at is None:
                    recovered_at = time.monotonic()
                    measured()
                if job.finished():
                    if finishing_at is None:  # it ended on its own, before it was told to: lost after recovering
                        behind = [i for i, (_, result) in enumerate(found) if result and result[1] < WORLD_SIZE]
                        voided = set(behind or [len(found) - 1])
                        reason = job.lost_reason(found[max(voided)][0]["time"])
                    break
                deadline = aftermath_deadline(spec, found)
                if finishing_at is None and (deadline is None or time.time() >= deadline):
                    job.finish.touch()
                    finishing_at = time.monotonic()
                if finishing_at is not None and time.monotonic() - finishing_at > EXIT_GRACE_S:
                    break
                continue
            if job.finished():
                reason = job.lost_reason(found[-1][0]["time"] if found else None)
                if not found:
                    reason = reason.replace("job lost", "the job ended before its fault", 1)
                break
            if not found:
                if time.monotonic() - started > STARTUP_S:
                    reason = f"no fault within {STARTUP_S:.0f} s of the start"
                    break
                continue
            fault, result = found[-1]
            if result is None and time.time() - fault["time"] > spec.cap_s:
                reason = f"not recovered within the {spec.cap_s:.0f} s cap ({job.alive()} processes left running)"
                break
            if result is not None and time.time() - (fault["time"] + result[0]) > NEXT_FAULT_S:
                reason = next_fault_missing(events, spec.fault_rank)
                break
        if recovered_at is None:
            measured()
        found = recoveries(read_events(job.events_path))
    finally:
        job.end()
    return outcomes(spec, found, reason, voided)


def outcomes(
    spec: Spec, found: list[tuple[dict, tuple[float, int] | None]], reason: str, voided: set[int]
) -> list[tuple[str, float | None, int, str]]:
    """(fault, seconds or None, ranks after, reason) per fault of the job's schedule."""
    results: list[tuple[str, float | None, int, str]] = []
    for index, kind in enumerate(spec.schedule):
        outcome = found[index][1] if index < len(found) else None
        if outcome is not None and index in voided:
            seconds, world = outcome
            results.append((kind, None, 0, f"{reason}, after it had recovered on {world} ranks in {seconds:.1f} s"))
        elif outcome is not None:
            seconds, world = outcome
            results.append((kind, seconds, world, ""))
        elif index < len(found):
            results.append((kind, None, 0, reason))
        else:
            results.append((kind, None, 0, f"not reached ({reason or 'an earlier fault of the job failed'})"))
    return results


# ---- the baselines' environments ---------------------------------------------------------------------------------


def nvrx_python(venv: Path) -> str:
    """The venv with nvidia-resiliency-ext 0.4.1 that shares this interpreter's torch; made on first use.

    ``pip install --no-deps`` keeps pip from resolving a (CUDA) torch; a ``.pth`` file appends this venv's
    site-packages, so the baseline runs on exactly the torch 2.13.0 CPU build that torchras runs on.
    """
    python = venv / "bin" / "python"
    probe = [
        str(python),
        "-c",
        f"import nvidia_resiliency_ext, importlib.metadata as m, torch; "
        f"assert m.version('nvidia-resiliency-ext') == '{NVRX_VERSION}'; print(torch.__version__)",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python)
    import torch

    print(f"making {venv} (nvidia-resiliency-ext {NVRX_VERSION}, this venv's torch)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--no-deps",
            f"nvidia-resiliency-ext=={NVRX_VERSION}",
            "pyyaml",
            "defusedxml",
        ],
        check=True,
    )
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "torchras-bench-torch.pth").write_text(str(Path(torch.__file__).resolve().parents[1]) + "\n")
    subprocess.run(probe, check=True, capture_output=True)
    return str(python)


class Etcd:
    """A one-member etcd on loopback for the Wrapper's ``inprocess.etcd_store.EtcdStore`` (issue 10).

    Data in /dev/shm, as the tests do (tests/inprocess/etcd_cluster.py), so the member's fsyncs cost nothing on
    a busy machine: the figure is the store's protocol cost per restart, not a disk's.
    """

    def __init__(self, binary: str) -> None:
        self.client_port, peer_port = free_port(), free_port()
        self.data = tempfile.mkdtemp(prefix="time-lost-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{peer_port}"
        self.log = open(os.path.join(self.data, "etcd.log"), "wb")  # noqa: SIM115 - closed by close()
        self.process = subprocess.Popen(
            [
                binary,
                "--name",
                "bench",
                "--data-dir",
                os.path.join(self.data, "member"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"bench={peer}",
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=2) as reply:
                    if b'"true"' in reply.read():
                        break
            except OSError:
                pass
            time.sleep(0.1)
        else:
            self.close()
            raise TimeoutError("etcd did not become healthy within 60 s")
        self.settings = {
            "factory": "inprocess.etcd_store.EtcdStore",
            "kwargs": {"endpoints": f"127.0.0.1:{self.client_port}"},
        }

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


def etcd_setup(wanted: bool) -> tuple[Etcd | None, str]:
    """The etcd store of issue 10 where this repository has one and etcd is installed; else (None, why not)."""
    if not wanted:
        return None, "not selected"
    try:
        for module in ("etcd3gw", "inprocess.etcd_store"):
            importlib.import_module(module)
    except ImportError as error:
        return None, f"no etcd store here ({error})"
    binary = shutil.which("etcd")
    if binary is None:
        return None, "etcd is not installed (./bootstrap installs Debian's etcd-server)"
    return Etcd(binary), ""


# ---- report --------------------------------------------------------------------------------------------------------


def format_value(outcome: Outcome | None) -> str:
    if outcome is None:
        return "-"
    if outcome.value is None:
        return "lost*" if outcome.lost else "null*"
    text = f"{outcome.value:.2f} s" if outcome.value < 100 else f"{outcome.value:.0f} s"
    return text + ("" if len(outcome.samples) > 1 else " (1)")


def special(prefix: str) -> bool:
    """The rows of issue 10 (rank 0, etcd), listed apart from the tables."""
    return "rank0" in prefix or "etcd" in prefix


def report(specs: list[Spec], results: dict[str, Outcome], elapsed: float) -> dict:
    keys = keys_of(specs)
    for workload in WORKLOADS:
        rows: list[str] = []
        for spec in specs:
            if spec.workload == workload and not special(spec.prefix) and spec.prefix not in rows:
                rows.append(spec.prefix)
        if not rows:
            continue
        print()
        print(f"{workload + ': seconds lost (median)':<32}" + "".join(f"{fault:>12}" for fault in FAULTS))
        for prefix in rows:
            cells = [format_value(results.get(f"{prefix}_{workload}_{fault}_s")) for fault in FAULTS]
            print(f"{prefix.replace('_', ' '):<32}" + "".join(f"{cell:>12}" for cell in cells))
    extra = [key for key in keys if special(key)]
    if extra:
        print()
        for key in extra:
            print(f"{key.replace('_', ' ')[:-2]:<44} {format_value(results[key]):>12}")
    print()
    print(
        "(1): one sample; lost*: the job was lost (torchrun ended it), null*: no recovery within the cap; the reason "
        "below; -: not run (kill and stop, after which a process exits or is left behind, also run with the "
        "survivors kept: the spawn rows). Targets, torchras at its defaults: stall (a rank blocked in one call) "
        "<= 25 s with no rank killed (issue 24); crash <= 1.5 s, stop <= 12 s, skip <= 25 s (issue 9)."
    )
    for key in keys:
        outcome = results[key]
        line = f"  {key}: samples {[round(sample, 3) for sample in outcome.samples]}"
        worlds = sorted(set(outcome.worlds))
        line += f", ranks after {worlds}" if worlds else ""
        if outcome.failures:
            line += f"; null: {'; '.join(sorted(set(outcome.failures)))}"
        print(line)
    print(f"elapsed {elapsed / 60:.1f} min")
    return {key: results[key].value for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one sample of each, tuned only, 30 s caps")
    parser.add_argument(
        "--only",
        help="the jobs whose key starts with this (comma-separated: any of them): "
        "torchras, nvrx (both aborts), nvrx_sockabort, torchrun, torchras_default, ...",
    )
    parser.add_argument("--fault", choices=FAULTS, help="one fault kind (debugging)")
    parser.add_argument("--workload", choices=WORKLOADS, help="one workload (default: both)")
    parser.add_argument("--nvrx-venv", type=Path, default=DEFAULT_NVRX_VENV)
    parser.add_argument("--jobs", type=int, default=PARALLEL_JOBS, help="jobs at once in the timeout-bound lane")
    args = parser.parse_args()
    started = time.monotonic()
    wanted = "torchras_tuned_etcd"
    etcd_server, etcd_missing = etcd_setup(
        args.workload in (None, "ddp")
        and args.fault in (None, "exception")
        and (not args.only or any(wanted.startswith(part) or part.startswith(wanted) for part in args.only.split(",")))
    )
    etcd = etcd_server.settings if etcd_server is not None else None
    try:
        run(args, etcd, etcd_missing, started)
    finally:
        if etcd_server is not None:
            etcd_server.close()


def run(args: argparse.Namespace, etcd: dict | None, etcd_missing: str, started: float) -> None:
    import torch

    workloads = (args.workload,) if args.workload else WORKLOADS
    specs = plan(args.quick, args.only, etcd, args.fault, workloads)
    keys = keys_of(specs)
    python_of = {"torchras": sys.executable, "torchrun": sys.executable}
    if any(spec.system == "nvrx" for spec in specs):
        python_of["nvrx"] = nvrx_python(args.nvrx_venv)
    print(
        f"time lost to a fault: {WORLD_SIZE} gloo ranks on the CPU ({', '.join(workloads)}), "
        f"torch {torch.__version__}, {os.cpu_count()} cores, nvidia-resiliency-ext {NVRX_VERSION}; "
        f"{len(specs)} jobs, {len(keys)} figures"
    )
    if etcd is None and etcd_missing != "not selected":
        print(f"the etcd-backed store's rows are left out: {etcd_missing}")
    root = OUTPUT / time.strftime("%Y%m%d-%H%M%S")
    results = {key: Outcome() for key in keys}
    lock = threading.Lock()
    numbers = iter(range(len(specs)))

    def make(spec: Spec) -> Job:
        name = f"{next(numbers):02d}-{spec.prefix}-{spec.workload}-{'-'.join(spec.schedule)}"
        return Job(spec, root / name, python_of[spec.system], etcd)

    loads: list[float] = []

    def record(job: Job, begun: float, found: list[tuple[str, float | None, int, str]]) -> None:
        with lock:
            loads.append(os.getloadavg()[0])
            for fault, seconds, world, reason in found:
                outcome = results[job.spec.key(fault)]
                if seconds is None:
                    outcome.failures.append(reason)
                else:
                    outcome.samples.append(seconds)
                    outcome.worlds.append(world)
            text = ", ".join(
                f"{fault} {seconds:.3f}" if seconds is not None else f"{fault} null ({reason})"
                for fault, seconds, _, reason in found
            )
            print(f"  {job.directory.name}: {text} [{time.monotonic() - begun:.0f} s]", file=sys.stderr, flush=True)

    # Exclusive lane: one job measured at a time; the next one imports meanwhile and is paused (SIGSTOP) while
    # a fault of this one is being timed.
    sequential = [spec for spec in specs if not spec.parallel]
    upcoming: Job | None = None
    for index, spec in enumerate(sequential):
        begun = time.monotonic()
        job = upcoming or make(spec)
        upcoming = make(sequential[index + 1]) if index + 1 < len(sequential) else None
        found = watch(job, steady=_signaller(upcoming, signal.SIGSTOP), measured=_signaller(upcoming, signal.SIGCONT))
        record(job, begun, found)

    # Timeout-bound lane: these jobs mostly wait (for 20-90 s timers), so several run at once, longest first;
    # at most STARTING of them start at a time (until their ranks step), so their imports do not starve each other.
    starting = threading.Semaphore(STARTING)

    def measure(spec: Spec) -> None:
        begun = time.monotonic()
        starting.acquire()
        released = threading.Event()

        def steady() -> None:
            if not released.is_set():
                released.set()
                starting.release()

        try:
            job = make(spec)
            found = watch(job, steady=steady, measured=lambda: None)
        finally:
            steady()
        record(job, begun, found)

    parallel = sorted((spec for spec in specs if spec.parallel), key=lambda spec: -len(spec.schedule) * spec.cap_s)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(measure, parallel))
    figures = report(specs, results, time.monotonic() - started)
    print(
        f"machine load (1-min load average at the end of each job): median {statistics.median(loads):.1f}, "
        f"range {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores"
    )
    print(f"logs: {root}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
