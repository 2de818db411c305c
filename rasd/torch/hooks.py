"""Hooks on ``torch.distributed``: every process group becomes a registered communicator, every collective and
point-to-point call is counted when it is launched and again when it completes.

``install()`` replaces the public functions of ``torch.distributed`` (and their twins in ``distributed_c10d``, so
calls from inside torch, such as ``all_gather_object``'s, are counted too) with thin wrappers::

    dist.all_reduce(t, group=g)  ->  comm(g).launch(AllReduce); original(...); comm(g).complete(AllReduce)
    dist.all_reduce(t, async_op=True)  ->  ... the completion is counted by a callback on the Work's future

On a CUDA (NCCL) group a collective returns as soon as its kernel is queued, long before it completes, so there
"completed" means completed on the GPU. After a synchronous call torch has made the caller's stream wait for the
collective, so a CUDA event recorded on that stream marks its end; an asynchronous call's ``Work`` marks its own.
Each goes into the communicator's queue of GPU work until a query (``Event.query()``, ``Work.is_completed()``:
never a wait) says it is done. The queue is drained before every snapshot (and by the training thread when it
grows long), so a rank stuck inside an NCCL kernel shows as launched and not
completed, as NCCL's own RAS counts it (docs/operations.md, "Counting on GPUs").

The cost per call is a dict lookup, two list increments and two reads of the group's sequence number (about two
microseconds, bench/overhead.py). A call on a group this process does not belong to, or before
``init_process_group``, goes straight through. ``uninstall()`` puts the originals back. Collectives that torch
issues from C++ without passing through these functions (DDP's gradient buckets, functional collectives) are
counted from the process group's own records by ``rasd.torch.records``: the sequence numbers a hooked call
consumes are remembered, so nothing is counted twice (docs/operations.md, "What is counted").

The first ``init_process_group`` also starts this process's RAS node from the default group's store.

Keeping gloo's teardown from deadlocking (torch 2.13). A gloo worker thread destroys a finished ``Work`` some time
after the caller's wait returned, and that can need the GIL (its tensors' or its thread-local state's Python
objects). If the caller meanwhile frees the group, for instance by dropping a DDP model whose reducer holds it
after ``destroy_process_group()``, the group's destructor joins the worker threads while it holds the GIL: the
worker waits for the GIL, the caller for the worker, for ever, and no thread of the process runs Python again (its
RAS node falls silent: PEER_HUNG). Seen at the end of bench/false_verdicts.py's DDP soaks (py-spy: the main thread
in ``~ProcessGroupGloo`` in ``std::thread::join``, a worker in ``gil_scoped_acquire`` under ``~AsyncAllreduceWork``)
and reproduced with torch alone (tests/integration/test_torch_teardown.py). So ``destroy_process_group`` keeps a
reference to every gloo group it destroys until the next ``init_process_group`` (or the interpreter's exit): the
group is freed then, long after its workers let go of their last work, and its destructor's join returns at once.
When the last one was destroyed just before the interpreter exits, an ``atexit`` handler waits a short grace
(``EXIT_GRACE_S``) with the GIL released: a worker that still frees its last work while the interpreter finalizes
is ended by Python (``pthread_exit``) inside a C++ destructor, which aborts the process ("terminate called without
an active exception", SIGABRT: seen once on CI, tests/integration/test_torch_teardown.py). The handler frees
nothing: a group destroyed while a worker was blocked in a collective with a dead peer would hold the exit in its
destructor's join.
Not the groups a restart's abort destroys (``not_retaining``, inprocess/abort.py): those may hold a worker blocked
in a collective with a dead rank, which the abort's socket shutdown unblocks now.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import hashlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from time import monotonic
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from rasd import api
from rasd.api import RasHandle
from rasd.core.comms import OP_TYPES, RESULT_IN_PROGRESS, runs_of
from rasd.core.registry import CommRegistry, LocalComm
from rasd.torch.records import RecordCounter

log = logging.getLogger("rasd")

#: The most destroyed gloo groups kept alive until the next init (the module docstring: gloo's teardown).
RETIRED_MAX = 16
#: At the interpreter's exit, how long after the last ``destroy_process_group`` it waits before finalizing: time for
#: the kept groups' workers to free their last work (microseconds to milliseconds).
EXIT_GRACE_S = 0.1

#: Public function -> op type. Wrapped under the same name in torch.distributed and distributed_c10d.
COUNTED: dict[str, str] = {
    "all_reduce": "AllReduce",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "all_gather": "AllGather",
    "all_gather_into_tensor": "AllGather",
    "all_gather_coalesced": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "reduce_scatter_tensor": "ReduceScatter",
    "all_to_all": "AllToAll",
    "all_to_all_single": "AllToAll",
    "gather": "Gather",
    "scatter": "Scatter",
    "barrier": "Barrier",
    "monitored_barrier": "Barrier",
    "send": "Send",
    "recv": "Recv",
    "isend": "Send",
    "irecv": "Recv",
}
#: The training thread counts finished GPU work only when a communicator has this many works queued (bounding the
#: Works it holds); the RAS thread counts it before every snapshot. Querying CUDA events at every launch would cost
#: a few microseconds per collective (bench/nccl_overhead.py).
GPU_QUEUE_DRAIN_AT = 64
#: NCCL's ncclResult_t codes for a failed operation, as the report breaks them down (docs/protocol.md §3.2, §4.1).
SYSTEM_ERROR = 2
REMOTE_ERROR = 6


class _Nested(threading.local):
    inside = False  # this thread is inside a counted call: calls torch makes from it are not counted again


_nested = _Nested()


class TorchHooks:
    """The installed hooks of this process: the registry they fill and the originals they replaced."""

    def __init__(self, registry: CommRegistry, start_mesh: bool = True) -> None:
        self.registry = registry
        self.start_mesh = start_mesh
        self.by_group: dict[int, LocalComm] = {}  # id(ProcessGroup) -> its communicator
        #: id(ProcessGroup) -> its ``_get_sequence_number_for_group`` (how many collectives it has launched).
        self.seq_readers: dict[int, Callable[[], int]] = {}
        #: What torch's own records add beneath these hooks (DDP's buckets, functional collectives).
        self.records = RecordCounter()
        self.originals: dict[tuple[Any, str], Callable] = {}
        self.groups_created = 0
        #: id(LocalComm) -> the CUDA works of that communicator not yet completed on the GPU, oldest first.
        self.gpu_pending: dict[int, collections.deque[tuple[Any, LocalComm, int]]] = {}
        self._gpu_lock = threading.Lock()
        self._events: list[Any] = []  # finished CUDA events, reused (creating one costs microseconds)
        self._streams: dict[int, tuple[int, Any]] = {}  # device -> (raw current stream, its Stream object)
        #: The in-process restart iteration whose groups are being created (inprocess.Wrapper sets it): part of
        #: every communicator hash, so a group of iteration 3 is never mistaken for its twin of iteration 2.
        self.epoch = 0
        #: The gloo groups destroyed since the last ``init_process_group``, kept alive (the module docstring: gloo's
        #: teardown).
        self.retired: list[Any] = []
        self.retired_at = float("-inf")  # when the newest of them was destroyed (monotonic)
        #: False while a restart's abort destroys the groups (``not_retaining``): they may hold a worker blocked in a
        #: collective with a dead or stopped rank, which must be joined now, not at the next init.
        self.retaining = True

    # ------------------------------------------------------------------------------------------------------------
    # Installing

    def install(self) -> None:
        for name, op in COUNTED.items():
            fn = getattr(c10d, name, None)
            if fn is not None:
                self._replace(name, self._counting(fn, OP_TYPES.index(op)))
        self._replace("init_process_group", self._wrap_init(c10d.init_process_group))
        self._replace("new_group", self._wrap_new_group(c10d.new_group))
        self._replace("destroy_process_group", self._wrap_destroy(c10d.destroy_process_group))
        abort = getattr(c10d, "_abort_process_group", None)
        if abort is not None:
            self._replace("_abort_process_group", self._wrap_abort(abort))
        if dist.is_initialized():  # installed after init: adopt the groups that exist
            self._register_default()
        atexit.register(self.settle_retired)

    def uninstall(self) -> None:
        for (module, name), fn in self.originals.items():
            setattr(module, name, fn)
        self.originals.clear()
        atexit.unregister(self.settle_retired)

    def settle_retired(self) -> None:
        """At the exit, give the kept gloo groups' workers until ``EXIT_GRACE_S`` after the newest one's destruction
        to free their last work, the GIL released (the module docstring: gloo's teardown). At most that long."""
        if self.retired:
            time.sleep(max(0.0, min(EXIT_GRACE_S, self.retired_at + EXIT_GRACE_S - monotonic())))

    def _replace(self, name: str, wrapper: Callable) -> None:
        for module in (c10d, dist):
            if getattr(module, name, None) is not None and (module, name) not in self.originals:
                self.originals[(module, name)] = getattr(module, name)
                setattr(module, name, wrapper)

    # ------------------------------------------------------------------------------------------------------------
    # Counting

    def _counting(self, fn: Callable, op: int) -> Callable:
        params = list(inspect.signature(fn).parameters)
        group_at = params.index("group") if "group" in params else None
        by_group = self.by_group
        seq_readers = self.seq_readers

        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if _nested.inside:  # torch's send() calls isend(), recv() calls irecv(): one operation, counted once
                return fn(*args, **kwargs)
            group = kwargs.get("group")
            if group is None and group_at is not None and len(args) > group_at:
                group = args[group_at]
            key = id(group if group is not None else c10d.GroupMember.WORLD)
            comm = by_group.get(key)
            if comm is None:
                return fn(*args, **kwargs)
            read_seq = seq_readers.get(key)
            before = _seq_of(read_seq)
            if before < 0:
                read_seq = None
            comm.hooked_from = before  # the ids this call consumes are the hooks', not beneath them
            comm.launch(op, monotonic())
            _nested.inside = True
            try:
                result = fn(*args, **kwargs)
            except Exception as e:
                comm.async_error = REMOTE_ERROR if isinstance(e, dist.DistError) else SYSTEM_ERROR
                raise
            finally:
                _nested.inside = False
                if read_seq is not None:
                    _consumed(comm, before, read_seq)
            if comm.device >= 0:
                self._queue_gpu_work(result if isinstance(result, dist.Work) else None, comm, op)
            elif isinstance(result, dist.Work):
                _on_completion(result, comm, op)  # async: counted when its future completes
            else:
                comm.complete(op, monotonic())
            return result

        return counted

    def _queue_gpu_work(self, work: Any, comm: LocalComm, op: int) -> None:
        """Queue the end of a GPU collective: its ``Work``, or an event on the caller's current stream."""
        marker: Any = work
        if marker is None:
            try:
                raw = torch._C._cuda_getCurrentRawStream(comm.device)  # cheap; a Stream object costs ~10 us
                cached = self._streams.get(comm.device)
                if cached is None or cached[0] != raw:
                    cached = self._streams[comm.device] = (raw, torch.cuda.current_stream(comm.device))
                try:
                    marker = self._events.pop()
                except IndexError:
                    marker = torch.cuda.Event()
                cached[1].record_event(marker)
            except Exception:  # noqa: BLE001 - no usable CUDA context: count it at once, as on the CPU
                comm.complete(op, monotonic())
                return
        with self._gpu_lock:
            queue = self.gpu_pending.setdefault(id(comm), collections.deque())
            queue.append((marker, comm, op))
            long = len(queue) > GPU_QUEUE_DRAIN_AT
        if long:
            self.drain_gpu_work()

    def drain_gpu_work(self) -> None:
        """Count the GPU work that has completed, oldest first per communicator (a stream completes in order).
        Called by the training thread at each launch and by the RAS thread before a snapshot; never blocks on
        the GPU. A work whose query fails is counted as completed with the communicator's error set."""
        with self._gpu_lock:
            for key, queue in list(self.gpu_pending.items()):
                while queue:
                    marker, comm, op = queue[0]
                    is_event = isinstance(marker, torch.cuda.Event)
                    try:
                        if not (marker.query() if is_event else marker.is_completed()):
                            break
                    except Exception:  # noqa: BLE001 - an aborted or failed communicator: recorded, not raised
                        comm.async_error = SYSTEM_ERROR
                    queue.popleft()
                    if is_event and len(self._events) < GPU_QUEUE_DRAIN_AT:
                        self._events.append(marker)
                    comm.complete(op, monotonic())
                if not queue:
                    del self.gpu_pending[key]

    def snapshot(self) -> Any:
        """This process's communicators for a report: the registry's counters after counting finished GPU work
        and what torch's records show beneath the hooks."""
        self.drain_gpu_work()
        now = monotonic()
        self.records.refresh(now)
        return self.registry.snapshot(now)

    def _count_records(self, pg: Any, comm: LocalComm, created_ns: int) -> None:
        """Count ``pg``'s collectives beneath the hooks too (rasd.torch.records)."""
        self.records.add(pg, comm, created_ns)
        if id(comm) in self.records.groups:
            self.seq_readers[id(pg)] = pg._get_sequence_number_for_group

    def begin_epoch(self, epoch: int) -> None:
        """Groups created from now on belong to restart iteration ``epoch`` (every rank numbers them afresh)."""
        self.epoch = epoch
        self.groups_created = 0

    # ------------------------------------------------------------------------------------------------------------
    # Groups

    def _wrap_init(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            if self.start_mesh:
                from rasd.services.client_port import move_nccl_ras_port

                move_nccl_ras_port()  # before NCCL's first communicator reads it
            created_ns = time.time_ns()
            self.retired = []  # a new generation: the destroyed groups' workers are long idle (gloo's teardown)
            result = fn(*args, **kwargs)
            self._register_default(created_ns)
            if self.start_mesh:
                _start_mesh(self)
            return result

        return init_process_group

    def _register_default(self, created_ns: int = 0) -> None:
        pg = c10d._get_default_group()
        comm = self.by_group[id(pg)] = self.registry.register(
            LocalComm(
                comm_hash=_hash(self.epoch, "world", dist.get_world_size()),
                size=dist.get_world_size(),
                rank=dist.get_rank(),
                rank_map=((0, dist.get_world_size(), 1),),
                device=_device_of(pg),
            )
        )
        self._count_records(pg, comm, created_ns)

    def _wrap_new_group(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            ranks = kwargs.get("ranks", args[0] if args else None)
            world = dist.get_world_size() if dist.is_initialized() else 0
            members = sorted(ranks) if ranks else list(range(world))
            self.groups_created += 1
            me = dist.get_rank() if dist.is_initialized() else -1
            pending = None
            if me in members:
                # Visible as INIT while torch builds it; all members count new_group calls alike.
                pending = self.registry.register(
                    LocalComm(
                        comm_hash=_hash(self.epoch, "new_group", self.groups_created, *members),
                        size=len(members),
                        rank=members.index(me),
                        rank_map=runs_of(members),
                        init_state=RESULT_IN_PROGRESS,
                    )
                )
            created_ns = time.time_ns()
            try:
                pg = fn(*args, **kwargs)
            except Exception:
                if pending is not None:
                    pending.init_state = SYSTEM_ERROR
                raise
            if pending is not None and isinstance(pg, dist.ProcessGroup):
                pending.init_state = 0
                pending.device = _device_of(pg)
                self.by_group[id(pg)] = pending
                self._count_records(pg, pending, created_ns)
            elif pending is not None:
                self.registry.unregister(pending)
            return pg

        return new_group

    def _wrap_destroy(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
            if group is None:
                doomed = list(self.by_group.values())
            else:
                comm = self.by_group.get(id(group))
                doomed = [comm] if comm is not None else []
            for comm in doomed:
                comm.finalize_called = True  # FINALIZE while it is being destroyed
            if self.retaining:
                # Freed at the next init (the module docstring: gloo's teardown); a script that destroys subgroups
                # in a loop without a new init keeps only the newest RETIRED_MAX, the older ones' workers long idle.
                self.retired = (self.retired + _gloo_groups(group))[-RETIRED_MAX:]
                self.retired_at = monotonic()
            try:
                return fn(group, *args, **kwargs)
            finally:
                with self._gpu_lock:
                    for comm in doomed:
                        self.gpu_pending.pop(id(comm), None)
                for comm in doomed:
                    self.registry.unregister(comm)
                    self.records.remove(comm)
                ids = {id(c) for c in doomed}
                for key in [k for k, c in self.by_group.items() if id(c) in ids]:
                    del self.by_group[key]
                    self.seq_readers.pop(key, None)

        return destroy_process_group

    @contextlib.contextmanager
    def not_retaining(self) -> Iterator[None]:
        """Destroy groups at once (inprocess's abort: the restart's groups may have a worker blocked in a collective
        with a dead or stopped rank; the abort's own socket shutdown unblocks it)."""
        self.retaining = False
        try:
            yield
        finally:
            self.retaining = True

    def _wrap_abort(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def abort_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
            targets = list(self.by_group.values()) if group is None else [self.by_group.get(id(group))]
            for comm in targets:
                if comm is not None:
                    comm.abort_flag = True
            return fn(group, *args, **kwargs)

        return abort_process_group


def _gloo_groups(group: Any) -> list[Any]:
    """The gloo process groups ``destroy_process_group(group)`` destroys (every one for None)."""
    try:
        world = c10d._world.pg_map
        doomed = list(world) if group is None else [group]
        return [pg for pg in doomed if "gloo" in str(world.get(pg, ("",))[0]).lower()]
    except Exception:  # noqa: BLE001 - never raise into training: without it, torch's behaviour
        return []


def _seq_of(read_seq: Callable[[], int] | None) -> int:
    """The group's sequence number, or -1 (no reader, or an aborted group that cannot tell)."""
    if read_seq is None:
        return -1
    try:
        return int(read_seq())
    except Exception:  # noqa: BLE001 - never raise into training
        return -1


def _consumed(comm: LocalComm, before: int, read_seq: Callable[[], int]) -> None:
    """After a hooked call: the sequence ids it consumed are the hooks' (one per collective torch launched for
    it; two for ``all_gather_object``, none for an NCCL send)."""
    after = _seq_of(read_seq)
    if after > before:
        comm.hooked_seqs.extend(range(before + 1, after + 1))
        comm.hooked_seq += after - before
    comm.hooked_from = -1


def _on_completion(work: Any, comm: LocalComm, op: int) -> None:
    try:
        future = work.get_future()
    except RuntimeError:
        comm.complete(op, monotonic())  # a backend without futures: count it as done when launched
        return

    def done(f: Any) -> None:
        comm.complete(op, monotonic())
        try:
            f.value()
        except Exception as e:  # noqa: BLE001 - recorded, the caller sees it from wait()
            comm.async_error = REMOTE_ERROR if isinstance(e, dist.DistError) else SYSTEM_ERROR

    future.add_done_callback(done)


def _hash(*parts: object) -> int:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    text = "|".join(str(p) for p in (attempt, *parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _device_of(pg: Any) -> int:
    try:
        if "nccl" in str(dist.get_backend(pg)).lower() and torch.cuda.is_available():
            return torch.cuda.current_device()
    except (RuntimeError, ValueError):
        pass
    return -1


def _start_mesh(hooks: TorchHooks) -> None:
    try:
        store = c10d._get_default_store()
    except (RuntimeError, ValueError) as e:
        log.warning("rasd: no default store to bootstrap the mesh from (%s); RAS node not started", e)
        return
    device = _device_of(c10d._get_default_group())
    start_node(hooks, store, rank=dist.get_rank(), devices=() if device < 0 else (device,))


def start_node(
    hooks: TorchHooks, store: Any, *, rank: int, devices: tuple[int, ...] = (), prefix: str | None = None
) -> RasHandle | None:
    """Start this process's RAS node (once) from ``store``, reporting the communicators that ``hooks`` count and
    serving the client port. Returns the running node's handle, or None when rasd is off or cannot start (it
    never raises: rasd.start logs why)."""
    from rasd.services import client_port

    serve = functools.partial(client_port.serve, counting=hooks.records.describe)
    poll = functools.partial(_poll_records, hooks)
    return api.start(
        store, rank=rank, devices=devices, prefix=prefix, local_data=hooks.snapshot, services=[serve, poll]
    )


async def _poll_records(hooks: TorchHooks, runtime: Any) -> None:
    """A runtime service: read the groups' sequence numbers every ``POLL_EVERY`` s on the RAS thread, so that the
    idle time a report carries dates a stall to within that (rasd.torch.records.RecordCounter.poll)."""
    import asyncio

    from rasd.torch.records import POLL_EVERY

    async def poll() -> None:
        while True:
            await asyncio.sleep(POLL_EVERY)
            try:
                hooks.records.poll(monotonic())
            except Exception:  # never ends the RAS thread; the sweep's refresh still counts
                log.debug("rasd: polling the sequence numbers failed", exc_info=True)

    task = asyncio.get_running_loop().create_task(poll())
    runtime.on_stop.append(task.cancel)
