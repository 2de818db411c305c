"""One training process of ``bench/time_lost.py``: a gloo training loop, a fault, and the events that time it.

The same loop runs under each restart system the benchmark compares, so only the system differs:

* ``torchras``: this repository's ``inprocess.Wrapper`` (default settings, or tuned);
* ``nvrx``:     nvidia-resiliency-ext's ``inprocess.Wrapper`` (run from the separate venv the benchmark makes), with
                its stock abort or with this repository's gloo-unblocking ``AbortTorchDistributed`` passed in;
* ``torchrun``: a plain process that torchrun restarts as a whole.

A *step* is one ``all_reduce`` of a gradient-sized tensor followed by ``STEP_SLEEP_S`` of "compute". The faulty
rank (``--fault-rank``) injects the i-th fault of ``--schedule`` in iteration i once that iteration has run
``WARMUP_S`` (so the job, and the rasd mesh where one runs, is in its steady state). The costly imports happen
before ``--gate`` opens, so the benchmark can start the next job while it measures this one (and pause it while
a fault is being timed). Events, one JSON line each, appended to
``--events`` (O_APPEND line writes, so the processes never interleave within a line):

    {"event": "step", "time", "pid", "system_iteration", "rank", "world_size", "initial_rank"}
                                                         the first step of an iteration
    {"event": "fault", "time", "pid", "kind", "system_iteration", "initial_rank"}  just before the fault
    {"event": "done", ...}                               the training function returned

Faults: ``exception`` (raise), ``kill`` (SIGKILL itself), ``stop`` (SIGSTOP itself, forever),
``stall`` (sleep before the next collective in 50 ms chunks: a slow rank whose interpreter keeps running, not
one holding the GIL), ``skip`` (leave out one collective: every later collective of the rank pairs with the
wrong one of its peers).
"""

# No ``from __future__ import annotations``: nvidia-resiliency-ext finds the CallWrapper parameter by its evaluated
# annotation.
import argparse
import datetime
import importlib
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

WARMUP_S = 2.0  # steady state before a fault (the mesh connects and exchanges its first keepalives)
POST_STEPS = 5  # steps of the last iteration after the last fault, then the function returns
STEP_SLEEP_S = 0.01
PAIR_EVERY = 10
STALL_CHUNK_S = 0.05
STALL_TOTAL_S = 3600.0  # "forever": only a restart ends it
GLOO_TIMEOUT = datetime.timedelta(seconds=60)  # the application's process-group timeout, the same for every system
TUNED_SECONDS = dict(
    last_call_wait=0.1,
    monitor_thread_interval=0.1,
    monitor_process_interval=0.1,
    heartbeat_interval=0.1,
    progress_watchdog_interval=0.1,
)


class Events:
    """Append-only JSON-lines event file shared by every process of one job."""

    def __init__(self, path: str, **identity: Any) -> None:
        self.descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.identity = identity

    def __call__(self, event: str, **fields: Any) -> None:
        record = dict(event=event, time=time.time(), pid=os.getpid(), **self.identity, **fields)
        os.write(self.descriptor, (json.dumps(record) + "\n").encode())


def inject(kind: str, events: Events, iteration: int) -> bool:
    """Inject the fault; returns True when the caller must leave out the collective (``skip``)."""
    events("fault", kind=kind, system_iteration=iteration)
    if kind == "exception":
        raise RuntimeError("injected fault")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        return False
    if kind == "stall":
        deadline = time.monotonic() + STALL_TOTAL_S
        while time.monotonic() < deadline:  # Python between chunks: a restart's async exception lands here
            time.sleep(STALL_CHUNK_S)
        return False
    if kind == "skip":
        return True
    raise ValueError(kind)


def train_loop(args: argparse.Namespace, events: Events, store: Any, iteration: int) -> None:
    """One iteration of training on whatever ranks the system gives this process.

    Two communicators, as in ``rasd demo``: the gradient all-reduce on the world group every step, and a metric
    all-reduce of the last two ranks every ``PAIR_EVERY`` steps. With one communicator a skipped gloo collective
    goes unnoticed (gloo pairs the skipping rank's next all-reduce with its peers' current one); with two, the
    pair's ranks wait for each other in different groups: a real deadlock.
    """
    import torch
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
    gradient, metric = torch.ones(1024), torch.ones(1)
    schedule = args.schedule.split(",")
    faulty = initial_rank == args.fault_rank and iteration < len(schedule)
    started = None
    step = 0
    while True:
        skip = False
        if faulty and started is not None and time.monotonic() - started >= WARMUP_S:
            faulty = False
            skip = inject(schedule[iteration], events, iteration)
        if not skip:
            dist.all_reduce(gradient)
            gradient.fill_(1.0)
        if started is None:
            started = time.monotonic()
            events("step", system_iteration=iteration, rank=rank, world_size=world_size)
        if step % PAIR_EVERY == PAIR_EVERY // 2 and rank in pair_ranks:
            dist.all_reduce(metric, group=pair)
        step += 1
        if iteration >= len(schedule) and step >= POST_STEPS:
            break
        time.sleep(STEP_SLEEP_S)
    dist.destroy_process_group()


def app_store(host: str, port: int, prefix: str) -> Any:
    """The training function's own store (for ``init_process_group``): served by the benchmark, not a rank."""
    import torch.distributed as dist

    client = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    return dist.PrefixStore(prefix, client)


def wrapper_settings(setting: str) -> dict:
    if setting == "default":
        return {}
    return {name: datetime.timedelta(seconds=value) for name, value in TUNED_SECONDS.items()}


def run_torchras(args: argparse.Namespace, events: Events) -> None:
    import inprocess

    store = app_store("127.0.0.1", args.app_port, args.app_prefix)
    settings = wrapper_settings(args.setting)
    if args.store == "etcd":
        settings.update(etcd_store_settings())

    @inprocess.Wrapper(**settings)
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        train_loop(args, events, store, call_wrapper.iteration)

    train()
    events("done")


def etcd_store_settings() -> dict:
    """The Wrapper's store on etcd: the class and its endpoints come from the environment the benchmark sets."""
    import importlib

    module_name, _, class_name = os.environ["TIME_LOST_ETCD_STORE"].rpartition(".")
    factory = getattr(importlib.import_module(module_name), class_name)
    return dict(store_factory=factory, store_kwargs=json.loads(os.environ.get("TIME_LOST_ETCD_KWARGS", "{}")))


def run_nvrx(args: argparse.Namespace, events: Events) -> None:
    from nvidia_resiliency_ext import inprocess as nvrx

    store = app_store("127.0.0.1", args.app_port, args.app_prefix)
    settings = wrapper_settings(args.setting)
    if args.abort == "socket":
        settings["abort"] = socket_abort(nvrx)

    @nvrx.Wrapper(**settings)
    def train(call_wrapper: nvrx.CallWrapper | None = None) -> None:  # nvidia-resiliency-ext passes it
        assert call_wrapper is not None
        train_loop(args, events, store, call_wrapper.iteration)

    train()
    events("done")


def socket_abort(nvrx: Any) -> Any:
    """This repository's gloo-unblocking abort, in the form nvidia-resiliency-ext's Wrapper accepts.

    nvidia-resiliency-ext checks ``isinstance(abort, its Abort)``, so the adapter subclasses its ``Abort`` and
    calls ``inprocess.abort.AbortTorchDistributed`` (shut the process's gloo peer sockets, then destroy the
    process groups). Outside our Wrapper there is no active call to name the wrapper store's port; the abort
    spares ``MASTER_PORT`` (where nvidia-resiliency-ext's store listens by default) and the stores behind the
    live process groups.
    """
    from inprocess.abort import AbortTorchDistributed

    ours = AbortTorchDistributed()

    class SocketAbort(nvrx.abort.Abort):
        def __call__(self, state: Any) -> Any:
            ours(None)
            return state

    return SocketAbort()


def run_torchrun(args: argparse.Namespace, events: Events) -> None:
    """A torchrun worker: the per-attempt store workaround (bench/README.md, torchrun): a fresh prefix per restart."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store = app_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), f"attempt{attempt}")
    train_loop(args, events, store, attempt)
    events("done")


def prepare(system: str) -> None:
    """The imports, done before the gate opens: they are the costly part of a start, and no clock runs yet."""
    systems = {"torchras": ["inprocess"], "nvrx": ["inprocess.abort", "nvidia_resiliency_ext.inprocess"]}
    for module in ["torch.distributed", *systems.get(system, [])]:
        importlib.import_module(module)


RUNNERS: dict[str, Callable[[argparse.Namespace, Events], None]] = {
    "torchras": run_torchras,
    "nvrx": run_nvrx,
    "torchrun": run_torchrun,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--setting", choices=["default", "tuned"], default="default")
    parser.add_argument("--abort", choices=["stock", "socket"], default="stock")
    parser.add_argument("--store", choices=["tcp", "etcd"], default="tcp")
    parser.add_argument(
        "--schedule",
        required=True,
        help="comma-separated faults, the i-th in iteration i: exception, kill, stop, stall, skip",
    )
    parser.add_argument("--fault-rank", type=int, default=2)
    parser.add_argument("--gate", help="wait (imports done) until this file exists: the benchmark's go")
    parser.add_argument("--events", required=True)
    parser.add_argument("--app-port", type=int, default=0)
    parser.add_argument("--app-prefix", default="")
    args = parser.parse_args()
    prepare(args.system)
    while args.gate and not os.path.exists(args.gate):
        time.sleep(0.05)
    events = Events(args.events, initial_rank=int(os.environ["RANK"]))
    RUNNERS[args.system](args, events)


if __name__ == "__main__":
    main()
