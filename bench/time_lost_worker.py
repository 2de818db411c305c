"""One training process of ``bench/time_lost.py``: torch's DDP or FSDP2 on gloo, a fault, the events that time it.

The same training code runs under each system the benchmark compares, so only the system differs:

* ``torchras``: this repository's ``inprocess.Wrapper(store_kwargs={"port": MASTER_PORT + 1})``, as README.md shows it
  (otherwise its defaults, or tuned);
* ``nvrx``:     nvidia-resiliency-ext 0.4.1's ``inprocess.Wrapper(store_kwargs={"port": MASTER_PORT + 2})``, as its
                torchrun examples set it (run from the separate venv the benchmark makes), with its stock abort or with
                this repository's gloo-unblocking abort passed in;
* ``torchrun``: no Wrapper: torchrun (``--max-restarts``) restarts every worker as a new process.

Launched by ``torchrun --nproc-per-node 4 --master-port P time_lost_worker.py ...``, or by the benchmark itself
(four processes with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, the store at MASTER_PORT served by the
benchmark as torchrun's agent serves its own). Either way the application's store
is the TCPStore at MASTER_ADDR:MASTER_PORT, outside every worker, and each restart iteration creates its process
group on a fresh prefix of it.

Workloads (``--workload``), a small MLP (64 -> 256 -> 256 -> 256 -> 8, AdamW, batches of 32):

    ddp   ``torch.nn.parallel.DistributedDataParallel`` at its defaults (gloo, CPU): the gradients fit DDP's first
          bucket, all-reduced by DDP's C++ reducer during the backward pass
    fsdp  FSDP2: ``torch.distributed.fsdp.fully_shard`` of each hidden block, then of the whole model, on a 1-D CPU
          ``DeviceMesh`` over gloo (all-gathers in forward and backward, reduce-scatters in backward)

Every restart iteration does what the Wrapper's users do: ``init_process_group`` on the iteration's store prefix, the
metric group of the last two ranks, the model restored from the in-memory commit (a full state dict of model and
optimizer, taken every ``COMMIT_EVERY`` steps; FSDP2 through ``torch.distributed.checkpoint.state_dict``, so a commit
of 4 shards restores on 3 ranks), DDP or FSDP2 wrapping, the optimizer (restored), then training. A step: the data
loader's next batch (it waits ``LOADER_S``, standing for I/O), forward, backward, optimizer step; every
``PAIR_EVERY`` steps the last two ranks all-reduce their loss on their own group (a second communicator, as in
``rasd demo``). The torchrun baseline starts from the initial model at every attempt (a real job would also load a
checkpoint from disk, which is not timed here: its figures are a lower bound).

The faulty rank (``--fault-rank``, an initial rank) injects the i-th fault of ``--schedule`` in restart iteration i,
at the start of the first step after ``WARMUP_S`` of that iteration (so the job, and the rasd mesh where one runs,
is in its steady state):

    exception  raise ``RuntimeError`` in the training function
    kill       ``SIGKILL`` of itself
    stop       ``SIGSTOP`` of itself, never resumed
    stall      the data loader's call for the next batch, before the forward pass, blocks in ONE ``time.sleep`` of
               ``STALL_S`` (an hour: longer than every cap), as a wedged data loader does; the main thread sits in a
               C call the whole time, so an asynchronous exception cannot reach it
    skip       one step runs without its gradient collectives: DDP under ``no_sync()`` (its bucket all-reduce is left
               out: the rank is then one all-reduce behind, gloo pairs its next one with the peers' current one, and
               at the pair's metric all-reduce, which follows that step, the rank and its partner wait in different
               groups: a deadlock), FSDP2 under ``set_requires_gradient_sync(False)`` (its reduce-scatters are left
               out: its next all-gather meets the peers' reduce-scatter: a deadlock at once). The skip is injected
               at the step that ends with the pair's all-reduce.

The costly imports happen before ``--gate`` opens, so the benchmark can start the next job while it measures this one
(and pause it while a fault is being timed). The last iteration (no fault left) trains until the benchmark creates
``--finish``; the ranks agree on it by a one-element all-reduce per step of that iteration. Events, one JSON line
each, appended to ``--events`` (O_APPEND line writes, so the processes never interleave within a line):

    {"event": "step", "time", "pid", "system_iteration", "rank", "world_size", "initial_rank"}
                                                         the first completed step of an iteration
    {"event": "fault", "time", "pid", "kind", "system_iteration", "initial_rank"}  just before the fault
    {"event": "done", ...}                               the training function returned
"""

# No ``from __future__ import annotations``: nvidia-resiliency-ext finds the CallWrapper parameter by its evaluated
# annotation.
import argparse
import contextlib
import copy
import datetime
import importlib
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

WORKLOADS = ("ddp", "fsdp")
FAULTS = ("exception", "kill", "stop", "stall", "skip")
WARMUP_S = 2.0  # steady state before a fault (the mesh connects and exchanges its first keepalives)
POST_STEPS = 5  # without --finish: steps of the last iteration, then the function returns
LOADER_S = 0.05  # the data loader's wait per batch (I/O); keeps 4 ranks of 6 jobs from saturating 2 cores
STALL_S = 3600.0  # one blocking call longer than every cap of the benchmark: only a restart (or a kill) ends it
PAIR_EVERY = 10
PAIR_STEP = PAIR_EVERY // 2  # step % PAIR_EVERY at which the pair all-reduces its loss (after the step)
COMMIT_EVERY = 10
BATCH, WIDTH, INPUTS, OUTPUTS = 32, 256, 64, 8
GLOO_TIMEOUT = datetime.timedelta(seconds=60)  # the application's process-group timeout, the same for every system
TUNED_SECONDS = dict(
    last_call_wait=0.1,
    monitor_thread_interval=0.1,
    monitor_process_interval=0.1,
    heartbeat_interval=0.1,
    progress_watchdog_interval=0.1,
)
TORCHRAS_PORT_OFFSET = 1  # the Wrapper's store at MASTER_PORT + 1 (README.md's example)
NVRX_PORT_OFFSET = 2  # nvidia-resiliency-ext's examples under torchrun: MASTER_PORT + 2

#: The in-memory commits of this process, kept across restart iterations: {step: (model state, optimizer state)}, the
#: last two (ranks commit at the same steps, and a fault may interrupt one between ranks).
memory: dict[int, tuple[Any, Any]] = {}


class Events:
    """Append-only JSON-lines event file shared by every process of one job."""

    def __init__(self, path: str, **identity: Any) -> None:
        self.descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.identity = identity

    def __call__(self, event: str, **fields: Any) -> None:
        record = dict(event=event, time=time.time(), pid=os.getpid(), **self.identity, **fields)
        os.write(self.descriptor, (json.dumps(record) + "\n").encode())


def inject(kind: str, events: Events, iteration: int) -> None:
    """Log the fault, then make it if it acts at once (exception, kill, stop); stall and skip act in the step."""
    if kind not in FAULTS:
        raise ValueError(kind)
    events("fault", kind=kind, system_iteration=iteration)
    if kind == "exception":
        raise RuntimeError("injected fault")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)


class Loader:
    """The data loader: each batch after ``LOADER_S`` of waiting (I/O); a wedged call blocks in one ``time.sleep``."""

    def __init__(self, initial_rank: int, step: int) -> None:
        import torch

        self.generator = torch.Generator().manual_seed(1000 * initial_rank + step)

    def next(self, wedged: bool = False) -> tuple[Any, Any]:
        import torch

        time.sleep(STALL_S if wedged else LOADER_S)
        return torch.randn(BATCH, INPUTS, generator=self.generator), torch.randn(
            BATCH, OUTPUTS, generator=self.generator
        )


def build_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(INPUTS, WIDTH), torch.nn.ReLU()),
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()),
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()),
        torch.nn.Linear(WIDTH, OUTPUTS),
    )


def full_state_dict_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


class Trainer:
    """The model of one restart iteration: DDP or FSDP2 wrapping, optimizer, commit and restore."""

    def __init__(self, workload: str, restored: tuple[Any, Any] | None) -> None:
        import torch
        import torch.distributed as dist

        self.workload = workload
        model = build_model()
        if workload == "ddp":
            if restored is not None:
                model.load_state_dict(restored[0])
            self.model: Any = torch.nn.parallel.DistributedDataParallel(model)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            if restored is not None:
                self.optimizer.load_state_dict(restored[1])
            return
        from torch.distributed.checkpoint.state_dict import set_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in list(model)[:-1]:
            fully_shard(block, mesh=mesh)
        self.model = fully_shard(model, mesh=mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        if restored is not None:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=restored[0],
                optim_state_dict=restored[1],
                options=full_state_dict_options(),
            )

    def commit(self, step: int) -> None:
        """The in-memory commit: every rank keeps a full copy (DDP: its replica; FSDP2: the shards gathered)."""
        if self.workload == "ddp":
            model, optimizer = self.model.module.state_dict(), self.optimizer.state_dict()
        else:
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model, optimizer = get_state_dict(self.model, self.optimizer, options=full_state_dict_options())
        memory[step] = (copy.deepcopy(model), copy.deepcopy(optimizer))
        for old in sorted(memory)[:-2]:
            del memory[old]

    def step(self, batch: tuple[Any, Any], skip: bool) -> Any:
        """Forward, backward, optimizer step; with ``skip``, without the gradient collectives (the skip fault)."""
        import torch

        inputs, targets = batch
        unsynchronised: Any = contextlib.nullcontext()
        if skip and self.workload == "ddp":
            unsynchronised = self.model.no_sync()
        elif skip:
            self.model.set_requires_gradient_sync(False)
        try:
            with unsynchronised:
                loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
                loss.backward()
        finally:
            if skip and self.workload == "fsdp":
                self.model.set_requires_gradient_sync(True)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()


def resume_step() -> int:
    """The step every rank resumes from: the newest commit that all of them hold (0: the initial model)."""
    import torch
    import torch.distributed as dist

    newest = torch.tensor([max(memory, default=0)])
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    return int(newest.item())


def train_loop(args: argparse.Namespace, events: Events, store: Any, iteration: int) -> None:
    """One restart iteration of training on whatever ranks the system gives this process."""
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    initial_rank = events.identity["initial_rank"]
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"iteration{iteration}", store),
        rank=rank,
        world_size=world_size,
        timeout=GLOO_TIMEOUT,
    )
    pair_ranks = list(range(max(0, world_size - 2), world_size))
    pair = dist.new_group(pair_ranks)
    step = resume_step()
    trainer = Trainer(args.workload, memory.get(step))
    loader = Loader(initial_rank, step)
    schedule = args.schedule.split(",")
    fault = schedule[iteration] if initial_rank == args.fault_rank and iteration < len(schedule) else None
    last = iteration >= len(schedule)
    started = None
    steps = 0
    while True:
        skip = wedged = False
        steady = started is not None and time.monotonic() - started >= WARMUP_S
        # A skip waits for the step that ends with the pair's all-reduce.
        if fault is not None and steady and (fault != "skip" or step % PAIR_EVERY == PAIR_STEP):
            inject(fault, events, iteration)
            skip, wedged = fault == "skip", fault == "stall"
            fault = None
        batch = loader.next(wedged)
        loss = trainer.step(batch, skip)
        if started is None:
            started = time.monotonic()
            events("step", system_iteration=iteration, rank=rank, world_size=world_size)
        if step % PAIR_EVERY == PAIR_STEP and rank in pair_ranks:
            dist.all_reduce(loss, group=pair)
        step += 1
        steps += 1
        if step % COMMIT_EVERY == 0:
            trainer.commit(step)
        if last and finished(args, steps):
            break
    dist.destroy_process_group()


def finished(args: argparse.Namespace, steps: int) -> bool:
    """The last iteration ends when the benchmark says so (every rank agrees), or after ``POST_STEPS`` without it."""
    import torch
    import torch.distributed as dist

    if not args.finish:
        return steps >= POST_STEPS
    flag = torch.tensor([1.0 if os.path.exists(args.finish) else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def app_store() -> Any:
    """The application's store (for ``init_process_group``): torchrun's agent's at MASTER_PORT, or the benchmark's."""
    import torch.distributed as dist

    client = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"time_lost/attempt{attempt}", client)


def wrapper_settings(setting: str, port_offset: int) -> dict:
    settings: dict[str, Any] = {"store_kwargs": {"port": int(os.environ["MASTER_PORT"]) + port_offset}}
    if setting == "tuned":
        settings.update({name: datetime.timedelta(seconds=value) for name, value in TUNED_SECONDS.items()})
    return settings


def run_torchras(args: argparse.Namespace, events: Events) -> None:
    import inprocess

    store = app_store()
    settings = wrapper_settings(args.setting, TORCHRAS_PORT_OFFSET)
    if args.store == "etcd":
        settings.update(etcd_store_settings())

    @inprocess.Wrapper(**settings)
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        train_loop(args, events, store, call_wrapper.iteration)

    train()
    events("done")


def etcd_store_settings() -> dict:
    """The Wrapper's store on etcd: the class and its endpoints come from the environment the benchmark sets."""
    module_name, _, class_name = os.environ["TIME_LOST_ETCD_STORE"].rpartition(".")
    factory = getattr(importlib.import_module(module_name), class_name)
    return dict(store_factory=factory, store_kwargs=json.loads(os.environ.get("TIME_LOST_ETCD_KWARGS", "{}")))


def run_nvrx(args: argparse.Namespace, events: Events) -> None:
    from nvidia_resiliency_ext import inprocess as nvrx

    store = app_store()
    settings = wrapper_settings(args.setting, NVRX_PORT_OFFSET)
    if args.abort == "socket":
        settings["abort"] = socket_abort(nvrx, settings["store_kwargs"]["port"])

    @nvrx.Wrapper(**settings)
    def train(call_wrapper: nvrx.CallWrapper | None = None) -> None:  # nvidia-resiliency-ext passes it
        assert call_wrapper is not None
        train_loop(args, events, store, call_wrapper.iteration)

    train()
    events("done")


def socket_abort(nvrx: Any, wrapper_store_port: int) -> Any:
    """This repository's gloo-unblocking abort, in the form nvidia-resiliency-ext's Wrapper accepts.

    nvidia-resiliency-ext checks ``isinstance(abort, its Abort)``, so the adapter subclasses its ``Abort`` and does what
    ``inprocess.abort.AbortTorchDistributed`` does (shut the process's gloo peer sockets, then destroy the process
    groups). Outside our Wrapper there is no active call to name the wrapper store's port, so the adapter spares it
    (``MASTER_PORT + 2``) itself, with ``MASTER_PORT`` (the application's store) and the stores behind the live
    process groups.
    """
    import torch.distributed as dist

    from inprocess.abort import process_group_store_ports, shutdown_peer_sockets

    class SocketAbort(nvrx.abort.Abort):
        def __call__(self, state: Any) -> Any:
            if dist.is_initialized():
                shutdown_peer_sockets(process_group_store_ports() | {wrapper_store_port})
                dist.destroy_process_group()
            return state

    return SocketAbort()


def run_torchrun(args: argparse.Namespace, events: Events) -> None:
    """A worker that torchrun restarts as a whole: attempt N is restart iteration N, on a prefix of its own."""
    train_loop(args, events, app_store(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    events("done")


def prepare(system: str, workload: str) -> None:
    """The imports, done before the gate opens: they are the costly part of a start, and no clock runs yet."""
    systems = {"torchras": ["inprocess"], "nvrx": ["inprocess.abort", "nvidia_resiliency_ext.inprocess"]}
    workloads = {
        "ddp": ["torch.nn.parallel"],
        "fsdp": ["torch.distributed.fsdp", "torch.distributed.device_mesh", "torch.distributed.checkpoint.state_dict"],
    }
    for module in ["torch.distributed", *workloads[workload], *systems.get(system, [])]:
        importlib.import_module(module)


RUNNERS: dict[str, Callable[[argparse.Namespace, Events], None]] = {
    "torchras": run_torchras,
    "nvrx": run_nvrx,
    "torchrun": run_torchrun,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--workload", choices=WORKLOADS, default="ddp")
    parser.add_argument("--setting", choices=["default", "tuned"], default="default")
    parser.add_argument("--abort", choices=["stock", "socket"], default="stock")
    parser.add_argument("--store", choices=["tcp", "etcd"], default="tcp")
    parser.add_argument("--schedule", required=True, help=f"comma-separated faults, the i-th in iteration i: {FAULTS}")
    parser.add_argument("--fault-rank", type=int, default=2)
    parser.add_argument("--gate", help="wait (imports done) until this file exists: the benchmark's go")
    parser.add_argument("--finish", help="the last iteration trains until this file exists")
    parser.add_argument("--events", required=True)
    args = parser.parse_args()
    prepare(args.system, args.workload)
    while args.gate and not os.path.exists(args.gate):
        time.sleep(0.05)
    events = Events(args.events, initial_rank=int(os.environ["RANK"]))
    RUNNERS[args.system](args, events)


if __name__ == "__main__":
    main()
