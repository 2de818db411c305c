"""Sharded training state (FSDP2, tensor parallelism, DTensor) that survives restarts in memory, with redundancy.

``TorchState`` keeps a full copy of the model and optimizer on every rank and ``sync()`` broadcasts it from one
rank: right for data parallelism, impossible for the jobs FSDP exists for (a 70B model with Adam is about a
terabyte of state). ``ShardedState`` keeps, on each rank, its own part of the last commit and copies of the parts of
``redundancy`` (k) other ranks, so a kill -9 of up to k ranks loses nothing, in about (1 + k) / N of the state per
rank; a restore reshards the commit to the world that trains on, from the ranks' memory (docs/elastic.md §9).

    def build():                       # this iteration's model and optimizer, on its process group
        model = Net()
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        return model, torch.optim.AdamW(model.parameters())

    state = ShardedState(build, step=0)  # outside the wrapped function

    @inprocess.Wrapper(...)
    def train(call_wrapper):
        dist.init_process_group(...)
        state.sync()                     # builds the model and optimizer, loads the last commit into them
        model, optimizer = state.model, state.optimizer
        ...
        state.commit()                   # collective: every rank at the same steps

Why a build function: FSDP2's ``fully_shard`` turns a module into a sharded one of one process group, which the
restart destroys, and refuses to shard it again ("fully_shard has already been applied"); a fresh module per
iteration is what torch supports. Everything that moves tensors is torch's: ``torch.distributed.checkpoint.
state_dict`` gives the sharded state dicts, ``dcp.save`` decides which rank keeps which item (``memory_storage``
holds them in memory), ``dcp.load`` reshards them to the new world; ours are only where the bytes live
(``placement``), the point-to-point copies between ranks (``exchange``), and the mapping of a blob in place by the
ranks of its machine (``shared_memory``: a restore on one machine reads the bytes it needs where they lie, as a
load from a local page cache does, instead of fetching them through sockets).

A commit cut by a fault never leaves a half-written commit: it writes into fresh buffers, stores them as the
*pending* commit (one attribute store) once this rank holds its blob and its wards' copies whole, and makes them the
committed one (one attribute store) after one ``all_reduce`` has told every rank that every rank holds them. A
restore takes the newest version every surviving rank can assemble, never older than one any rank completed.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .. import fault_source, repeated_faults
from ..monitor_thread import RankShouldRestart
from . import caches, exchange, memory_storage, placement, shared_memory
from .disk import DiskCheckpoints
from .state import StepProgress

log = logging.getLogger(__name__)

Build = Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]]


@dataclasses.dataclass(frozen=True)
class ShardCommit:
    """One commit as this rank holds it: the blobs it keeps (its own and its wards' copies), keyed by owner rank in
    the commit's world; the DCP metadata that locates every item of every blob (the same on every rank); the plain
    values."""

    version: int
    commits: int
    world: int
    metadata: Metadata
    values: dict[str, Any]
    blobs: dict[int, shared_memory.SharedBlob]

    def held(self, committed: bool) -> placement.Held:
        return placement.Held(self.version, self.commits, self.world, frozenset(self.blobs), committed)

    @property
    def nbytes(self) -> int:
        """The memory these blobs take here: a ward's blob held by descriptor is its owner's memory."""
        return sum(blob.nbytes for blob in self.blobs.values() if not blob.adopted)

    def handles(self) -> dict[int, shared_memory.BlobHandle]:
        """How the other processes of this machine map each blob this rank holds (those in shared memory)."""
        return {owner: blob.handle for owner, blob in self.blobs.items() if blob.handle is not None}


@dataclasses.dataclass(frozen=True)
class ShardedSyncOutcome:
    """What one ``sync()`` did: where the state came from (``memory``, ``disk``, ``none``: the state as built),
    the commit count every rank now has, whether the wrapped function had restarted, the bytes this rank fetched
    from others over the network, the seconds it took (the build, the load, then the re-protection: a commit
    loaded from memory has its copies topped up, a state from disk or as built is committed in this world), the
    owners whose blobs were lost, and the bytes it read in place from other processes' blobs on its machine."""

    source: str
    commits: int
    restarted: bool
    fetched_bytes: int
    build_s: float
    load_s: float
    commit_s: float
    missing: tuple[int, ...] = ()
    mapped_bytes: int = 0


class ShardedState(StepProgress):
    """Training state whose model and optimizer are rebuilt each iteration by ``build`` and kept in memory,
    sharded with ``redundancy`` copies; plain values (``step=0``) are attributes, committed with it.

    ``checkpoint_dir`` with ``checkpoint_every=M``: every M-th commit is also saved to disk with
    ``torch.distributed.checkpoint`` (``disk``), which a restore loads when more ranks died than the memory
    survives. ``group``: the process group of the state (default: the default group); it must carry CPU tensors
    (gloo). ``exchange_timeout``: the deadline of each point-to-point exchange."""

    def __init__(
        self,
        build: Build,
        *,
        redundancy: int = 1,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_every: int = 1,
        exchange_timeout: float = 300.0,
        group: Any = None,
        **values: Any,
    ) -> None:
        for name in values:
            if name.startswith("_") or name in dir(type(self)):
                raise ValueError(f"{name!r} cannot be a state value: it starts with '_' or names an attribute")
        repeated_faults.state_created()  # a training that keeps a state says when it progresses
        if redundancy < 0:
            raise ValueError("redundancy must be 0 or more")
        object.__setattr__(self, "_loading", False)
        self._build = build
        self._redundancy = redundancy
        self._disk = DiskCheckpoints(checkpoint_dir, checkpoint_every) if checkpoint_dir is not None else None
        self._timeout = exchange_timeout
        self._group = group
        self._names = tuple(values)
        self._initial = copy.deepcopy(values)
        self._reset_callbacks: list[Callable[[], Any]] = []
        # (committed, pending): replaced as a whole by one attribute store, never edited in place.
        self._slots: tuple[ShardCommit | None, ShardCommit | None] = (None, None)
        self._seen: tuple[int, int] | None = None
        self._next_version = 0
        self._hosts: list[str] = []
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.last_sync: ShardedSyncOutcome | None = None
        for name, value in values.items():
            setattr(self, name, value)

    # ---- the API ----------------------------------------------------------------------------------------------

    @property
    def commits(self) -> int:
        committed = self._slots[0]
        return committed.commits if committed is not None else 0

    def memory_bytes(self) -> int:
        """Bytes of memory the committed blobs this rank holds take: its own blob and the copies of its wards' it
        received; a ward's blob it holds by descriptor (the ward on its machine) is counted once, by the ward."""
        committed = self._slots[0]
        return committed.nbytes if committed is not None else 0

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Callbacks run, in order, after every restart once the state is synced."""
        self._reset_callbacks.extend(callbacks)

    def sync(self) -> ShardedSyncOutcome:
        """Build this iteration's model and optimizer (``state.model``, ``state.optimizer``) and load into them
        the newest commit the ranks can assemble, resharded to this world: from the ranks' memory, else from the
        disk checkpoint, else the state as built (the first iteration of a job). Then protect it again: a commit
        loaded from memory is kept as it is, its blobs copied (or, on one machine, held by descriptor) until each is
        held by k + 1 ranks of this world again; a state from disk or as built is committed in this world (blobs
        and guards), without counting a commit. Collective: every rank calls it right after ``init_process_group``."""
        call = fault_source.active_call()
        key = (id(call), call.iteration) if call is not None else (0, 0)
        restarted = self._seen is not None and self._seen != key
        self._register(call)
        started = time.monotonic()
        self.model = self.optimizer = None  # the earlier iteration's hold its destroyed process group
        caches.forget_dtensor_caches()
        model, optimizer = self._build()
        state_dict = _state_dict(model, optimizer)
        built = time.monotonic()
        group = self._group
        world = dist.get_world_size(group)
        offers: list[Any] = [None] * world
        dist.all_gather_object(offers, self._offer(), group=group)
        self._hosts = [offer["host"] for offer in offers]
        choice = placement.choose([offer["held"] for offer in offers], [offer["disk"] for offer in offers])
        fetched = mapped = 0
        metadata: Metadata | None = None
        values = copy.deepcopy(self._initial)
        if choice.source == "memory":
            fetched, mapped, metadata = self._load_from_memory(state_dict, choice, offers)
            values = next(o["values"][choice.version] for o in offers if choice.version in o["values"])
        elif choice.source == "disk":
            assert self._disk is not None and choice.disk_commits is not None
            log.warning(
                "the memory lost the blobs of rank(s) %s of the last commit (more than %d rank(s) died): loading "
                "checkpoint %s from disk",
                list(choice.missing),
                self._redundancy,
                self._disk.path(choice.disk_commits),
            )
            state_dict["values"] = values
            self._disk.load(state_dict, choice.disk_commits, group)
            values = state_dict.pop("values")
        elif choice.missing:
            log.error(
                "the state is lost: the memory lost the blobs of rank(s) %s of the last commit and there is no disk "
                "checkpoint (ShardedState(checkpoint_dir=...)); training goes on from the state as built",
                list(choice.missing),
            )
        if choice.source != "none":
            set_state_dict(model, optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optim"])
        self._apply_values(values)
        self.model, self.optimizer = model, optimizer
        loaded = time.monotonic()
        newest = max((held.version for offer in offers for held in offer["held"]), default=-1)
        self._next_version = max(newest, choice.version) + 1  # above any version a rank may still hold
        if metadata is not None:
            self._keep(choice, offers, metadata, values)
        else:
            self._commit_now(self._next_version, choice.commits)
        if choice.source == "memory" and choice.commits:
            repeated_faults.report_progress("commit", choice.commits, counts=False)
        if restarted:
            for callback in self._reset_callbacks:
                callback()
        self._seen = key
        outcome = ShardedSyncOutcome(
            choice.source,
            choice.commits,
            restarted,
            fetched,
            built - started,
            loaded - built,
            time.monotonic() - loaded,
            choice.missing,
            mapped,
        )
        self.last_sync = outcome
        log.info("sync: %s", outcome)
        return outcome

    def commit(self) -> None:
        """Commit the live state: each rank's part into fresh host memory, copies to its guards; every
        ``checkpoint_every``-th commit also to disk. Collective: every rank commits at the same steps."""
        call = fault_source.active_call()
        self._register(call)
        if self.model is None or self.optimizer is None:
            raise RuntimeError("ShardedState.commit() before sync(): call state.sync() after init_process_group")
        committed = self._slots[0]
        version = max(committed.version + 1 if committed is not None else 0, self._next_version)
        self._commit_now(version, self.commits + 1)
        if self._disk is not None and self._disk.due(self.commits):
            state_dict = _state_dict(self.model, self.optimizer)
            state_dict["values"] = self._values()
            self._disk.save(state_dict, self.commits, self._group)
        repeated_faults.report_progress("commit", self.commits)
        joining = getattr(call, "joining", None)
        rank = getattr(getattr(call, "state", None), "rank", None)
        if joining is not None and call is not None:  # Horovod's host-update check (docs/elastic.md section 5)
            reason = joining.check_waiting(rank, call.iteration, self.commits)
            if reason is not None:
                raise RankShouldRestart(reason)

    # ---- commit and load --------------------------------------------------------------------------------------

    def _commit_now(self, version: int, commits: int) -> None:
        assert self.model is not None and self.optimizer is not None
        group = self._group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        writer = memory_storage.BlobWriter(rank)
        metadata = dcp.save(_state_dict(self.model, self.optimizer), storage_writer=writer, process_group=group)
        blob = writer.blob
        hosts = self._hosts if len(self._hosts) == world else [""] * world
        copies = _guard(
            blob, rank, placement.guards(rank, hosts, self._redundancy), hosts, self._redundancy, self._timeout, group
        )
        commit = ShardCommit(version, commits, world, metadata, self._values(), {rank: blob, **copies})
        committed = self._slots[0]
        self._slots = (committed, commit)  # whole on this rank
        done = torch.ones(1, dtype=torch.int64)
        dist.all_reduce(done, group=group)  # whole on every rank
        self._slots = (commit, None)

    def _keep(self, choice: placement.Choice, offers: list[Any], metadata: Metadata, values: dict[str, Any]) -> None:
        """Keep the commit a restore loaded from memory as this world's committed state, and top up its copies:
        each blob whose holders died is taken by new ranks (``placement.top_up``) until k + 1 ranks hold it again;
        on one machine a new holder adopts the blob's descriptor from a holder beside it, else a holder sends it a
        copy. Cheaper than committing the state again (no ``dcp.save``, and on one machine no byte moves); the
        next ``commit()`` writes the new world's layout. Collective."""
        group = self._group
        rank = dist.get_rank(group)
        mine = self._holding(choice.version)
        blobs = dict(mine.blobs) if mine is not None else {}
        added = placement.top_up(choice.holders, self._hosts, self._redundancy)
        machines = [offer["machine"] for offer in offers]

        def beside(owner: int, taker: int) -> shared_memory.BlobHandle | None:
            """A handle of ``owner``'s blob held on ``taker``'s machine (the same on every rank), or None."""
            for holder in choice.holders[owner]:
                handle = offers[holder]["handles"].get(choice.version, {}).get(owner)
                if handle is not None and machines[holder] == machines[taker]:
                    return handle
            return None

        taking = {owner: beside(owner, rank) for owner, takers in added.items() if rank in takers}
        adopted, in_place = _adopt_all(taking, group)
        for owner in sorted(added):  # the copies that move by network, one exchange per blob (the same on all ranks)
            keepers = choice.holders[owner]
            by_network = [t for t in added[owner] if not in_place or beside(owner, t) is None]
            sends = {t: blobs[owner].tensor for t in by_network if placement.serving_rank(owner, t, keepers) == rank}
            received: dict[int, shared_memory.SharedBlob] = {}
            if rank in by_network:
                sender = placement.serving_rank(owner, rank, keepers)
                received[sender] = shared_memory.SharedBlob(offers[sender]["sizes"][choice.version][owner])
            exchange.swap(
                sends,
                {sender: blob.nbytes for sender, blob in received.items()},
                self._timeout,
                group,
                into={sender: blob.writable() for sender, blob in received.items()},
            )
            for blob in received.values():
                blob.seal()
                adopted[owner] = blob
        blobs.update({owner: blob for owner, blob in adopted.items() if blob is not None})
        kept = ShardCommit(choice.version, choice.commits, choice.world, metadata, copy.deepcopy(values), blobs)
        self._slots = (kept, None)

    def _load_from_memory(
        self, state_dict: dict[str, Any], choice: placement.Choice, offers: list[Any]
    ) -> tuple[int, int, Metadata]:
        """Gather the parts of the chosen commit's blobs that this rank's new shards overlap, then ``dcp.load``
        them (DCP reshards): its own blobs' in place, those another process of this machine holds mapped in place,
        the others fetched from the ranks that hold them. Returns the bytes fetched, the bytes mapped, and the commit's
        metadata."""
        group = self._group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        mine = self._holding(choice.version)
        holders = [r for r, offer in enumerate(offers) if choice.version in offer["values"]]
        metadata: Metadata | None
        if len(holders) == world:  # the same answer on every rank (the offers are gathered): a collective's branch
            assert mine is not None, "this rank offered the chosen commit"
            metadata = mine.metadata  # every rank has the commit's metadata (dcp.save returns it to all of them)
        else:  # a newcomer, or a rank that lost the commit: the metadata comes from the first rank that holds it
            header = [mine.metadata if mine is not None and rank == holders[0] else None]
            dist.broadcast_object_list(header, src=_global(group, holders[0]), group=group)
            metadata = header[0]
        assert isinstance(metadata, Metadata), "the source rank holds the chosen commit"
        planner = DefaultLoadPlanner()
        planner.set_up_planner(state_dict, metadata, rank == 0)
        locations = memory_storage.needed(planner.create_local_plan(), metadata)
        items: dict[tuple[int, int], torch.Tensor] = {}
        asks: dict[int, list[tuple[int, int, int]]] = {}
        mapped = _Mapped(offers, choice.version)
        mapped_bytes = 0
        for location in locations:
            keepers = choice.holders[location.owner]
            if mine is not None and rank in keepers:
                blob: torch.Tensor | None = mine.blobs[location.owner].tensor
            else:
                blob = mapped.blob(location.owner, keepers)
                mapped_bytes += location.size if blob is not None else 0
            if blob is not None:
                items[(location.owner, location.offset)] = blob[location.offset : location.offset + location.size]
            else:
                server = placement.serving_rank(location.owner, rank, keepers)
                asks.setdefault(server, []).append((location.owner, location.offset, location.size))
        everyone: list[Any] = [{}] * world
        asking = torch.tensor([len(asks)], dtype=torch.int64)
        dist.all_reduce(asking, group=group)
        if int(asking):  # on one machine nobody asks (every blob is mapped): no gather of the asks
            dist.all_gather_object(everyone, asks, group=group)
        sends = {}
        for requester, their_asks in enumerate(everyone):
            wanted = their_asks.get(rank, [])
            if requester != rank and wanted:
                assert mine is not None
                sends[requester] = _pack(mine, wanted)
        receives = {server: placement.layout([size for _, _, size in wanted])[1] for server, wanted in asks.items()}
        received = exchange.swap(sends, receives, self._timeout, group)
        for server, wanted in asks.items():
            offsets, _ = placement.layout([size for _, _, size in wanted])
            for (owner, offset, size), at in zip(wanted, offsets, strict=True):
                items[(owner, offset)] = received[server][at : at + size]
        # Every byte this rank reads is here now, and torch's default load plan needs no global step ("no global
        # coordination", create_default_global_load_plan): no_dist spares DCP's gather and scatter of the plans.
        dcp.load(state_dict, storage_reader=memory_storage.BlobReader(metadata, items), no_dist=True)
        return sum(receives.values()), mapped_bytes, metadata

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _holding(self, version: int) -> ShardCommit | None:
        return next((commit for commit in self._slots if commit is not None and commit.version == version), None)

    def _offer(self) -> dict[str, Any]:
        committed, pending = self._slots
        held = [commit.held(commit is committed) for commit in (committed, pending) if commit is not None]
        values = {commit.version: commit.values for commit in (committed, pending) if commit is not None}
        handles = {commit.version: commit.handles() for commit in (committed, pending) if commit is not None}
        sizes = {
            commit.version: {owner: blob.nbytes for owner, blob in commit.blobs.items()}
            for commit in (committed, pending)
            if commit is not None
        }
        disk = self._disk.latest() if self._disk is not None else None
        host = os.environ.get("INPROCESS_HOST") or socket.gethostname()
        machine = shared_memory.machine()
        return {
            "held": held,
            "values": values,
            "disk": disk,
            "host": host,
            "machine": machine,
            "handles": handles,
            "sizes": sizes,
        }

    def _values(self) -> dict[str, Any]:
        return copy.deepcopy({name: getattr(self, name) for name in self._names})

    def _apply_values(self, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_loading", True)
        try:
            for name in self._names:
                setattr(self, name, copy.deepcopy(values[name]))
        finally:
            object.__setattr__(self, "_loading", False)

    def _register(self, call: Any | None) -> None:
        hooks = getattr(call, "restart_hooks", None)
        if hooks is not None and self._on_restart not in hooks:
            hooks.append(self._on_restart)

    def _on_restart(self) -> None:
        """At each restart (the Wrapper, outside the wrapped function): let go of the iteration's model and
        optimizer, which hold its process group; the commits stay."""
        self.model = self.optimizer = None


def _state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """torch's sharded state dicts of the model and optimizer (DTensors stay DTensors: each rank its shards)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _guard(
    blob: shared_memory.SharedBlob, rank: int, guards: list[int], hosts: list[str], k: int, timeout: float, group: Any
) -> dict[int, shared_memory.SharedBlob]:
    """Hand this rank's sealed ``blob`` to its ``guards`` and take its wards' blobs: a guard on the owner's machine
    keeps a descriptor of the owner's blob (``_adopt_all``), a guard elsewhere receives a copy. Collective. Returns
    the wards' blobs."""
    world = dist.get_world_size(group)
    wards = placement.guarded_by(rank, hosts, k)
    where: list[Any] = [None] * world
    dist.all_gather_object(where, (shared_memory.machine(), blob.handle, blob.nbytes), group=group)

    def beside(owner: int, guard: int) -> bool:  # the same answer on both sides of the pair
        return where[owner][1] is not None and where[owner][0] == where[guard][0]

    adopted, in_place = _adopt_all({ward: where[ward][1] if beside(ward, rank) else None for ward in wards}, group)
    received = {ward: shared_memory.SharedBlob(where[ward][2]) for ward in wards if adopted[ward] is None}
    exchange.swap(
        {guard: blob.tensor for guard in guards if not in_place or not beside(rank, guard)},
        {ward: held.nbytes for ward, held in received.items()},
        timeout,
        group,
        into={ward: held.writable() for ward, held in received.items()},
    )
    for held in received.values():
        held.seal()
    return {ward: received.get(ward) or adopted[ward] for ward in wards}  # type: ignore[misc]


def _adopt_all(
    wanted: dict[int, shared_memory.BlobHandle | None], group: Any
) -> tuple[dict[int, shared_memory.SharedBlob | None], bool]:
    """Adopt the blobs of this machine this rank should hold (owner: handle; None: it gets a copy by network), and
    agree with every rank whether all of them could (one ``all_reduce``). Where some rank could not (no /proc
    access), nobody keeps what it adopted: every copy then moves by network, a rule each rank computes alike.
    Collective. Returns the adopted blobs (None where a copy is to come) and whether adoption held everywhere."""
    adopted = {owner: shared_memory.SharedBlob.adopt(h) if h is not None else None for owner, h in wanted.items()}
    failed = torch.tensor([sum(h is not None and adopted[o] is None for o, h in wanted.items())], dtype=torch.int64)
    dist.all_reduce(failed, group=group)
    if int(failed):
        shared_memory.warn_once("a rank could not hold a blob of its machine in place: the copies move by network")
        return dict.fromkeys(wanted), False
    return adopted, True


class _Mapped:
    """The blobs of the chosen commit that other processes of this machine hold, mapped in place as a restore
    asks for them (each at most once): from the first holder on this machine whose blob opens; None where no
    holder is on this machine or none opens (then it is fetched by network)."""

    def __init__(self, offers: list[Any], version: int) -> None:
        self._offers = offers
        self._version = version
        self._machine = shared_memory.machine()
        self._opened: dict[int, torch.Tensor | None] = {}

    def blob(self, owner: int, holders: tuple[int, ...]) -> torch.Tensor | None:
        if owner not in self._opened:
            self._opened[owner] = None
            for holder in holders:
                offer = self._offers[holder]
                handle = offer.get("handles", {}).get(self._version, {}).get(owner)
                if offer.get("machine") != self._machine or handle is None:
                    continue
                self._opened[owner] = shared_memory.open_blob(handle)
                if self._opened[owner] is not None:
                    break
                shared_memory.warn_once(
                    "could not map a blob of this machine in place: a restore fetches it by network"
                )
        return self._opened[owner]


def _pack(commit: ShardCommit, wanted: list[tuple[int, int, int]]) -> torch.Tensor:
    """The items ``wanted`` (owner, offset, size) of ``commit``'s blobs, laid out as ``placement.layout``."""
    offsets, total = placement.layout([size for _, _, size in wanted])
    message = torch.empty(total, dtype=torch.uint8)
    for (owner, offset, size), at in zip(wanted, offsets, strict=True):
        message[at : at + size].copy_(commit.blobs[owner].tensor[offset : offset + size])
    return message


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
