"""No verdict on healthy slow phases, and the time to a verdict on an idle wedge (issue 39).

4 gloo ranks on the CPU train torch's own DDP or FSDP2 (``fully_shard`` on a CPU device mesh) under plain
``torchrun --nproc-per-node 4``, written as a user's ordinary script (``bench/false_verdicts_worker.py``: the model,
data loader and in-memory commit of ``bench/time_lost_worker.py``; ``inprocess.Wrapper`` at its defaults;
``call_wrapper.ping()`` every step). Each system runs the same script: torchras (this repository's Wrapper, the rasd
mesh's verdicts restart it) and nvidia-resiliency-ext 0.4.1's Wrapper (its own venv, made by
``bench/time_lost.py``'s ``nvrx_python``; the mesh off), both at their defaults.

1. Soak (``--minutes``, default 30, per model): healthy slow phases on a schedule this script writes (the same for
   every system, from one seed): a long first step on rank 0 (45 s of computation), checkpoints of 30 to 120 s on
   rank 0 (``torch.save`` + ``fsync`` to local disk, again and again) while the others wait in ``dist.barrier()``,
   evaluations of 20 to 60 s on rank 0 (forward passes) while the others wait in ``dist.barrier()``, windows of
   variable step times (every rank, up to 3 s per step), GC pauses (``gc.collect()`` of millions of objects on one
   rank), and a CPU-starved host (``4 x cores`` busy-looping processes for 3 minutes). No fault is injected, so every
   ``PEER_DEAD``, ``PEER_HUNG`` and ``COMM_STUCK`` is false, and so is every restart and every lost job (torchrun
   ends a job when a worker exits; this script launches it again, with the phases not yet entered). ``COMM_SLOW``
   (informational, where rasd has it) and ``PEER_UNRESPONSIVE`` are counted, not held against anyone.
2. Wedges (``--wedges``, default 10 per model): the same jobs, and at a random moment (3 to 10 s after the job is
   training again) one random rank blocks idle in ONE ``time.sleep(120)`` in its data loader's place, before its
   forward pass. Timed from the wedge (the worker's ``time.time()`` just before the sleep; one machine, one clock):
   the verdict (the first ``PEER_DEAD``/``PEER_HUNG``/``COMM_STUCK``, journal or MONITOR, whichever came first),
   the restart (the wrapped function called again on a rank), training again (every rank of the new iteration
   stepped, ``time_lost.recoveries``), or the job lost. torchras's wedges are chained in one job (each restart
   ends one); nvidia-resiliency-ext's each get a job (its hard timeout, 90 s, ends the wedged rank, and torchrun
   the job), two at a time, beside torchras's chain.

How verdicts are counted: every torchras job runs with ``TORCHRAS_JOURNAL_DIR`` (each process journals every verdict
it sees, with microsecond times) and its own client port (``TORCHRAS_ADDR``), where a MONITOR client (``MONITOR
all``, JSON) records every event with its arrival time. A verdict journaled by several processes is one verdict
(same kind and subject, or same communicator, within 30 s); each kind's count is the larger of the journal's and
the MONITOR's. Restarts are counted from the worker's own events (one per new iteration of the wrapped function,
with the cause torchras's Wrapper gives); for nvidia-resiliency-ext the interruptions its log names are listed.

Systems run concurrently by default (the same schedule, one clock, the same CPU starvation; ``--serial``: one after
another, each on its own clock). Logs, events, journals and MONITOR records: ``bench/out/false_verdicts/<date>/``.

    .venv/bin/python bench/false_verdicts.py                      # both models, 30 min soak each, 10 wedges each
    .venv/bin/python bench/false_verdicts.py --quick              # smoke: 2 min soak, 2 wedges, DDP only
    .venv/bin/python bench/false_verdicts.py --minutes 60 --model fsdp --only torchras

Prints a table, then, last, one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import time_lost
from time_lost import DEFAULT_NVRX_VENV, NVRX_VERSION, PORT_OFFSETS, WORLD_SIZE, free_port, nvrx_python, read_events

REPOSITORY = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().with_name("false_verdicts_worker.py")
OUTPUT = REPOSITORY / "bench" / "out" / "false_verdicts"
MODELS = ("ddp", "fsdp")
SYSTEMS = ("torchras", "nvrx")
VERDICTS = ("PEER_DEAD", "PEER_HUNG", "COMM_STUCK")  # the verdicts that restart training: each one here is false
NOTICES = ("COMM_SLOW", "PEER_UNRESPONSIVE")  # informational: counted, not held against anyone
SAME_VERDICT_S = 30.0  # journal records of one kind and subject this close are one verdict seen by several processes
READY_S = 900.0  # until every rank of every job has imported torch (8 to 16 imports on 2 shared cores)
FINISH_S = 180.0  # from the finish flag to the job's end (a phase in progress ends first), then it is killed
WEDGE_START_S = (3.0, 10.0)  # a wedge comes this long (uniform) after the job trains on every rank again
WEDGE_ARRIVE_S = 30.0  # for the wedged rank to reach its next step and log the wedge
WEDGE_CAP_S = 150.0  # after the wedge: past the sleep (120 s) and nvidia-resiliency-ext's hard timeout (90 s)
NVRX_WEDGE_JOBS = 2  # nvidia-resiliency-ext's wedge jobs at once (each waits for its 60/90 s timers)
STARVE_FACTOR = 4  # busy-looping processes per core in the CPU-starved window
GOAL_P50_S, GOAL_P90_S = 6.0, 10.0


# ---- the schedule --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Phase:
    """One healthy slow phase: at ``at`` seconds from the soak's start (the first step after it), on ``rank``."""

    index: int
    kind: str  # first_step | checkpoint | eval | jitter | gc (bench/false_verdicts_worker.py)
    at: float
    duration: float  # seconds of work (gc: 0, its pause is what its objects take)
    rank: int = 0
    objects: int = 0  # gc: the objects collected


CHECKPOINT_S = (30, 45, 60, 90, 120)
GC_OBJECTS = (4_000_000, 7_000_000, 10_000_000)  # 0.4 to 1 GB of lists; a collection of about 0.5 to 1.3 s, quiet
GC_PHASE_S = 20.0  # a gc phase's length in the plan: building the objects, then the collection
JITTER_S = 90.0
GAP_S = (30.0, 60.0)  # plain training between two phases
STARVE_S = 180.0


def soak_plan(minutes: float, seed: int, quick: bool) -> tuple[list[Phase], list[tuple[float, float]]]:
    """The phases of a soak and its CPU-starved windows (start, seconds), all ending 30 s before its end.

    The full plan: a 45 s first step, then checkpoint, jitter, evaluation and gc in turn with 30-60 s of plain
    training between them; checkpoints take 30, 45, 60, 90 and 120 s in a shuffled order (every length within the
    first five); the host is starved for 3 minutes from 40 % of the soak. ``quick``: one of each, in 2 minutes.
    """
    if quick:
        phases = [
            Phase(0, "first_step", 0.0, 25.0),
            Phase(1, "checkpoint", 35.0, 35.0),
            Phase(2, "eval", 78.0, 20.0),
            Phase(3, "gc", 100.0, 0.0, rank=2, objects=GC_OBJECTS[0]),
            Phase(4, "jitter", 104.0, 10.0),
        ]
        return phases, [(40.0, 30.0)]
    rng = random.Random(seed)
    total = minutes * 60.0
    phases = [Phase(0, "first_step", 0.0, 45.0)]
    checkpoints: list[int] = []
    at = 45.0 + rng.uniform(*GAP_S)
    cycle = ("checkpoint", "jitter", "eval", "gc")
    for turn in range(10_000):
        kind = cycle[turn % len(cycle)]
        rank, objects = 0, 0
        if kind == "checkpoint":
            if not checkpoints:
                checkpoints = rng.sample(CHECKPOINT_S, len(CHECKPOINT_S))
            duration = float(checkpoints.pop())
        elif kind == "jitter":
            duration = JITTER_S
        elif kind == "eval":
            duration = float(round(rng.uniform(20.0, 60.0)))
        else:
            duration, rank, objects = 0.0, rng.randrange(WORLD_SIZE), rng.choice(GC_OBJECTS)
        length = duration or GC_PHASE_S
        if at + length > total - 30.0:
            break
        phases.append(Phase(len(phases), kind, round(at, 1), duration, rank, objects))
        at += length + rng.uniform(*GAP_S)
    starve = min(STARVE_S, total / 4)
    return phases, [(round(total * 0.4, 1), starve)]


# ---- reading what happened -----------------------------------------------------------------------------------------


class MonitorStream:
    """Splits a MONITOR connection's bytes (``SET FORMAT json``) into events: each a pretty-printed JSON object;
    the ``OK`` lines that answer the commands (and any other line outside an object) are skipped."""

    def __init__(self) -> None:
        self.buffer = ""
        self.decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[dict]:
        self.buffer += text
        events = []
        while True:
            self.buffer = self.buffer.lstrip()
            if not self.buffer:
                break
            if not self.buffer.startswith("{"):
                line, newline, rest = self.buffer.partition("\n")
                if not newline:
                    break  # a line still arriving
                self.buffer = rest
                continue
            try:
                event, end = self.decoder.raw_decode(self.buffer)
            except json.JSONDecodeError:
                break  # an object still arriving
            self.buffer = self.buffer[end:]
            if isinstance(event, dict):
                events.append(event)
        return events


class Monitor(threading.Thread):
    """A MONITOR client on a job's client port: every event, with its arrival time, appended to ``path``.

    Connects again whenever the connection ends (the process it landed on exited) until ``stop``.
    """

    def __init__(self, port: int, path: Path) -> None:
        super().__init__(daemon=True)
        self.port, self.path = port, path
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        with open(self.path, "a") as out:
            while not self.stopped.is_set():
                try:
                    self.session(out)
                except OSError:
                    pass
                self.stopped.wait(0.5)

    def session(self, out: Any) -> None:
        with socket.create_connection(("127.0.0.1", self.port), 5) as sock:
            sock.settimeout(2)
            sock.sendall(b"CLIENT PROTOCOL 2\n")
            if not sock.recv(64).startswith(b"SERVER PROTOCOL"):
                return
            sock.sendall(b"SET FORMAT json\nMONITOR all\n")
            sock.settimeout(0.5)
            stream = MonitorStream()
            while not self.stopped.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                received = time.time()
                for event in stream.feed(data.decode(errors="replace")):
                    out.write(json.dumps({"received": received, **event}) + "\n")
                    out.flush()


def read_journal(directory: Path) -> list[dict]:
    """Every record of every process's verdict journal in ``directory`` (rotated files included)."""
    records: list[dict] = []
    if directory.is_dir():
        for path in sorted(directory.glob("journal-*.jsonl*")):
            records.extend(read_events(path))
    return records


def verdict_key(record: dict) -> tuple[str, str]:
    """What a journaled verdict is about: its communicator, else its process (address and incarnation)."""
    subject = record.get("subject") or {}
    about = record.get("comm_hash") or f"{subject.get('addr')}/{subject.get('incarnation')}"
    return record.get("kind", "?"), str(about)


def distinct_verdicts(records: list[dict], window: float = SAME_VERDICT_S) -> list[dict]:
    """One record per verdict, the earliest: several processes journal the same verdict (same kind and subject)
    within ``window`` seconds of its first record."""
    first: dict[tuple[str, str], float] = {}
    found = []
    for record in sorted((r for r in records if r.get("record") == "verdict"), key=lambda r: r["epoch"]):
        key = verdict_key(record)
        if key in first and record["epoch"] - first[key] <= window:
            continue
        first[key] = record["epoch"]
        found.append(record)
    return found


def kind_counts(journal: list[dict], monitor: list[dict], kinds: tuple[str, ...]) -> dict[str, int]:
    """Per kind, the larger of the journal's distinct verdicts and the MONITOR's events (one connection sees each
    event once; the journal has what every process saw, the MONITOR what rasd does not journal)."""
    journaled = collections.Counter(record["kind"] for record in distinct_verdicts(journal))
    monitored = collections.Counter(event.get("event") for event in monitor)
    return {kind: max(journaled[kind], monitored[kind]) for kind in kinds}


def restarts(events: list[dict]) -> list[tuple[int, str]]:
    """(iteration, cause) for every restart the worker logged: each new iteration of the wrapped function after the
    first, with the cause the first rank to log it gave (torchras's Wrapper; ``None`` becomes "?")."""
    causes: dict[int, str] = {}
    for event in sorted((e for e in events if e["event"] == "iteration"), key=lambda e: e["time"]):
        iteration = int(event["iteration"])
        if iteration > 0 and (iteration not in causes or causes[iteration] == "?"):
            causes[iteration] = event.get("cause") or "?"
    return sorted(causes.items())


def cause_kind(cause: str) -> str:
    """The cause's first word: COMM_STUCK, PEER_HUNG, SOFT_TIMEOUT, HARD_TIMEOUT, an exception's class, or ?."""
    word = cause.split(" ", 1)[0].rstrip(":")
    return word or "?"


NVRX_INTERRUPTION = re.compile(r"Interruption\.([A-Z_]+)")


def nvrx_interruptions(log: str) -> dict[str, int]:
    """The interruptions nvidia-resiliency-ext names in its log (each line counted once per name)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        counts.update(set(NVRX_INTERRUPTION.findall(line)))
    return dict(counts)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between the closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def first_after(times: list[float], since: float, until: float = math.inf) -> float | None:
    """The earliest of ``times`` in [since, until), or None."""
    inside = [t for t in times if since <= t < until]
    return min(inside) if inside else None


# ---- jobs ----------------------------------------------------------------------------------------------------------


class Launch(time_lost.Job):
    """One torchrun of the worker (``time_lost.Job``'s process handling: every descendant tagged, killed at the end).

    torchras gets a client port of its own and a journal folder; nvidia-resiliency-ext runs with the mesh off.
    """

    def __init__(self, system: str, model: str, directory: Path, python: str, arguments: list[str]) -> None:
        self.system, self.model, self.directory = system, model, directory
        directory.mkdir(parents=True, exist_ok=True)
        self.events_path = directory / "events.jsonl"
        self.gate = directory / "gate"
        self.finish = directory / "finish"
        self.control = directory / "control"
        self.control.mkdir(exist_ok=True)
        self.journal = directory / "journal"
        self.monitor_path = directory / "monitor.jsonl"
        self.tag = uuid.uuid4().hex
        self.store = None
        self.ended_at: float | None = None
        self.cpu: dict[int, float] = {}
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
            TORCH_CPP_LOG_LEVEL="ERROR",
            TIME_LOST_TAG=self.tag,
            PYTHONUNBUFFERED="1",
        )
        self.monitor: Monitor | None = None
        if system == "torchras":
            self.client_port = free_port()
            env.update(TORCHRAS_ADDR=f"127.0.0.1:{self.client_port}", TORCHRAS_JOURNAL_DIR=str(self.journal))
            self.monitor = Monitor(self.client_port, self.monitor_path)
        else:
            env["TORCHRAS_ENABLE"] = "0"
        command = [
            python,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={WORLD_SIZE}",
            f"--master-port={free_port(beside=PORT_OFFSETS)}",
            str(WORKER),
            "--system",
            system,
            "--workload",
            model,
            "--events",
            str(self.events_path),
            "--gate",
            str(self.gate),
            "--finish",
            str(self.finish),
            "--control",
            str(self.control),
            "--scratch",
            str(directory),
            *arguments,
        ]
        self.log_path = directory / "output.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed by end()
        self.processes = [subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)]
        if self.monitor is not None:
            self.monitor.start()

    def ready(self) -> bool:
        return all(Path(f"{self.gate}.ready{rank}").exists() for rank in range(WORLD_SIZE))

    def events(self) -> list[dict]:
        return read_events(self.events_path)

    def ended(self) -> bool:
        """torchrun exited (recorded the first time it is seen)."""
        if self.ended_at is None and self.finished():
            self.ended_at = time.time()
        return self.ended_at is not None

    def lost_reason(self, since: float | None = None) -> str:
        self.log.flush()
        return time_lost.torchrun_account(self.log_path.read_text(errors="replace"))

    def sample_cpu(self) -> None:
        """The CPU seconds of every process of the job so far (user + system), kept per pid."""
        for process in self.tagged():
            try:
                times = process.cpu_times()
                self.cpu[process.pid] = times.user + times.system
            except psutil.Error:
                pass

    def stop(self, grace: float) -> None:
        """Ask the job to finish (every rank agrees at a step), wait up to ``grace`` s, then end every process."""
        self.finish.touch()
        deadline = time.monotonic() + grace
        while not self.ended() and time.monotonic() < deadline:
            self.sample_cpu()
            time.sleep(1)
        self.sample_cpu()
        if self.monitor is not None:
            self.monitor.stop()
        self.end()

    def journal_records(self) -> list[dict]:
        return read_journal(self.journal)

    def monitor_events(self) -> list[dict]:
        return read_events(self.monitor_path)


class Starver:
    """The CPU-starved host: ``STARVE_FACTOR x cores`` busy-looping processes during each window."""

    def __init__(self, t0: float, windows: list[tuple[float, float]]) -> None:
        self.t0, self.windows = t0, windows
        self.processes: list[subprocess.Popen] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        for start, seconds in self.windows:
            if self.stopped.wait(max(0.0, self.t0 + start - time.time())):
                return
            count = STARVE_FACTOR * (os.cpu_count() or 1)
            self.processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
            self.stopped.wait(seconds)
            self.kill()

    def kill(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        self.kill()


# ---- the soak ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SoakResult:
    system: str
    model: str
    minutes: float
    launches: list[Launch]
    verdicts: dict[str, int]
    notices: dict[str, int]
    restart_causes: list[str]
    jobs_lost: list[str]
    phases: list[dict]  # per phase of the plan: entered, completed, cut, details of its acting rank
    cpu_cores: float  # the job's CPU seconds over the soak's seconds
    interruptions: dict[str, int]

    @property
    def false_verdicts(self) -> int:
        return sum(self.verdicts.values())


def write_schedule(path: Path, t0: float, phases: list[Phase]) -> None:
    path.write_text(json.dumps({"t0": t0, "phases": [dataclasses.asdict(phase) for phase in phases]}))


def entered(launches: list[Launch]) -> set[int]:
    return {int(e["index"]) for launch in launches for e in launch.events() if e["event"] == "phase"}


def soak(
    model: str,
    systems: tuple[str, ...],
    minutes: float,
    plan: tuple[list[Phase], list[tuple[float, float]]],
    root: Path,
    python_of: dict[str, str],
    seed: int,
) -> list[SoakResult]:
    """The systems' jobs on one clock: started together, the schedule's clock starting when all their ranks are
    ready; a lost job is launched again (the phases it had entered left out) while 60 s of the soak remain."""
    phases, windows = plan
    schedule = root / f"schedule-{model}-{'-'.join(systems)}.json"

    def launch(system: str, number: int, done: set[int]) -> Launch:
        arguments = ["--schedule", str(schedule), "--seed", str(seed), "--done", ",".join(map(str, sorted(done)))]
        return Launch(system, model, root / f"soak-{model}-{system}-{number}", python_of[system], arguments)

    launches = {system: [launch(system, 0, set())] for system in systems}
    deadline = time.monotonic() + READY_S
    while not all(runs[0].ready() for runs in launches.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    t0 = time.time()
    write_schedule(schedule, t0, phases)
    for runs in launches.values():
        runs[0].gate.touch()
    starver = Starver(t0, windows)
    lost: dict[str, list[str]] = {system: [] for system in systems}
    loads: list[float] = []
    end = t0 + minutes * 60.0
    handled: set[Path] = set()  # launches whose end was counted
    try:
        while time.time() < end:
            time.sleep(1.0)
            if int(time.time() - t0) % 10 == 0:
                loads.append(os.getloadavg()[0])
                for runs in launches.values():
                    runs[-1].sample_cpu()
            for system, runs in launches.items():
                current = runs[-1]
                if current.directory in handled or not current.ended():
                    continue
                handled.add(current.directory)
                at = current.ended_at or time.time()
                lost[system].append(f"{at - t0:.0f} s: {current.lost_reason()}")
                current.end()
                if end - time.time() > 60.0:
                    runs.append(launch(system, len(runs), entered(runs)))
                    runs[-1].gate.touch()
    finally:
        starver.stop()
        for runs in launches.values():
            if runs[-1].directory not in handled:
                runs[-1].stop(FINISH_S)
    elapsed = time.time() - t0
    print(
        f"  soak {model}: {', '.join(systems)}, {elapsed / 60:.1f} min, 1-min load median "
        f"{statistics.median(loads) if loads else float('nan'):.1f}",
        file=sys.stderr,
        flush=True,
    )
    return [
        summarise_soak(system, model, minutes, launches[system], lost[system], phases, elapsed) for system in systems
    ]


def summarise_soak(
    system: str,
    model: str,
    minutes: float,
    launches: list[Launch],
    lost: list[str],
    phases: list[Phase],
    elapsed: float,
) -> SoakResult:
    events = [event for launch in launches for event in launch.events()]
    journal = [record for launch in launches for record in launch.journal_records()]
    monitor = [event for launch in launches for event in launch.monitor_events()]
    causes = [cause for launch in launches for _, cause in restarts(launch.events())]
    interruptions: collections.Counter[str] = collections.Counter()
    if system == "nvrx":
        for launch in launches:
            interruptions.update(nvrx_interruptions(launch.log_path.read_text(errors="replace")))
    table = []
    for phase in phases:
        ends = [e for e in events if e["event"] == "phase_end" and e["index"] == phase.index]
        table.append(
            dict(
                dataclasses.asdict(phase),
                entered=any(e["event"] == "phase" and e["index"] == phase.index for e in events),
                completed=any(e.get("completed") for e in ends),
                ends=[{k: v for k, v in e.items() if k not in ("event", "pid", "initial_rank")} for e in ends],
            )
        )
    cpu = sum(sum(launch.cpu.values()) for launch in launches)
    return SoakResult(
        system=system,
        model=model,
        minutes=minutes,
        launches=launches,
        verdicts=kind_counts(journal, monitor, VERDICTS),
        notices=kind_counts(journal, monitor, NOTICES),
        restart_causes=causes,
        jobs_lost=lost,
        phases=table,
        cpu_cores=cpu / elapsed if elapsed > 0 else 0.0,
        interruptions=dict(interruptions),
    )


# ---- the wedges ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Wedge:
    system: str
    model: str
    rank: int
    at: float | None = None  # the wedge, the worker's clock
    verdict_s: float | None = None
    verdict: str = ""
    restart_s: float | None = None
    trained_s: float | None = None  # every rank of the new iteration stepped
    lost_s: float | None = None  # torchrun ended the job
    note: str = ""


def training_everywhere(events: list[dict]) -> bool:
    """Every rank of the newest iteration has stepped."""
    steps = [e for e in events if e["event"] == "step"]
    if not steps:
        return False
    newest = max(e["system_iteration"] for e in steps)
    current = [e for e in steps if e["system_iteration"] == newest]
    return len({e["rank"] for e in current}) >= current[0]["world_size"]


def time_wedge(wedge: Wedge, launch: Launch, name: str, until: float) -> None:
    """Fill in the wedge's times from the job's events, journal and MONITOR (everything in [wedge, until))."""
    events = launch.events()
    fault = next((e for e in events if e["event"] == "fault" and e.get("wedge") == name), None)
    if fault is None:
        wedge.note = "the wedged rank never reached its next step"
        return
    wedge.at = at = fault["time"]
    verdicts = [r for r in distinct_verdicts(launch.journal_records()) if r["kind"] in VERDICTS]
    monitored = [e for e in launch.monitor_events() if e.get("event") in VERDICTS]
    candidates = [(r["epoch"], r["kind"]) for r in verdicts if at <= r["epoch"] < until]
    candidates += [(e["received"], e["event"]) for e in monitored if at <= e["received"] < until]
    if candidates:
        when, wedge.verdict = min(candidates)
        wedge.verdict_s = when - at
    starts = [e["time"] for e in events if e["event"] == "iteration" and e["iteration"] > fault["system_iteration"]]
    restart = first_after(starts, at, until)
    wedge.restart_s = None if restart is None else restart - at
    for found, result in time_lost.recoveries(events):
        if found is fault and result is not None:
            wedge.trained_s = result[0]
    if launch.ended_at is not None and at <= launch.ended_at < until:
        wedge.lost_s = launch.ended_at - at
        wedge.note = launch.lost_reason()


def wait_until(condition: Any, seconds: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def await_wedge(launch: Launch, name: str, interval: float) -> None:
    """Until the wedge ``name`` is over: the job trains on every rank of a later iteration, or it ended, or
    ``WEDGE_CAP_S`` passed since the wedge (``WEDGE_ARRIVE_S`` for the wedged rank to reach it)."""

    def made() -> bool:
        return any(event.get("wedge") == name for event in launch.events())

    def over() -> bool:
        return launch.ended() or any(
            fault is not None and fault.get("wedge") == name and result is not None
            for fault, result in time_lost.recoveries(launch.events())
        )

    if wait_until(made, WEDGE_ARRIVE_S):
        fault = next(event for event in launch.events() if event.get("wedge") == name)
        wait_until(over, max(0.0, fault["time"] + WEDGE_CAP_S - time.time()), interval)


def wedge_chain(model: str, count: int, root: Path, python: str, rng: random.Random, number: int = 0) -> list[Wedge]:
    """torchras: ``count`` wedges in one job, each after the restart that ended the one before (a lost job is
    launched again for the rest)."""
    results: list[Wedge] = []
    launch = Launch("torchras", model, root / f"wedges-{model}-torchras-{number}", python, [])
    launch.gate.touch()
    try:
        if not wait_until(lambda: training_everywhere(launch.events()) or launch.ended(), READY_S, 0.5):
            return [Wedge("torchras", model, -1, note="the job never trained") for _ in range(count)]
        for index in range(count):
            if launch.ended():
                rest = wedge_chain(model, count - index, root, python, rng, number + 1)
                return results + rest
            time.sleep(rng.uniform(*WEDGE_START_S))
            rank = rng.randrange(WORLD_SIZE)
            name = f"wedge-{index}-rank{rank}"
            (launch.control / name).touch()
            wedge = Wedge("torchras", model, rank)
            results.append(wedge)
            await_wedge(launch, name, 0.5)
            time_wedge(wedge, launch, name, time.time())
            print(f"  {format_wedge(wedge)}", file=sys.stderr, flush=True)
    finally:
        if not launch.ended():
            launch.stop(FINISH_S)
        else:
            launch.end()
    return results


def wedge_alone(model: str, index: int, root: Path, python: str, seed: int, starting: threading.Semaphore) -> Wedge:
    """nvidia-resiliency-ext: one wedge in a job of its own (its hard timeout ends the wedged rank, torchrun the
    job)."""
    rng = random.Random(f"{seed}-nvrx-{model}-{index}")
    rank = rng.randrange(WORLD_SIZE)
    wedge = Wedge("nvrx", model, rank)
    with starting:
        launch = Launch("nvrx", model, root / f"wedges-{model}-nvrx-{index}", python, [])
        launch.gate.touch()
        steady = wait_until(lambda: training_everywhere(launch.events()) or launch.ended(), READY_S, 0.5)
    try:
        if not steady or launch.ended():
            wedge.note = "the job never trained"
            return wedge
        time.sleep(rng.uniform(*WEDGE_START_S))
        name = f"wedge-0-rank{rank}"
        (launch.control / name).touch()
        await_wedge(launch, name, 0.2)
        time_wedge(wedge, launch, name, time.time() + 1)
    finally:
        if not launch.ended():
            launch.stop(30.0)
        else:
            launch.end()
    print(f"  {format_wedge(wedge)}", file=sys.stderr, flush=True)
    return wedge


def wedges(
    model: str, systems: tuple[str, ...], count: int, nvrx_count: int, root: Path, python_of: dict[str, str], seed: int
) -> list[Wedge]:
    """torchras's chain and nvidia-resiliency-ext's jobs (two at a time) at once."""
    starting = threading.Semaphore(NVRX_WEDGE_JOBS)
    with concurrent.futures.ThreadPoolExecutor(1 + NVRX_WEDGE_JOBS) as pool:
        futures: list[concurrent.futures.Future[Any]] = []
        if "torchras" in systems and count:
            chain_rng = random.Random(f"{seed}-torchras-{model}")
            futures.append(pool.submit(wedge_chain, model, count, root, python_of["torchras"], chain_rng))
        if "nvrx" in systems:
            for index in range(nvrx_count):
                futures.append(pool.submit(wedge_alone, model, index, root, python_of["nvrx"], seed, starting))
        found: list[Wedge] = []
        for future in futures:
            result = future.result()
            found.extend(result if isinstance(result, list) else [result])
    return found


# ---- report ----------------------------------------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def format_wedge(wedge: Wedge) -> str:
    parts = [f"{wedge.system} {wedge.model} wedge on rank {wedge.rank}:"]
    if wedge.verdict_s is not None:
        parts.append(f"{wedge.verdict} after {wedge.verdict_s:.2f} s,")
    parts.append(f"restart {seconds(wedge.restart_s)}, training again {seconds(wedge.trained_s)}")
    if wedge.lost_s is not None:
        parts[-1] += f", job lost after {wedge.lost_s:.1f} s ({wedge.note})"
    elif wedge.note:
        parts[-1] += f" ({wedge.note})"
    return " ".join(parts)


def summarise_wedges(found: list[Wedge]) -> dict[str, Any]:
    timed = [w for w in found if w.at is not None]
    figures: dict[str, Any] = {"n": len(found), "made": len(timed)}
    for name, values in (
        ("verdict", [w.verdict_s for w in timed if w.verdict_s is not None]),
        ("restart", [w.restart_s for w in timed if w.restart_s is not None]),
        ("trained", [w.trained_s for w in timed if w.trained_s is not None]),
    ):
        figures[f"{name}_count"] = len(values)
        for q in (50, 90):
            value = percentile(values, q)
            figures[f"{name}_p{q}_s"] = None if value is None else round(value, 3)
    figures["lost"] = sum(w.lost_s is not None for w in timed)
    lost = [w.lost_s for w in timed if w.lost_s is not None]
    figures["lost_p50_s"] = round(statistics.median(lost), 3) if lost else None
    figures["verdict_kinds"] = dict(collections.Counter(w.verdict for w in timed if w.verdict))
    return figures


def report(soaks: list[SoakResult], wedge_results: dict[tuple[str, str], list[Wedge]], how: str) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    if soaks:
        print()
        print(f"soak: healthy slow phases, no fault injected ({how}); every verdict, restart and lost job is false")
        header = f"{'model':<6}{'system':<10}{'min':>5}{'phases':>9}{'cut':>5}"
        header += "".join(f"{kind:>12}" for kind in VERDICTS) + f"{'restarts':>10}{'lost':>6}"
        header += "".join(f"{kind:>19}" for kind in NOTICES) + f"{'cores':>7}"
        print(header)
        for result in soaks:
            entered_phases = [p for p in result.phases if p["entered"]]
            cut = sum(not p["completed"] for p in entered_phases if p["kind"] != "jitter")
            row = f"{result.model:<6}{result.system:<10}{result.minutes:>5g}"
            row += f"{len(entered_phases):>4}/{len(result.phases):<4}{cut:>5}"
            if result.system == "torchras":
                row += "".join(f"{result.verdicts[kind]:>12}" for kind in VERDICTS)
            else:
                row += "".join(f"{'n/a':>12}" for _ in VERDICTS)
            row += f"{len(result.restart_causes):>10}{len(result.jobs_lost):>6}"
            if result.system == "torchras":
                row += "".join(f"{result.notices[kind]:>19}" for kind in NOTICES)
            else:
                row += "".join(f"{'n/a':>19}" for _ in NOTICES)
            print(row + f"{result.cpu_cores:>7.2f}")
            prefix = f"{result.model}_{result.system}"
            figures[f"{prefix}_soak_minutes"] = result.minutes
            if result.system == "torchras":
                figures[f"{prefix}_false_verdicts"] = result.false_verdicts
                for kind in VERDICTS + NOTICES:
                    figures[f"{prefix}_{kind.lower()}"] = result.verdicts.get(kind, result.notices.get(kind))
            figures[f"{prefix}_restarts"] = len(result.restart_causes)
            figures[f"{prefix}_jobs_lost"] = len(result.jobs_lost)
            figures[f"{prefix}_phases_cut"] = cut
        print(
            "phases: entered/planned; cut: entered phases (not jitter) whose acting rank did not complete them (a "
            "restart or a lost job); restarts: new iterations of the wrapped function; lost: torchrun ended the job "
            "(launched again); cores: the job's CPU seconds per second. Goal: 0 verdicts, 0 restarts, 0 lost."
        )
        for result in soaks:
            causes = collections.Counter(cause_kind(cause) for cause in result.restart_causes)
            line = f"  {result.model} {result.system}: restart causes {dict(causes) or '-'}"
            if result.interruptions:
                line += f"; interruptions in its log {result.interruptions}"
            for reason in result.jobs_lost:
                line += f"; lost at {reason}"
            print(line)
            for phase in result.phases:
                detail = "; ".join(
                    ", ".join(f"{k} {v}" for k, v in end.items() if k not in ("time", "index", "kind"))
                    for end in phase["ends"]
                )
                state = "completed" if phase["completed"] else "entered, cut" if phase["entered"] else "not entered"
                if phase["kind"] == "jitter" and phase["entered"]:
                    state = "entered (every rank)"  # no acting rank: nothing to complete
                size = f"{phase['objects']:,} objects" if phase["kind"] == "gc" else f"{phase['duration']:g} s"
                print(
                    f"    {phase['index']:>2} {phase['kind']:<10} at {phase['at']:>6.0f} s  {size:<18} rank "
                    f"{phase['rank']}  {state}{': ' + detail if detail else ''}"
                )
    if wedge_results:
        print()
        print("wedges: a rank blocked idle in time.sleep(120) before its forward pass; seconds from the wedge")
        print(
            f"{'model':<6}{'system':<10}{'made':>6}{'verdict p50':>13}{'p90':>9}{'restart p50':>13}{'p90':>9}"
            f"{'training p50':>14}{'p90':>9}{'lost':>6}"
        )
        for (model, system), found in wedge_results.items():
            summary = summarise_wedges(found)
            print(
                f"{model:<6}{system:<10}{summary['made']:>3}/{summary['n']:<2}"
                f"{seconds(summary['verdict_p50_s']):>13}{seconds(summary['verdict_p90_s']):>9}"
                f"{seconds(summary['restart_p50_s']):>13}{seconds(summary['restart_p90_s']):>9}"
                f"{seconds(summary['trained_p50_s']):>14}{seconds(summary['trained_p90_s']):>9}{summary['lost']:>6}"
            )
            prefix = f"{model}_{system}_wedge"
            for key in ("made", "verdict_p50_s", "verdict_p90_s", "restart_p50_s", "restart_p90_s"):
                figures[f"{prefix}_{key}"] = summary[key]
            figures[f"{prefix}_trained_p50_s"] = summary["trained_p50_s"]
            figures[f"{prefix}_lost"] = summary["lost"]
        print(
            f"Goals (torchras at its defaults): verdict p50 <= {GOAL_P50_S:g} s, p90 <= {GOAL_P90_S:g} s, no job lost. "
            "nvidia-resiliency-ext has no verdict event: its soft timeout (60 s) restarts, its hard timeout (90 s) "
            "ends the wedged rank."
        )
        for found in wedge_results.values():
            for wedge in found:
                print(f"  {format_wedge(wedge)}")
    return figures


# ---- main ----------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="soak minutes per model (default 30)")
    parser.add_argument("--wedges", type=int, default=10, help="idle wedges per model (default 10)")
    parser.add_argument("--nvrx-wedges", type=int, help="nvidia-resiliency-ext's wedges per model (default: --wedges)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 min soak, 2 wedges, DDP only")
    parser.add_argument("--only", choices=SYSTEMS, help="one system")
    parser.add_argument("--model", choices=MODELS, help="one model (default: both; --quick: ddp)")
    parser.add_argument("--serial", action="store_true", help="run the systems' soaks one after another")
    parser.add_argument("--no-soak", action="store_true", help="the wedges only")
    parser.add_argument("--no-wedges", action="store_true", help="the soak only")
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--nvrx-venv", type=Path, default=DEFAULT_NVRX_VENV)
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.wedges = 2.0, min(args.wedges, 2)
    models = (args.model,) if args.model else ("ddp",) if args.quick else MODELS
    systems = (args.only,) if args.only else SYSTEMS
    nvrx_count = args.wedges if args.nvrx_wedges is None else args.nvrx_wedges
    python_of = {"torchras": sys.executable}
    if "nvrx" in systems:
        python_of["nvrx"] = nvrx_python(args.nvrx_venv)
    import torch

    how = "one after another" if args.serial or len(systems) == 1 else "concurrently, one clock"
    print(
        f"false verdicts on healthy slow phases, and idle wedges: {WORLD_SIZE} gloo ranks on the CPU "
        f"({', '.join(models)}) under torchrun, torch {torch.__version__}, {os.cpu_count()} cores; "
        f"{', '.join(systems)} (nvidia-resiliency-ext {NVRX_VERSION}) at their defaults, soaks run {how}; "
        f"{args.minutes:g} min soak and {args.wedges} wedges per model"
    )
    started = time.monotonic()
    root = OUTPUT / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    soaks: list[SoakResult] = []
    wedge_results: dict[tuple[str, str], list[Wedge]] = {}
    for model in models:
        if args.no_soak:
            break
        plan = soak_plan(args.minutes, args.seed, args.quick)
        groups = [(system,) for system in systems] if args.serial else [systems]
        for group in groups:
            soaks.extend(soak(model, group, args.minutes, plan, root, python_of, args.seed))
    for model in models:
        if args.no_wedges:
            break
        found = wedges(model, systems, args.wedges, nvrx_count, root, python_of, args.seed)
        for system in systems:
            wedge_results[(model, system)] = [w for w in found if w.system == system]
    figures = report(soaks, wedge_results, how)
    print(f"elapsed {(time.monotonic() - started) / 60:.1f} min; logs: {root}")
    figures.update(
        concurrent=len(systems) > 1 and not args.serial, elapsed_min=round((time.monotonic() - started) / 60, 1)
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
