"""One training process of ``bench/false_verdicts.py``: a user's ordinary script with healthy slow phases and wedges.

Written as a user writes a training script: ``inprocess.Wrapper`` at its defaults (its store at MASTER_PORT + 1;
nvidia-resiliency-ext's at MASTER_PORT + 2, from its own venv) around a training function that builds its process
group (gloo, torch's default timeout), torch's own DDP or FSDP2 (``fully_shard`` on a CPU device mesh) and AdamW, and
calls ``call_wrapper.ping()`` every step, as nvidia-resiliency-ext's documentation asks. The model, the data loader
(50 ms of waiting per batch), the in-memory commit every 10 steps and its restore are ``bench/time_lost_worker.py``'s,
imported from it, so both benchmarks train the same workload. Launched by plain
``torchrun --nproc-per-node 4 --master-port P bench/false_verdicts_worker.py ...``.

Every step begins with one two-element all-reduce (MAX), a metric all-reduce as many scripts have: rank 0's choice
of the next slow phase that is due (the schedule's times count from the harness's ``t0``, on rank 0's clock), and
the harness's finish flag. So every rank enters a phase at the same step, and a phase is started once per job,
whatever restarts follow (a phase cut off by a restart is not run again). Phases (``--schedule``, a JSON file the
harness writes):

    first_step  the acting rank's step begins with ``duration`` seconds of computation (a compilation, a cold
                start) before its forward pass; the other ranks wait in the step's own collectives (DDP's gradient
                all-reduce, FSDP2's all-gathers)
    checkpoint  the acting rank (rank 0) writes a checkpoint with ``torch.save`` to local disk, the newest in-memory
                commit (model and optimizer) and 20,000 small tensors (10 MB, serialising at about 25 MB/s of one
                core), ``fsync`` after each file, again and again until ``duration`` has passed; then
                ``dist.barrier()``; the other ranks wait in that ``dist.barrier()`` the whole time
    eval        the acting rank (rank 0) evaluates: forward passes (batches of 256, ``torch.no_grad``) of the newest
                commit's model for ``duration`` seconds, then ``dist.barrier()``, where the others wait
    jitter      for ``duration`` seconds every rank's step takes a random extra time before its forward pass: mostly
                up to 0.1 s, one in seven 0.2-1 s, one in twenty 1-3 s; half of the extra computes, half waits
                (``time.sleep``, a data loader's I/O)
    gc          the acting rank builds ``objects`` self-referencing lists (the collector off meanwhile), drops them
                and runs ``gc.collect()``: one collection holding the GIL for seconds, in its step before the forward
                pass, while the others wait in the step's collectives

A wedge (``--control``, where the harness drops ``wedge-<k>-rank<r>``): the rank whose initial rank is ``r``, at the
start of its next step, logs the fault and blocks idle in ONE ``time.sleep(WEDGE_S)`` in the data loader's place,
before its forward pass. Only a restart (or a kill) ends it before ``WEDGE_S``.

Events, one JSON line each, appended to ``--events`` (``time_lost_worker.Events``: ``time`` is ``time.time()``):

    {"event": "iteration", "iteration", "cause"}       the wrapped function starts (cause: the restart's, torchras)
    {"event": "step", "system_iteration", "rank", "world_size"}   the first completed step of an iteration
    {"event": "phase", "index", "kind", "rank", "system_iteration"}   every rank, when a phase is entered
    {"event": "phase_end", "index", "kind", "seconds", "completed", ...}   the acting rank, when it leaves it
    {"event": "fault", "kind": "wedge", "wedge", "system_iteration"}   just before the wedge's sleep
    {"event": "done"}                                 the wrapped function returned
"""

# No ``from __future__ import annotations``: nvidia-resiliency-ext finds the CallWrapper parameter by its evaluated
# annotation.
import argparse
import faulthandler
import gc
import json
import os
import random
import time
from typing import Any

from time_lost_worker import (
    INPUTS,
    NVRX_PORT_OFFSET,
    TORCHRAS_PORT_OFFSET,
    WORKLOADS,
    Events,
    Loader,
    Trainer,
    app_store,
    build_model,
    memory,
    prepare,
    resume_step,
    wrapper_settings,
)

WEDGE_S = 120.0  # the wedge: one idle call this long (the figure), longer than every verdict limit
CHECKPOINT_TENSORS, CHECKPOINT_WIDTH = 20_000, 128  # the checkpoint's extra state: many small tensors, 10 MB
EVAL_BATCH = 256
PHASE_KINDS = ("first_step", "checkpoint", "eval", "jitter", "gc")

#: Kept across restart iterations (module state, as ``time_lost_worker.memory``): the phases this job has entered,
#: and the wedges this rank has made.
started_phases: set[int] = set()
wedges_done: set[str] = set()


class Schedule:
    """The harness's schedule: ``t0`` (wall clock) and the phases, each {index, kind, at, duration, rank, objects}."""

    def __init__(self, path: str | None) -> None:
        self.t0 = time.time()
        self.phases: list[dict] = []
        if path:
            with open(path) as file:
                document = json.load(file)
            self.t0, self.phases = document["t0"], document["phases"]

    def due(self) -> int:
        """The first phase not yet entered whose time has come (rank 0's view), or -1."""
        now = time.time() - self.t0
        for phase in self.phases:
            if phase["index"] not in started_phases and phase["at"] <= now:
                return int(phase["index"])
        return -1

    def phase(self, index: int) -> dict:
        return next(phase for phase in self.phases if phase["index"] == index)


def agree(rank: int, schedule: Schedule, finish: str | None) -> tuple[int, bool]:
    """The step's metric all-reduce: (the phase every rank enters now or -1, whether to finish)."""
    import torch
    import torch.distributed as dist

    due = schedule.due() if rank == 0 else -1
    flag = torch.tensor([float(due), 1.0 if finish and os.path.exists(finish) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag[0].item()), bool(flag[1].item())


def compute(seconds: float) -> None:
    """Busy for ``seconds`` of wall time: matrix products, the CPU work of a compilation or a heavy step."""
    import torch

    a = torch.randn(128, 128)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)


def latest_model() -> Any:
    """The newest commit's model, unsharded, for an evaluation on one rank (the initial model before any commit)."""
    model = build_model()
    if memory:
        model.load_state_dict(memory[max(memory)][0])
    return model.eval()


class Phases:
    """What each rank does in a phase; the acting rank logs ``phase_end`` however it leaves (a restart included)."""

    def __init__(self, args: argparse.Namespace, events: Events, rank: int, world_size: int, iteration: int) -> None:
        self.args, self.events = args, events
        self.rank, self.world_size, self.iteration = rank, world_size, iteration
        self.jitter_until = 0.0
        self.jitter_random = random.Random(f"{args.seed}-{events.identity['initial_rank']}-{iteration}")
        self.checkpoint_state: dict | None = None

    def acting(self, phase: dict) -> bool:
        return self.rank == phase["rank"] % self.world_size

    def before_forward(self, phase: dict | None) -> None:
        """Work inside the step, before its forward pass: a phase entered at this step, the jitter of its window."""
        if phase is not None and phase["kind"] == "jitter":
            self.jitter_until = time.monotonic() + phase["duration"]
        if phase is not None and phase["kind"] in ("first_step", "gc") and self.acting(phase):
            self.run(phase)
        if time.monotonic() < self.jitter_until:
            self.jitter()

    def between_steps(self, phase: dict | None) -> None:
        """Work between steps that the others wait for in ``dist.barrier()``: a checkpoint, an evaluation."""
        import torch.distributed as dist

        if phase is None or phase["kind"] not in ("checkpoint", "eval"):
            return
        if self.acting(phase):
            self.run(phase)
        dist.barrier()

    def run(self, phase: dict) -> None:
        begun = time.monotonic()
        detail: dict[str, Any] = {}
        completed = False
        try:
            work = {
                "first_step": self.first_step,
                "checkpoint": self.checkpoint,
                "eval": self.evaluate,
                "gc": self.collect_garbage,
            }
            work[phase["kind"]](phase, detail)
            completed = True
        finally:
            self.events(
                "phase_end",
                index=phase["index"],
                kind=phase["kind"],
                rank=self.rank,
                system_iteration=self.iteration,
                seconds=round(time.monotonic() - begun, 3),
                completed=completed,
                **detail,
            )

    def first_step(self, phase: dict, detail: dict) -> None:
        compute(phase["duration"])

    def checkpoint(self, phase: dict, detail: dict) -> None:
        import torch

        if self.checkpoint_state is None:
            self.checkpoint_state = {f"extra.{i}": torch.randn(CHECKPOINT_WIDTH) for i in range(CHECKPOINT_TENSORS)}
        path = os.path.join(self.args.scratch, f"checkpoint-rank{self.rank}.pt")
        deadline = time.monotonic() + phase["duration"]
        written = files = 0
        while time.monotonic() < deadline:
            state = {"commit": memory.get(max(memory)) if memory else None, "state": self.checkpoint_state}
            with open(path, "wb") as file:
                torch.save(state, file)
                file.flush()
                os.fsync(file.fileno())
                written += file.tell()
            files += 1
        detail.update(bytes_written=written, files=files)

    def evaluate(self, phase: dict, detail: dict) -> None:
        import torch

        model = latest_model()
        generator = torch.Generator().manual_seed(self.args.seed)
        deadline = time.monotonic() + phase["duration"]
        batches = 0
        with torch.no_grad():
            while time.monotonic() < deadline:
                model(torch.randn(EVAL_BATCH, INPUTS, generator=generator))
                batches += 1
        detail.update(batches=batches)

    def collect_garbage(self, phase: dict, detail: dict) -> None:
        gc.disable()
        try:
            graph: list[list] = [[] for _ in range(int(phase["objects"]))]
            for item in graph:
                item.append(item)
            del item
            del graph
            begun = time.monotonic()
            gc.collect()
            detail.update(pause_s=round(time.monotonic() - begun, 3), objects=int(phase["objects"]))
        finally:
            gc.enable()

    def jitter(self) -> None:
        draw = self.jitter_random.random()
        extra = self.jitter_random.uniform(*((1.0, 3.0) if draw < 0.05 else (0.2, 1.0) if draw < 0.2 else (0.0, 0.1)))
        if self.jitter_random.random() < 0.5:
            compute(extra)
        else:
            time.sleep(extra)


def wedge_due(args: argparse.Namespace, initial_rank: int) -> str | None:
    """A wedge the harness asked of this rank and it has not made yet (``wedge-<k>-rank<r>`` in ``--control``)."""
    if not args.control:
        return None
    suffix = f"-rank{initial_rank}"
    for name in sorted(os.listdir(args.control)):
        if name.startswith("wedge-") and name.endswith(suffix) and name not in wedges_done:
            return name
    return None


#: A job's end that takes longer than this (destroying the process group) dumps every thread's stack.
END_DUMP_S = 3.0


def train_loop(args: argparse.Namespace, events: Events, store: Any, iteration: int, ping: Any) -> None:
    """One restart iteration: a user's training loop with the schedule's slow phases and the harness's wedges."""
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    initial_rank = events.identity["initial_rank"]
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"iteration{iteration}", store), rank=rank, world_size=world_size
    )
    step = resume_step()
    trainer = Trainer(args.workload, memory.get(step))
    loader = Loader(initial_rank, step)
    schedule = Schedule(args.schedule)
    phases = Phases(args, events, rank, world_size, iteration)
    first = True
    while True:
        index, finish = agree(rank, schedule, args.finish)
        if finish:
            break
        phase = None
        if index >= 0:
            started_phases.add(index)
            phase = schedule.phase(index)
            events("phase", index=index, kind=phase["kind"], rank=rank, system_iteration=iteration)
        phases.between_steps(phase)
        phases.before_forward(phase)
        wedge = wedge_due(args, initial_rank)
        if wedge is not None:
            wedges_done.add(wedge)
            events("fault", kind="wedge", wedge=wedge, system_iteration=iteration)
            time.sleep(WEDGE_S)  # the data loader's call, blocked idle
        trainer.step(loader.next(), skip=False)
        ping()
        if first:
            first = False
            events("step", system_iteration=iteration, rank=rank, world_size=world_size)
        step += 1
        if step % 10 == 0:
            trainer.commit(step)
    # The job's end: from here to the process's exit, every END_DUMP_S every thread's stack goes to a file beside the
    # events (faulthandler's watchdog needs no GIL: it shows a thread that holds it), as evidence of where an end
    # that lingers waits.
    events("finishing", rank=rank, system_iteration=iteration)
    stacks = open(f"{args.events}.end-stacks-{initial_rank}.txt", "a")  # noqa: SIM115 - open until the exit
    faulthandler.dump_traceback_later(END_DUMP_S, repeat=True, file=stacks)
    started = time.monotonic()
    dist.destroy_process_group()
    events("destroyed", rank=rank, seconds=round(time.monotonic() - started, 3), system_iteration=iteration)


def run_torchras(args: argparse.Namespace, events: Events) -> None:
    import inprocess

    store = app_store()

    @inprocess.Wrapper(**wrapper_settings("default", TORCHRAS_PORT_OFFSET))
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        restart = call_wrapper.last_restart
        events("iteration", iteration=call_wrapper.iteration, cause=restart.cause if restart else None)
        train_loop(args, events, store, call_wrapper.iteration, call_wrapper.ping)

    train()
    events("done")


def run_nvrx(args: argparse.Namespace, events: Events) -> None:
    from nvidia_resiliency_ext import inprocess as nvrx

    store = app_store()

    @nvrx.Wrapper(**wrapper_settings("default", NVRX_PORT_OFFSET))
    def train(call_wrapper: nvrx.CallWrapper | None = None) -> None:  # nvidia-resiliency-ext passes it
        assert call_wrapper is not None
        events("iteration", iteration=call_wrapper.iteration, cause=None)
        train_loop(args, events, store, call_wrapper.iteration, call_wrapper.ping)

    train()
    events("done")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=["torchras", "nvrx"], required=True)
    parser.add_argument("--workload", choices=WORKLOADS, default="ddp")
    parser.add_argument("--schedule", help="the slow phases (JSON: t0 and phases), read when the gate opens")
    parser.add_argument("--done", default="", help="phases an earlier launch of this job entered (comma-separated)")
    parser.add_argument("--control", help="the folder where the harness drops wedge requests")
    parser.add_argument("--scratch", required=True, help="where the checkpoint is written (local disk)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gate", help="wait (imports done) until this file exists")
    parser.add_argument("--finish", help="training ends when this file exists (every rank agrees)")
    parser.add_argument("--events", required=True)
    args = parser.parse_args()
    prepare(args.system, args.workload)
    if args.gate:  # the harness starts the clock of the schedule once every rank of every job is ready
        open(f"{args.gate}.ready{os.environ['RANK']}", "w").close()
    while args.gate and not os.path.exists(args.gate):
        time.sleep(0.05)
    started_phases.update(int(index) for index in args.done.split(",") if index)
    events = Events(args.events, initial_rank=int(os.environ["RANK"]))
    {"torchras": run_torchras, "nvrx": run_nvrx}[args.system](args, events)


if __name__ == "__main__":
    main()
