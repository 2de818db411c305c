"""Every fault ends (issue 38): a matrix of faults at every phase of a job, under ``rasd launch`` and plain torchrun.

The job is ``rasd demo``'s worker (``torchras.demo_worker``: 4 gloo ranks on the CPU, a small MLP under
``inprocess.Wrapper`` with its state committed to memory every 10 steps, 120 steps of 0.2 s; ``--model ddp``: torch's
``DistributedDataParallel``, ``--model fsdp``: FSDP2), run through this file (``bench/chaos.py --worker``), which
adds the fault hooks that ``--inject`` (a fault at a training step) cannot express and then runs the demo worker
unchanged. Every run is one job, launched as a user launches it:

    rasd      ``python -m torchras.cli launch --standalone --nproc-per-node 4 bench/chaos.py --worker ...``
              (its defaults: a dead worker is respawned up to 3 times and joins the running job)
    torchrun  ``python -m torch.distributed.run --nproc-per-node 4 --master-port P bench/chaos.py --worker ...``
              (its defaults: --max-restarts 0; the Wrapper restarts in place, a worker that exits ends the job)

Phases (when the fault happens; "the rank" is initial rank 1 unless said otherwise):

    startup     the worker is still importing: the harness signals it 1 s after its process appears (kill, stop,
                the launcher's SIGTERM); an exception or a stall is made as the worker's script starts
    init        as the rank calls ``init_process_group`` for the first time (the others wait inside theirs)
    first_step  at step 1 (``--inject``)
    steady      at step 25, 5 steps after a commit (``--inject``; SIGTERM: 1 s after the "step 20" line)
    commit      inside ``state.commit()`` at step 10 (as it copies the state: ``TorchState.save``; FSDP2's
                ``ShardedState``: its blob written, before the copies go to its guards)
    restart     during a restart: rank 3 raises at step 15 (``--inject``), and the fault comes as the rank calls
                ``init_process_group`` in the restart's iteration (SIGTERM: 0.3 s after rank 3's exception)
    join        during a join: rank 3 is killed at step 15 (``--inject``), ``rasd launch`` respawns it, and the
                fault is made by the replacement as it is admitted (its first ``init_process_group``); 160 steps
                (SIGTERM: 2 s after the "respawned" line)
    end         after the last step and the final barrier, as the rank destroys its process group (SIGTERM: at
                the last step's line)

Faults:

    kill       SIGKILL                      stop       SIGSTOP, never resumed
    exception  a RuntimeError, once         repeat     the same RuntimeError every time the rank gets there,
                                                       in every iteration and in its replacements
    stall      one time.sleep(3600) (a rank blocked in one call, as a wedged data loader)
    skip       one step without its gradient collective (DDP's no_sync(), FSDP2's gradient sync off)
    sigterm    SIGTERM to the launcher (what a scheduler sends)

A cell that does not apply is listed as n/a with the reason (``not_applicable``). Outcomes (``classify``):

    RECOVERED_FULL     status 0, trained to the last step at full world size
    RECOVERED_SMALLER  status 0, trained to the last step on fewer ranks
    CLEAR_FAILURE      non-zero status and a line that names the cause (the launcher's account, a traceback)
    UNCLEAR_FAILURE    non-zero status and nothing in the output's last lines that names a cause
    HANG               still running at the bound (``--hang-bound``, 180 s after the launch)
    LOOP               more than ``--loop-bound`` (10) restarts, or injections of the fault, in a row with no new
                       step trained between two of them (a restart that resumes and trains further is progress,
                       as the Wrapper's give-up rule counts it: inprocess/repeated_faults.py)
    WRONG_STATUS       status 0 but the training did not finish, or non-zero though it finished, in a cell whose
                       right end is recovery (``target`` "full"). Where a clear exit is the right end ("end": a
                       SIGTERM, the same exception every time, torchrun losing a worker), a non-zero status with
                       its cause is right however far the training got: a job stopped by SIGTERM may say so; a
                       function that raises every time it ends never completed its work; under torchrun the
                       survivors of a hung rank may finish before its hard timeout ends it, and torchrun fails
                       the job for that death (its rule; ``rasd launch`` replaces the rank and exits 0)
    NO_FAULT           status 0 and finished, but the fault's moment never came (the run does not count)

Then every process of the job still alive ``--linger`` (15 s: the store server's documented linger is 10 s) after
the launcher ended (for a HANG or LOOP: after the harness sent the launcher SIGTERM, as a user would, and waited
up to 45 s for it to end) is a leftover: found by an environment marker every process of the job inherits and by
its session, then killed. The time to an outcome is counted from the fault (the harness's signal, or the line the
faulty rank writes as it makes the fault), from the launch where no fault was seen.

    .venv/bin/python bench/chaos.py --quick                     # a few representative cells, once each
    .venv/bin/python bench/chaos.py --only rasd,ddp,steady,kill   # filters: launchers, models, phases, faults
    .venv/bin/python bench/chaos.py                             # the whole matrix, 3 runs per cell: hours

Prints a row per cell (the count of each outcome, the median time to the outcome, leftovers), the totals, and, as
its last line, one JSON object: the totals and, per cell ``{launcher}_{model}_{phase}_{fault}``, its counts.
Logs and a line per run (runs.jsonl) go to bench/out/chaos/<start time>/.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
OUTPUT = REPOSITORY / "bench" / "out" / "chaos"
WORLD = 4
FAULT_RANK = 1  # the rank that makes the fault
TRIGGER_RANK = 3  # the rank whose first fault opens a restart or a join
# Time after a fault for a replacement to import torch (5 to 15 s on 2 busy cores), be admitted and train.
STEPS, JOIN_STEPS = 120, 160
STEP_TIME = 0.2
STEADY_STEP, TRIGGER_STEP = 25, 15
STALL_S = 3600.0
STARTUP_DELAY_S = 1.0  # from the worker's process appearing to the signal: it is importing torch then
HANG_S = 180.0
LOOP_BOUND = 10
LINGER_S = 15.0
SIGTERM_WAIT_S = 45.0  # rasd launch and torchrun escalate to SIGKILL 30 s after a SIGTERM

LAUNCHERS = ("rasd", "torchrun")
MODELS = ("ddp", "fsdp")
PHASES = ("startup", "init", "first_step", "steady", "commit", "restart", "join", "end")
FAULTS = ("kill", "stop", "exception", "repeat", "stall", "skip", "sigterm")
OUTCOMES = (
    "RECOVERED_FULL",
    "RECOVERED_SMALLER",
    "CLEAR_FAILURE",
    "UNCLEAR_FAILURE",
    "HANG",
    "LOOP",
    "WRONG_STATUS",
    "NO_FAULT",
)
SHORT = {
    "RECOVERED_FULL": "full",
    "RECOVERED_SMALLER": "smaller",
    "CLEAR_FAILURE": "clear",
    "UNCLEAR_FAILURE": "unclear",
    "HANG": "HANG",
    "LOOP": "LOOP",
    "WRONG_STATUS": "WRONG",
    "NO_FAULT": "nofault",
}
#: --quick: a few representative cells.
QUICK = (
    ("rasd", "ddp", "steady", "kill"),
    ("rasd", "ddp", "startup", "kill"),
    ("rasd", "ddp", "first_step", "repeat"),
    ("rasd", "fsdp", "steady", "exception"),
    ("rasd", "ddp", "restart", "kill"),
    ("rasd", "ddp", "end", "kill"),
    ("rasd", "ddp", "steady", "sigterm"),
    ("torchrun", "ddp", "steady", "kill"),
)

# The environment the harness gives a job (every process of it inherits it).
TAG_ENV = "TORCHRAS_CHAOS_TAG"
FAULT_ENV = "TORCHRAS_CHAOS_FAULT"  # "kind:phase:rank" for a fault made in the worker (Hook)
ONCE_ENV = "TORCHRAS_CHAOS_ONCE"  # the file whose creation makes a fault that happens once happen once per job


# ---- the matrix --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cell:
    launcher: str
    model: str
    phase: str
    fault: str

    @property
    def key(self) -> str:
        return f"{self.launcher}_{self.model}_{self.phase}_{self.fault}"

    @property
    def steps(self) -> int:
        return JOIN_STEPS if self.phase == "join" else STEPS


def not_applicable(cell: Cell) -> str | None:
    """Why ``cell`` cannot be run, or None when it can."""
    if cell.phase == "join" and cell.launcher == "torchrun":
        return "torchrun respawns no worker: nobody joins"
    if cell.fault == "skip" and cell.phase not in ("first_step", "steady"):
        return "a skipped collective is a training step's gradient collective; this phase has none"
    if cell.fault == "sigterm" and cell.phase in ("init", "first_step", "commit"):
        return "the launcher's SIGTERM is timed from outside, on the output; this phase is too brief to aim at"
    return None


def matrix() -> list[Cell]:
    return [Cell(*names) for names in _product(LAUNCHERS, MODELS, PHASES, FAULTS)]


def _product(*dimensions: tuple[str, ...]) -> list[tuple[str, ...]]:
    result: list[tuple[str, ...]] = [()]
    for dimension in dimensions:
        result = [(*head, name) for head in result for name in dimension]
    return result


def selected(cells: Iterable[Cell], only: list[str]) -> list[Cell]:
    """The cells that every filter's dimension allows: names of one dimension are alternatives, dimensions meet."""
    names = {name for item in only for name in item.split(",") if name}
    unknown = names - set(LAUNCHERS + MODELS + PHASES + FAULTS)
    if unknown:
        raise ValueError(f"unknown --only name(s): {', '.join(sorted(unknown))}")
    wanted = [set(dimension) & names or set(dimension) for dimension in (LAUNCHERS, MODELS, PHASES, FAULTS)]
    return [
        cell
        for cell in cells
        if all(getattr(cell, field) in allowed for field, allowed in zip(_FIELDS, wanted, strict=True))
    ]


_FIELDS = ("launcher", "model", "phase", "fault")


def target(cell: Cell) -> str:
    """What a cell should end in: "full" where a restart or a replacement can heal it, "end" where a clear exit
    is right (the same exception every time, a SIGTERM, torchrun losing a worker, or any fault under torchrun before
    the Wrapper runs)."""
    if cell.fault in ("repeat", "sigterm"):
        return "end"
    if cell.launcher == "torchrun" and cell.phase == "startup":
        return "end"  # nothing runs the Wrapper yet, and torchrun ends every worker when one exits
    if cell.launcher == "torchrun" and cell.fault not in ("exception", "skip"):
        return "end"  # torchrun ends every worker when one exits (a kill; a hung rank the Wrapper terminates)
    return "full"


# ---- how a fault is made -----------------------------------------------------------------------------------------


def worker_arguments(cell: Cell) -> list[str]:
    """The demo worker's command line: the model, the length, and the faults ``--inject`` can express."""
    argv = ["--model", cell.model, "--steps", str(cell.steps), "--step-time", str(STEP_TIME)]
    argv += ["--print-every", "10", "--commit-every", "10"]
    inject: list[str] = []
    if cell.phase == "restart":
        inject.append(f"exception:rank={TRIGGER_RANK},step={TRIGGER_STEP}")
    if cell.phase == "join":
        inject.append(f"kill:rank={TRIGGER_RANK},step={TRIGGER_STEP}")
    if cell.phase in ("first_step", "steady") and cell.fault != "sigterm":
        step = 1 if cell.phase == "first_step" else STEADY_STEP
        if cell.fault == "repeat":  # each copy is made once: one per iteration that reaches the step
            inject += [f"exception:rank={FAULT_RANK},step={step}"] * (LOOP_BOUND + 5)
        else:
            inject.append(f"{cell.fault}:rank={FAULT_RANK},step={step},seconds={STALL_S:.0f}")
    for each in inject:
        argv += ["--inject", each]
    return argv


def in_worker(cell: Cell) -> bool:
    """The fault is made by this file's hook in the worker (``Hook``), not by ``--inject`` or the harness."""
    if cell.fault in ("skip", "sigterm") or cell.phase in ("first_step", "steady"):
        return False
    return not (cell.phase == "startup" and cell.fault in ("kill", "stop"))


def external(cell: Cell) -> str | None:
    """What the harness waits for before it signals, for a fault it makes from outside: "worker" (the faulty rank's
    process appeared), or a regular expression of an output line; None when the fault is made inside."""
    if cell.phase == "startup" and cell.fault in ("kill", "stop", "sigterm"):
        return "worker"
    if cell.fault != "sigterm":
        return None
    return {
        "steady": r"step\s+20\s+world",
        "restart": rf"rank {TRIGGER_RANK}: injecting exception",
        "join": r"respawned: pid",
        "end": rf"step\s+{cell.steps}\s+world",
    }[cell.phase]


EXTERNAL_DELAY_S = {"startup": STARTUP_DELAY_S, "steady": 1.0, "restart": 0.3, "join": 2.0, "end": 0.0}


class Hook:
    """The fault made inside the worker, at its phase (``TORCHRAS_CHAOS_FAULT``, ``TORCHRAS_CHAOS_ONCE``).

    Installed before the demo worker runs: the start-up fault at once, the others by wrapping the call the phase is
    made of (``torch.distributed.init_process_group``, ``TorchState.save`` or ``ShardedState``'s exchange with
    its guards inside ``commit()``,
    ``torch.distributed.destroy_process_group`` at the end). A fault other than ``repeat`` happens once per job
    (the first process to create the once file makes it)."""

    def __init__(self, kind: str, phase: str, rank: int, once: str | None, environ: dict[str, str]) -> None:
        self.kind, self.phase, self.rank, self.once = kind, phase, rank, once
        self.newcomer = environ.get("INPROCESS_JOIN", "").strip() == "1"
        self.slot = int(environ.get("RANK", "-1"))
        self.inits = 0

    @classmethod
    def from_environment(cls) -> Hook | None:
        spec = os.environ.get(FAULT_ENV, "")
        if not spec:
            return None
        kind, phase, rank = spec.split(":")
        return cls(kind, phase, int(rank), os.environ.get(ONCE_ENV), dict(os.environ))

    def mine(self) -> bool:
        """This process makes the fault: the replacement during a join, else the process in the rank's slot."""
        return self.newcomer if self.phase == "join" else self.slot == self.rank

    def install(self) -> None:
        if not self.mine():
            return
        if self.phase == "startup":
            self.fire()
            return
        if self.phase == "commit":
            from inprocess.elastic import TorchState, sharded

            save = TorchState.save

            def saving(state: Any) -> None:
                self.fire()
                save(state)

            TorchState.save = saving  # type: ignore[method-assign,assignment]
            # FSDP2's ShardedState: between writing this rank's blob and sending the copies to its guards.
            guard = sharded._guard

            def guarding(*args: Any, **kwargs: Any) -> Any:
                if called_from("commit"):  # not the guards that sync() sets up after a restore
                    self.fire()
                return guard(*args, **kwargs)

            sharded._guard = guarding
            return
        if self.phase == "end":

            def destroying(destroy: Callable[..., Any]) -> Callable[..., Any]:
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    if called_from("train_in_wrapper"):  # the job's own, after its final barrier
                        self.fire()
                    return destroy(*args, **kwargs)

                return wrapper

            _wrap_c10d("destroy_process_group", destroying)
            return

        def initializing(init: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                self.inits += 1
                if self.due():
                    self.fire()
                return init(*args, **kwargs)

            return wrapper

        _wrap_c10d("init_process_group", initializing)

    def due(self) -> bool:
        """At this call of init_process_group: the first (init; a join's replacement), or one of a restart."""
        if self.phase == "restart":
            return self.inits >= 2
        return self.inits == 1 or self.kind == "repeat"

    def fire(self) -> None:
        if self.kind != "repeat" and self.once:
            try:
                os.close(os.open(self.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        line = f"chaos: rank {self.slot} (pid {os.getpid()}): injecting {self.kind} at {self.phase}\n"
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line.encode())
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.kind == "stall":
            time.sleep(STALL_S)
        else:  # exception, repeat: the same message, raised at the same line, every time
            raise RuntimeError(f"chaos: injected {self.kind} at {self.phase}")


def _wrap_c10d(name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace torch.distributed's ``name`` by ``wrap(it)``, where the rasd hooks (``rasd.install()``, later) find
    it: in ``distributed_c10d``, and under ``torch.distributed``."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    wrapped = wrap(getattr(distributed_c10d, name))
    setattr(distributed_c10d, name, wrapped)
    setattr(dist, name, wrapped)


def called_from(function: str, depth: int = 6) -> bool:
    """A function of that name is among the ``depth`` callers of the caller (the rasd hooks may sit between)."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def worker(argv: list[str]) -> int:
    """``bench/chaos.py --worker ARGS``: the demo worker with this run's fault hook."""
    hook = Hook.from_environment()
    if hook is not None:
        hook.install()
    from torchras.demo_worker import worker_main

    return worker_main(argv)


# ---- the outcome -------------------------------------------------------------------------------------------------

RESTART = re.compile(r"restart (\d+) after ")
#: Rank 0's progress line for the world: the world size that trained the step.
PROGRESS = re.compile(r"step\s+(?P<step>\d+)\s+world \((?P<world>\d+) ranks")
FAULT_LINE = re.compile(rf"rank {FAULT_RANK}: injecting |chaos: rank -?\d+ \(pid \d+\): injecting ")
RESPAWN = re.compile(r"respawning it \(")
#: A line that names why a job failed: the launcher's account, torchrun's, a traceback's last line.
CAUSE = re.compile(
    r"the job (failed|gave up)|stopped by SIG|killed by SIG|Root Cause|ChildFailedError|SignalException"
    r"|exitcode\s*:|^\s*\w+(Error|Exception|Abort|Failed)\b.*:|Traceback \(most recent call last\)|gave up"
    r"|rasd demo: \w+"
)
LOG_TIME = re.compile(r"^\s*\d+\.\d+ ")  # output.log's seconds since the launch, before each line
CAUSE_TAIL = 40  # lines at the end of the output searched for a cause


@dataclasses.dataclass
class Observed:
    """What one run showed: the facts ``classify`` decides on."""

    status: int | None  # the launcher's exit status; None: still running at the bound (or ended by the harness)
    last_step: int | None  # the last step of a world progress line
    last_world: int | None  # its world size
    restarts: int  # the highest restart number seen, or the number of injections of the fault if higher
    fault_seen: bool
    cause: str | None  # the line that names the cause of a failure, if one does
    exit_is_right: bool = False  # the cell's right end is a clear exit (``target`` "end"), not recovery
    looped: bool = False  # the harness ended the run at the loop bound
    stalled: int = 0  # the most restarts (or injections) in a row with no new step between them (``stalled_restarts``)


def observe_lines(lines: list[str], steps: int) -> tuple[int | None, int | None, int, int, str | None]:
    """(highest step, the world size that trained it, highest restart number, injections of the fault, the cause
    line) of an output."""
    last_step = last_world = None
    highest = injections = 0
    for line in lines:
        found = PROGRESS.search(line)
        # The world that trained the highest step (a restart replays steps from a commit; one after the last step,
        # in the shutdown, trains nothing and does not change it).
        if found and (last_step is None or int(found.group("step")) >= last_step):
            last_step, last_world = int(found.group("step")), int(found.group("world"))
        restart = RESTART.search(line)
        if restart:
            highest = max(highest, int(restart.group(1)))
        if FAULT_LINE.search(line):
            injections += 1
    return last_step, last_world, highest, injections, failure_cause(lines)


def stalled_restarts(lines: list[str]) -> int:
    """The most restarts, or injections of the fault (whichever gives more), in a row with no new highest step
    trained between two of them: a loop, as opposed to a fault that costs each iteration its end but lets the job
    train on."""
    best = 0
    for marks in (RESTART, FAULT_LINE):
        run, highest, at_last = 0, -1, -2
        for line in lines:
            found = PROGRESS.search(line)
            if found:
                highest = max(highest, int(found.group("step")))
            if marks.search(line):
                run = run + 1 if highest <= at_last else 1
                at_last = highest
                best = max(best, run)
    return best


def failure_cause(lines: list[str]) -> str | None:
    """The last line among the output's last ``CAUSE_TAIL`` that names a cause, stripped; None if none does."""
    for line in reversed(lines[-CAUSE_TAIL:]):
        if CAUSE.search(line):
            return line.strip()[:300]
    return None


def classify(seen: Observed, steps: int, world: int = WORLD, loop_bound: int = LOOP_BOUND) -> str:
    """One run's outcome (the module's docstring lists them)."""
    if seen.looped or seen.stalled > loop_bound:
        return "LOOP"
    if seen.status is None:
        return "HANG"
    finished = seen.last_step is not None and seen.last_step >= steps
    if seen.status == 0:
        if not finished:
            return "WRONG_STATUS"
        if not seen.fault_seen:
            return "NO_FAULT"
        return "RECOVERED_FULL" if seen.last_world == world else "RECOVERED_SMALLER"
    if finished and not seen.exit_is_right:
        return "WRONG_STATUS"
    return "CLEAR_FAILURE" if seen.cause else "UNCLEAR_FAILURE"


# ---- one run -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    cell: str
    index: int
    outcome: str
    seconds: float  # to the outcome, from the fault (from the launch if no fault was seen)
    since_launch: float
    status: int | None
    last_step: int | None
    last_world: int | None
    restarts: int
    respawns: int
    leftovers: list[str]
    cause: str | None
    note: str = ""


class Job:
    """One launched job: its output, line by line with the time each arrived, and its processes, found by the
    environment marker every one of them inherits and by the launcher's session."""

    def __init__(self, cell: Cell, folder: Path) -> None:
        self.cell = cell
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.tag = uuid.uuid4().hex
        env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
        env[TAG_ENV] = self.tag
        env[ONCE_ENV] = str(folder / "fault-made")
        env["INPROCESS_STORE_SERVER_LOG"] = str(folder / "store_server.log")  # its clients, as their count changes
        if in_worker(cell):
            env[FAULT_ENV] = f"{cell.fault}:{cell.phase}:{FAULT_RANK}"
        script = [str(Path(__file__).resolve()), "--worker", *worker_arguments(cell)]
        if cell.launcher == "rasd":
            command = [sys.executable, "-m", "torchras.cli", "launch", "--standalone", f"--nproc-per-node={WORLD}"]
        else:
            from time_lost import free_port  # bench/time_lost.py: a port below the ephemeral range, +1 free too

            port = free_port(beside=(1,))  # the demo's Wrapper serves its store at MASTER_PORT + 1
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}"]
            command.append(f"--master-port={port}")
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.log = open(folder / "output.log", "w")  # noqa: SIM115 - closed by close()
        (folder / "command.txt").write_text(" ".join([*command, *script]) + "\n")  # with the ports it was given
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [*command, *script],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            with self.lock:
                now = time.monotonic()
                self.lines.append((now, line))
                self.log.write(f"{now - self.started:7.2f} {line}\n")  # seconds since the launch
                self.log.flush()

    def output(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.lines)

    def first(self, pattern: re.Pattern[str]) -> float | None:
        return next((at for at, line in self.output() if pattern.search(line)), None)

    def processes(self) -> list[Any]:
        """Every live process of the job, the launcher included while it runs."""
        import psutil

        found = []
        for process in psutil.process_iter():
            try:
                if process.pid == os.getpid():
                    continue
                ours = os.getsid(process.pid) == self.process.pid
                if not ours:
                    ours = process.environ().get(TAG_ENV) == self.tag
                if ours and process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    found.append(process)
            except (psutil.Error, OSError):
                pass
        return found

    def worker_pid(self, slot: int) -> int | None:
        """The worker process of ``slot`` (not the monitor or store processes it started)."""
        import psutil

        for process in self.processes():
            try:
                if process.environ().get("RANK") != str(slot) or "--worker" not in process.cmdline():
                    continue
                parent = process.parent()  # the launcher (whose command line has --worker too), not a worker
                if parent is None or "RANK" not in parent.environ():
                    return process.pid
            except psutil.Error:
                pass
        return None

    def leftovers(self, linger: float) -> list[str]:
        """The processes still alive ``linger`` seconds from now (sooner when none is), described; then killed."""
        import psutil

        started = time.monotonic()
        deadline = started + linger
        clients: dict[int, str] = {}  # a store server's pid: its last clients seen, and when
        while True:
            alive = self.processes()
            if not alive or time.monotonic() >= deadline:
                break
            for process in alive:
                seen = store_clients(process)
                if seen:
                    clients[process.pid] = f"{seen} ({time.monotonic() - started:.1f} s after the job ended)"
            time.sleep(0.5)
        described = []
        for process in alive:
            try:
                cmdline = " ".join(process.cmdline())
                line = f"pid {process.pid} ({process.status()}): {describe_process(cmdline)}"
                if process.pid in clients:
                    line += f"; its last clients: {clients[process.pid]}"
                described.append(line)
                process.kill()
            except psutil.Error:
                pass
        return described

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
        self.reader.join(10)
        self.log.close()


def store_clients(process: Any) -> str:
    """Who is connected to ``process`` if it is the Wrapper's store server (empty if nobody, or if it is not one):
    the processes at the other end of its established connections, so that a server that outlives its job names
    what kept it (it ends a linger after its last client leaves)."""
    import psutil

    try:
        if "store_server" not in " ".join(process.cmdline()):
            return ""
        ports = {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        peers = set()
        for connection in psutil.net_connections("tcp"):
            if connection.status != psutil.CONN_ESTABLISHED or not connection.raddr or connection.pid is None:
                continue
            if connection.raddr.port in ports and connection.pid != process.pid:
                peers.add(connection.pid)
        named = []
        for pid in sorted(peers):
            try:
                named.append(f"pid {pid}: {describe_process(' '.join(psutil.Process(pid).cmdline()))[:120]}")
            except psutil.Error:
                named.append(f"pid {pid} (gone)")
        return "; ".join(named)
    except (psutil.Error, OSError):
        return ""


def describe_process(cmdline: str) -> str:
    """What a leftover process is, from its command line."""
    for needle, name in (
        ("store_server", "the Wrapper's store server"),
        ("monitor_process", "a Wrapper monitor process"),
        ("--worker", "a worker"),
        ("torchras.cli launch", "rasd launch"),
        ("torch.distributed.run", "torchrun"),
    ):
        if needle in cmdline:
            return f"{name}: {cmdline[:160]}"
    return cmdline[:200]


def run_once(cell: Cell, index: int, folder: Path, hang_s: float, loop_bound: int, linger: float) -> Run:
    job = Job(cell, folder)
    trigger = external(cell)
    pattern = re.compile(trigger) if trigger and trigger != "worker" else None
    fault_at: float | None = None
    seen_at: float | None = None  # when the moment the harness waits for came
    looped = False
    note = ""
    try:
        while True:
            time.sleep(0.2)
            now = time.monotonic()
            if trigger is not None and fault_at is None:
                if seen_at is None:
                    if trigger == "worker":
                        seen_at = now if job.worker_pid(FAULT_RANK) is not None else None
                    else:
                        assert pattern is not None
                        seen_at = job.first(pattern)
                if seen_at is not None and now >= seen_at + EXTERNAL_DELAY_S[cell.phase]:
                    fault_at, note = signal_fault(job, cell)
            lines = [line for _, line in job.output()]
            if stalled_restarts(lines) > loop_bound:
                looped = True
                break
            if job.process.poll() is not None or now - job.started > hang_s:
                break
        ended = time.monotonic()
        status = job.process.poll()
        if status is None:  # a hang or a loop: stopped as a user would stop it, SIGTERM to the launcher
            job.process.send_signal(signal.SIGTERM)
            try:
                job.process.wait(SIGTERM_WAIT_S)
            except subprocess.TimeoutExpired:
                note = (note + "; " if note else "") + f"the launcher outlived a SIGTERM by {SIGTERM_WAIT_S:.0f} s"
        job.reader.join(5)
        leftovers = job.leftovers(linger)
    finally:
        job.close()
    output = job.output()
    lines = [line for _, line in output]
    last_step, last_world, highest, injections, cause = observe_lines(lines, cell.steps)
    if fault_at is None:
        fault_at = next((at for at, line in output if FAULT_LINE.search(line)), None)
    seen = Observed(
        status=status,
        last_step=last_step,
        last_world=last_world,
        restarts=max(highest, injections),
        fault_seen=fault_at is not None,
        cause=cause if status is not None else None,
        exit_is_right=target(cell) == "end",
        looped=looped,
        stalled=stalled_restarts(lines),
    )
    outcome = classify(seen, cell.steps, loop_bound=loop_bound)
    return Run(
        cell=cell.key,
        index=index,
        outcome=outcome,
        seconds=round(ended - (fault_at if fault_at is not None else job.started), 2),
        since_launch=round(ended - job.started, 2),
        status=status,
        last_step=last_step,
        last_world=last_world,
        restarts=seen.restarts,
        respawns=sum(1 for line in lines if RESPAWN.search(line)),
        leftovers=leftovers,
        cause=cause if status not in (None, 0) else None,  # a hung run's last lines are those of its stopping
        note=note,
    )


def signal_fault(job: Job, cell: Cell) -> tuple[float | None, str]:
    """Make a fault from outside: SIGTERM to the launcher, or SIGKILL / SIGSTOP to the faulty rank's worker."""
    if cell.fault == "sigterm":
        job.process.send_signal(signal.SIGTERM)
        return time.monotonic(), ""
    pid = job.worker_pid(FAULT_RANK)
    if pid is None:
        return time.monotonic(), f"rank {FAULT_RANK}'s worker was gone before its {cell.fault}"
    os.kill(pid, signal.SIGKILL if cell.fault == "kill" else signal.SIGSTOP)
    return time.monotonic(), ""


# ---- the report --------------------------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def report(cells: list[Cell], runs: dict[str, list[Run]], elapsed: float) -> dict[str, Any]:
    columns = [SHORT[outcome] for outcome in OUTCOMES]
    print(f"\n{'cell':<34} {'target':<6} " + " ".join(f"{name:>7}" for name in columns) + "  median s  leftovers")
    totals = dict.fromkeys(OUTCOMES, 0)
    per_cell: dict[str, Any] = {}
    leftover_runs = leftover_processes = missed = 0
    not_run = 0
    for cell in cells:
        reason = not_applicable(cell)
        name = f"{cell.launcher} {cell.model} {cell.phase} {cell.fault}"
        if reason is not None:
            not_run += 1
            print(f"{name:<34} n/a    {reason}")
            per_cell[cell.key] = {"n/a": reason}
            continue
        done = runs.get(cell.key, [])
        counts = {outcome: sum(run.outcome == outcome for run in done) for outcome in OUTCOMES}
        for outcome, count in counts.items():
            totals[outcome] += count
        left = sum(len(run.leftovers) for run in done)
        leftover_runs += sum(1 for run in done if run.leftovers)
        leftover_processes += left
        times = median([run.seconds for run in done])
        goal = target(cell)
        if goal == "full" and done and counts["RECOVERED_FULL"] < len(done):
            missed += 1
        cells_text = " ".join(f"{counts[outcome] or '.':>7}" for outcome in OUTCOMES)
        time_text = f"{times:8.1f}" if times is not None else f"{'-':>8}"
        print(f"{name:<34} {goal:<6} {cells_text}  {time_text}  {left or '.':>9}")
        per_cell[cell.key] = {**{k: v for k, v in counts.items() if v}, "median_s": times, "leftovers": left}
    ran = sum(len(done) for done in runs.values())
    bad = {
        "hang": totals["HANG"],
        "loop": totals["LOOP"],
        "wrong_status": totals["WRONG_STATUS"],
        "unclear_failure": totals["UNCLEAR_FAILURE"],
        "leftover_runs": leftover_runs,
        "leftover_processes": leftover_processes,
    }
    print(
        f"\n{ran} runs of {len(cells) - not_run} cells ({not_run} n/a) in {elapsed / 60:.1f} min: "
        + ", ".join(f"{name} {value}" for name, value in bad.items())
        + f"; cells that can recover but did not every time: {missed}"
    )
    print("outcomes: " + ", ".join(f"{outcome} {count}" for outcome, count in totals.items()))
    return {
        "runs": ran,
        "cells_run": len(cells) - not_run,
        "cells_na": not_run,
        **bad,
        "cells_not_recovered": missed,
        "outcomes": totals,
        "minutes": round(elapsed / 60, 1),
        "cells": per_cell,
    }


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run each of a few representative cells")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="names of launchers, models, phases, faults (comma-separated, repeatable): rasd,ddp,steady,kill",
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs per cell (default 3; --quick: 1)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--hang-bound", type=float, default=HANG_S, help="seconds from the launch to HANG")
    parser.add_argument("--loop-bound", type=int, default=LOOP_BOUND, help="restarts past which a run is a LOOP")
    parser.add_argument("--linger", type=float, default=LINGER_S, help="seconds a process may outlive its job")
    parser.add_argument(
        "--report",
        nargs="+",
        type=Path,
        metavar="FOLDER",
        help="run nothing: the table of earlier runs (their runs.jsonl); a cell run in a later folder replaces its "
        "runs of the earlier ones (a rerun on newer code)",
    )
    parser.add_argument(
        "--combine",
        action="store_true",
        help="with --report: every folder's runs of a cell together (passes of the matrix, each once per cell)",
    )
    args = parser.parse_args()
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    cells = matrix()
    if args.quick:
        cells = [cell for cell in cells if (cell.launcher, cell.model, cell.phase, cell.fault) in QUICK]
    try:
        cells = selected(cells, args.only)
    except ValueError as error:
        parser.error(str(error))
    if args.report:
        print(json.dumps(report(cells, earlier_runs(args.report, args.combine), 0.0)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    started_at = datetime.datetime.now(datetime.timezone.utc)
    folder = OUTPUT / started_at.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    plan = [(cell, index) for index in range(repeats) for cell in cells if not_applicable(cell) is None]
    print(
        f"{len(plan)} runs of {len({cell for cell, _ in plan})} cells, {args.jobs} at a time; hang bound "
        f"{args.hang_bound:.0f} s, loop bound {args.loop_bound}; logs in {folder}",
        file=sys.stderr,
        flush=True,
    )
    runs: dict[str, list[Run]] = {}
    started = time.monotonic()
    lock = threading.Lock()

    def one(cell: Cell, index: int) -> Run:
        result = run_once(cell, index, folder / f"{cell.key}-{index}", args.hang_bound, args.loop_bound, args.linger)
        with lock:
            runs.setdefault(cell.key, []).append(result)
            with open(folder / "runs.jsonl", "a") as file:
                file.write(json.dumps(dataclasses.asdict(result)) + "\n")
            print(
                f"  {cell.key} #{index + 1}: {result.outcome} in {result.seconds:.1f} s (status {result.status}, "
                f"last step {result.last_step} at {result.last_world}, restarts {result.restarts}, "
                f"leftovers {len(result.leftovers)}){' ' + result.note if result.note else ''}",
                file=sys.stderr,
                flush=True,
            )
        return result

    run_all(plan, one, args.jobs)
    figures = report(cells, runs, time.monotonic() - started)
    figures["started"] = started_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    print(json.dumps(figures))


def earlier_runs(folders: list[Path], combine: bool = False) -> dict[str, list[Run]]:
    """The runs recorded in each folder's runs.jsonl, by cell, each classified again by today's rules from its
    recorded facts and its output (``reclassified``); a cell's runs in a later folder replace its runs in the
    earlier ones, or with ``combine`` join them (passes of the matrix)."""
    cells = {cell.key: cell for cell in matrix()}
    runs: dict[str, list[Run]] = {}
    for folder in folders:
        found: dict[str, list[Run]] = {}
        path = folder / "runs.jsonl"
        for line in path.read_text().splitlines() if path.exists() else []:
            run = Run(**json.loads(line))
            if run.cell in cells:
                run = reclassified(run, cells[run.cell], folder / f"{run.cell}-{run.index}" / "output.log")
            found.setdefault(run.cell, []).append(run)
        for cell, cell_runs in found.items():
            runs[cell] = runs.get(cell, []) + cell_runs if combine else cell_runs
    return runs


def reclassified(run: Run, cell: Cell, output: Path) -> Run:
    """A recorded run's outcome by today's ``classify``, from its recorded facts and its output's lines. A run the
    harness itself cut short (no status: a HANG or a LOOP of its day) keeps its outcome: what it would have done
    next is not in its record."""
    if run.status is None or not output.exists():
        return run
    lines = [LOG_TIME.sub("", line) for line in output.read_text(errors="replace").splitlines()]
    seen = Observed(
        status=run.status,
        last_step=run.last_step,
        last_world=run.last_world,
        restarts=run.restarts,
        fault_seen=run.outcome != "NO_FAULT",
        cause=run.cause,
        exit_is_right=target(cell) == "end",
        stalled=stalled_restarts(lines),
    )
    return dataclasses.replace(run, outcome=classify(seen, cell.steps))


def run_all(plan: list[tuple[Cell, int]], one: Callable[[Cell, int], Run], jobs: int) -> None:
    if jobs <= 1:
        for cell, index in plan:
            one(cell, index)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(one, cell, index) for cell, index in plan]:
            future.result()


if __name__ == "__main__":
    main()
