"""Counting from torch's own records: every collective a process group performs, whoever issues it.

The hooks (``rasd.torch.hooks``) see only the collectives that pass through ``torch.distributed``'s Python
functions. DDP's gradient buckets and its start-up broadcasts, functional collectives (DTensor, tensor parallelism,
compiled code) are issued by torch's C++ and never pass there. torch keeps two records of its own for every
backend (torch 2.13; docs/operations.md, "What is counted"):

- ``ProcessGroup._get_sequence_number_for_group()``: how many collectives the group has launched, whoever issued
  them (about 0.3 us a read). On gloo point-to-point calls advance it too; on NCCL they do not.
- the Flight Recorder (``TORCH_FR_BUFFER_SIZE``, on by default in 2.13 with 2,000 entries): one entry per
  collective with its group, its per-group sequence id, its op (``gloo:all_reduce``) and, on gloo, whether it has
  finished (``retired``), on NCCL its state (``scheduled``, ``started``, ``completed``). Point-to-point calls
  are not recorded on gloo.

Which Flight Recorder (``recorder_of``). gloo and the legacy NCCL backend write into the *native* recorder, which
``_dump_fr_trace_json()`` reads. torch 2.15's generic, hook-based recorder serves the backends that do not record
natively (``nccl2``, its default NCCL backend, among them): torch attaches a ``FlightRecorderHook`` to each of their
groups at creation (``_world.pg_flight_recorder_hooks``), every such backend writes into a recorder of its own,
read with ``_dump_fr_trace_json(backend=<name>)``, and its entries are named ``<backend>:<op>``
(``nccl2:all_reduce``) and finish as the native ones do (``retired``, ``state`` ``completed``). Found by feature
detection, never by version: a group with a hook is read from its backend's recorder, any other from the native
one; a torch whose dump takes no ``backend`` (2.13, 2.14) has no hook-based recorder. ``describe`` says which
recorders are read (the report's version lines); docs/operations.md has the table by torch version and backend.

Per communicator the count is split into what the hooks counted and what happened beneath them::

    launched[op] = hooks' launched[op] + beneath[op]
    beneath total = group sequence number - sequence numbers consumed inside hooked calls

The sequence number makes the total exact and cheap. The op type and the completion of the collectives beneath come
from the Flight Recorder, whose dump costs about 15 us per entry of its ring *with the GIL held* (30 ms for 2,000
entries, measured in bench/overhead.py), so it is read rarely: at the first snapshot after each group's first
collectives beneath (a restart's new groups included), then at most once per ``FR_READ_EVERY`` (30) seconds, and at
once when a communicator has gone quiet with collectives beneath not yet read or not yet completed (a stall:
exactly when the op type matters). Until an entry is read, its collective counts under the op type of the last one
read on that communicator, as launched and not completed. An entry that fell out of the ring before it was read
counts under the type of the next one read after it. Collectives whose type the records never tell (the Flight
Recorder off, or an op it names in a way we do not know) count as ``Other``. These estimates never change a total,
and both the stuck detector (``rasd.core.stuck``) and the report's MISMATCH (``rasd.report.model``) judge totals
first, so an estimate that differs between ranks can never raise a verdict or a MISMATCH.

Owned by the RAS thread: ``refresh`` is called before every snapshot. The hooks only append to
``LocalComm.hooked_seqs`` and advance ``LocalComm.hooked_seq`` (training thread).
"""

from __future__ import annotations

import json
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rasd.core.comms import OP_TYPES
from rasd.core.registry import LocalComm

log = logging.getLogger("rasd")

#: Seconds between two reads of every group's sequence number by the RAS thread (``RecordCounter.poll``).
POLL_EVERY = 0.5
#: Seconds between two Flight Recorder reads while collectives beneath the hooks keep moving: a read holds the GIL
#: about 30 ms with a full ring (bench/overhead.py), 0.1 % of this interval. Until then the split by op type is an
#: estimate; the totals never are.
FR_READ_EVERY = 30.0
OTHER = OP_TYPES.index("Other")

#: The Flight Recorder's op names, reduced by ``_op_key`` (backend prefix, underscores and variant suffixes
#: dropped), to our op types. gloo implements ``reduce_scatter`` as an all-reduce and records it as one.
_FR_OPS: dict[str, int] = {
    "allreduce": OP_TYPES.index("AllReduce"),
    "broadcast": OP_TYPES.index("Broadcast"),
    "reduce": OP_TYPES.index("Reduce"),
    "allgather": OP_TYPES.index("AllGather"),
    "reducescatter": OP_TYPES.index("ReduceScatter"),
    "alltoall": OP_TYPES.index("AllToAll"),
    "gather": OP_TYPES.index("Gather"),
    "scatter": OP_TYPES.index("Scatter"),
    "barrier": OP_TYPES.index("Barrier"),
}
_SUFFIXES = ("intotensorcoalesced", "tensorcoalesced", "coalesced", "intotensor", "tensor", "single", "base")


def _op_key(profiling_name: str) -> str:
    name = profiling_name.split(":", 1)[-1].strip().split(" ", 1)[0].replace("_", "").lower()
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name != suffix:
            name = name[: -len(suffix)]
            break
    return name


def op_of(profiling_name: str) -> int:
    """Our op type for a Flight Recorder entry's ``profiling_name`` (``gloo:all_reduce`` -> AllReduce)."""
    return _FR_OPS.get(_op_key(profiling_name), OTHER)


def flight_recorder_on() -> bool:
    """Does this torch keep a Flight Recorder that we can read? (``TORCH_FR_BUFFER_SIZE=0`` turns it off.)"""
    try:
        import torch

    except ImportError:
        return False
    if getattr(torch._C._distributed_c10d, "_dump_fr_trace_json", None) is None:  # torch < 2.6
        return False
    size = os.environ.get("TORCH_FR_BUFFER_SIZE", os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", ""))
    try:
        return not size.strip() or int(size) > 0
    except ValueError:
        return True


@dataclass
class _Group:
    """One counted process group: what the records have told of it so far."""

    pg: weakref.ReferenceType[Any]
    comm: LocalComm
    name: str  # the group's name in the Flight Recorder (``ProcessGroup.group_name``)
    created_ns: int  # wall clock just before torch created it: older Flight Recorder entries of that name are not it
    seq_read: Any  # the bound ``_get_sequence_number_for_group``
    seq: int = 0  # the group's sequence number at the last refresh
    fr_seq: int = 0  # the highest collective sequence id read from the Flight Recorder
    last_op: int = OTHER  # the op type of the last collective beneath the hooks that was read
    pending: dict[int, int] = field(default_factory=dict)  # sequence id -> op type: read, not seen finished
    #: The Flight Recorder its collectives are written to: None for the native one, else the backend whose
    #: hook-based recorder holds them (``recorder_of``), found at each read.
    recorder: str | None = None
    quiet_since_read: bool = False
    polled_seq: int = -1  # the sequence number at the last ``poll``
    read: bool = False  # the Flight Recorder has been read since this group began


def _settled_seq(group: _Group) -> int:
    """The group's sequence number, less the ids a hooked call in flight may be consuming right now."""
    inflight = group.comm.hooked_from
    return group.seq if inflight < 0 else min(group.seq, inflight)


def _beneath_unread(group: _Group) -> int:
    """Collectives beneath the hooks that the Flight Recorder has not told of yet."""
    comm = group.comm
    beneath_total = max(0, _settled_seq(group) - comm.hooked_seq)
    return max(0, beneath_total - sum(comm.beneath_launched))


class RecordCounter:
    """Adds to each registered communicator the collectives that torch's records show beneath the hooks."""

    def __init__(
        self,
        flight_recorder: bool | None = None,
        dump: Callable[[str | None], bytes | str] | None = None,
        recorder_of: Callable[[Any], str | None] | None = None,
    ) -> None:
        """``dump(recorder)`` returns a Flight Recorder's JSON: the native one for None, else that backend's
        hook-based one (default: torch's ``_dump_fr_trace_json``); ``recorder_of(pg)`` says which a group writes to
        (default: torch's hooks, ``recorder_of``)."""
        self.flight_recorder = flight_recorder_on() if flight_recorder is None else flight_recorder
        self.dump = dump or _dump_flight_recorder
        self.recorder_of = recorder_of or _recorder_of
        #: The recorders found so far: None (the native one) and backend names; those that could not be read.
        self.recorders: set[str | None] = set()
        self.unreadable: set[str | None] = set()
        self.groups: dict[int, _Group] = {}  # id(LocalComm) -> the group
        self.last_read = -1e18
        self.reads = 0  # Flight Recorder dumps taken (bench/overhead.py reports them)
        self.read_seconds = 0.0
        self.failed = False

    def describe(self) -> str:
        """The counting in force, for the report's runtime line: which records are read."""
        if self.failed:
            return "Collectives counted by the Python hooks only (this torch keeps no process-group records)"
        if not self.flight_recorder:
            source = "sequence numbers only"
        else:
            read = sorted(r for r in self.recorders - self.unreadable if r is not None)
            hooked = "".join(f", {name}'s hook-based Flight Recorder" for name in read)
            source = f"sequence numbers, native Flight Recorder{hooked}"
        return f"Collectives counted from process-group records ({source}) and Python hooks"

    def dump_every(self) -> str:
        """Every recorder the groups write to, as one dump (its ``entries`` one after the other), for the verdict
        journal; a recorder that cannot be read is left out."""
        entries: list[Any] = []
        recorders = {None} | {g.recorder for g in self.groups.values()} | self.recorders
        for recorder in sorted(recorders - self.unreadable, key=lambda r: r or ""):
            try:
                entries += json.loads(self.dump(recorder)).get("entries", [])
            except Exception:  # noqa: BLE001 - left out, as _read leaves it
                continue
        return json.dumps({"entries": entries})

    def add(self, pg: Any, comm: LocalComm, created_ns: int) -> None:
        """Count ``pg``'s collectives into ``comm`` from now on (training thread, right after torch made it)."""
        try:
            seq_read = pg._get_sequence_number_for_group
            seq = int(seq_read())
            name = str(pg.group_name)
        except Exception as e:  # noqa: BLE001 - a torch without these records: the hooks alone count
            if not self.failed:
                log.info("rasd: this torch has no process-group sequence numbers (%s); counting by hooks only", e)
            self.failed = True
            return
        comm.hooked_seq = seq  # whatever it did before we knew it (a barrier in init) is not beneath the hooks
        self.groups[id(comm)] = _Group(weakref.ref(pg), comm, name, created_ns, seq_read, seq=seq, fr_seq=seq)

    def remove(self, comm: LocalComm) -> None:
        self.groups.pop(id(comm), None)

    # ------------------------------------------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        """Date the last move of each group to within ``POLL_EVERY``: read its sequence number (about 0.3 us) and
        mark the communicator changed when it moved. The RAS thread calls this every ``POLL_EVERY`` seconds; a
        COMM_STUCK verdict then falls due at the stuck limit after the last collective, not a sweep later."""
        for group in list(self.groups.values()):
            try:
                seq = int(group.seq_read())
            except Exception:  # noqa: BLE001 - a destroyed or aborted group
                continue
            if seq != group.polled_seq:
                group.polled_seq = seq
                group.comm.last_change = now

    def refresh(self, now: float) -> None:
        """Bring every communicator's counts beneath the hooks up to date (RAS thread, before a snapshot)."""
        want_read = False
        quiet: list[_Group] = []
        for key, group in list(self.groups.items()):
            if group.pg() is None:
                del self.groups[key]
                continue
            try:
                seq = int(group.seq_read())
            except Exception:  # noqa: BLE001 - a destroyed or aborted group: keep its last counts
                continue
            if seq != group.polled_seq:  # a move that ``poll`` has not dated already
                group.polled_seq = seq
                group.comm.last_change = now
            if seq != group.seq:
                group.seq = seq
                group.quiet_since_read = False
                moved = True
            else:
                quiet.append(group)
                moved = False
            waiting = _beneath_unread(group) > 0 or bool(group.pending)
            if waiting and (now - self.last_read >= FR_READ_EVERY or not group.read):
                want_read = True  # the periodic read, and a new group's first (a restart's groups: at once)
            if waiting and not moved and not group.quiet_since_read:
                want_read = True  # a communicator gone quiet: tell exactly what it waits in, once
        if want_read and self.flight_recorder:
            self._read(now)
            for group in quiet:
                group.quiet_since_read = True
        for group in self.groups.values():
            group.comm.beneath_unread = _beneath_unread(group)
            group.comm.beneath_unread_op = group.last_op
            group.comm.beneath_unread_completed = not self.flight_recorder  # nothing will ever say otherwise

    def _read(self, now: float) -> None:
        """Read every recorder the groups write to (the native one, and each hook-based one: ``recorder_of``)."""
        started = time.perf_counter()
        for group in self.groups.values():
            pg = group.pg()
            if pg is not None:
                group.recorder = self.recorder_of(pg)
        entries_of: dict[str | None, dict[str, list[dict[str, Any]]]] = {}
        try:
            for recorder in {group.recorder for group in self.groups.values()} - self.unreadable:
                self.recorders.add(recorder)
                try:
                    entries = json.loads(self.dump(recorder)).get("entries", [])
                except Exception as e:  # noqa: BLE001 - no usable recorder: its groups' types stay estimates
                    which = "the Flight Recorder" if recorder is None else f"{recorder}'s hook-based Flight Recorder"
                    log.info("rasd: %s cannot be read (%s); op types beneath the hooks count as Other", which, e)
                    self.unreadable.add(recorder)
                    continue
                by_name = entries_of.setdefault(recorder, {})
                for entry in entries:
                    if entry.get("is_p2p"):
                        continue  # point-to-point calls are counted by the hooks (gloo does not record them)
                    group_name = entry.get("process_group", ["", ""])[0]
                    by_name.setdefault(str(group_name), []).append(entry)
        finally:
            self.read_seconds += time.perf_counter() - started
        if None in self.unreadable and not entries_of:
            self.flight_recorder = False  # nothing readable: as before there was a recorder to read
            return
        self.reads += 1
        self.last_read = now
        for group in self.groups.values():
            if group.recorder in entries_of:
                self._take(group, entries_of[group.recorder].get(group.name, []))
                group.read = True

    def _take(self, group: _Group, entries: list[dict[str, Any]]) -> None:
        comm = group.comm
        mine = [e for e in entries if int(e.get("time_created_ns", 0)) >= group.created_ns]
        by_seq = {int(e["collective_seq_id"]): e for e in mine if int(e.get("collective_seq_id", 0)) > 0}
        finished_upto = max((s for s, e in by_seq.items() if _finished(e)), default=0)
        # Collectives read before and not seen finished: finished now, or fallen out of the ring (surely
        # finished: a ring's worth of newer collectives came after), or older than one that finished.
        for seq_id, op in list(group.pending.items()):
            entry = by_seq.get(seq_id)
            if entry is None or _finished(entry) or seq_id < finished_upto:
                comm.beneath_completed[op] += 1
                del group.pending[seq_id]
        settled = _settled_seq(group)
        if settled <= group.fr_seq:
            return
        hooked = set(comm.hooked_seqs)
        lost = 0  # beneath the hooks, fallen out of the ring unread: counted with the next one read
        for seq_id in range(group.fr_seq + 1, settled + 1):
            if seq_id in hooked:
                continue
            entry = by_seq.get(seq_id)
            if entry is None:
                lost += 1
                continue
            op = op_of(str(entry.get("profiling_name", "")))
            comm.beneath_launched[op] += 1 + lost
            comm.beneath_completed[op] += lost
            lost = 0
            if _finished(entry) or seq_id < finished_upto:
                comm.beneath_completed[op] += 1
            else:
                group.pending[seq_id] = op
            group.last_op = op
        if lost:
            comm.beneath_launched[group.last_op] += lost
            comm.beneath_completed[group.last_op] += lost
        group.fr_seq = settled


def _dump_flight_recorder(recorder: str | None = None) -> bytes:
    """A Flight Recorder's JSON: the native one, or ``recorder``'s hook-based one (torch 2.15 on: a torch whose dump
    takes no ``backend`` raises TypeError here, and that recorder counts as unreadable)."""
    import torch

    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json")  # noqa: B009 - private, untyped
    if recorder is None:
        return dump(includeCollectives=True, onlyActive=False)
    return dump(includeCollectives=True, onlyActive=False, backend=recorder)


def _recorder_of(pg: Any) -> str | None:
    """The recorder a group's collectives are written to: its backend's hook-based one when torch attached a
    ``FlightRecorderHook`` to it (torch 2.15 on: ``_world.pg_flight_recorder_hooks``), else None (the native one)."""
    try:
        import torch.distributed.distributed_c10d as c10d

        hooks = getattr(c10d._world, "pg_flight_recorder_hooks", None)
        if not hooks or pg not in hooks:
            return None
        return str(c10d.get_backend(pg))
    except Exception:  # noqa: BLE001 - a group torch no longer knows: the native recorder, as before
        return None


def _finished(entry: dict[str, Any]) -> bool:
    """gloo marks a finished collective ``retired``; NCCL's watchdog sets its state to ``completed``."""
    return bool(entry.get("retired")) or entry.get("state") == "completed"
