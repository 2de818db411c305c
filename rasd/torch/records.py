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

    def __init__(self, flight_recorder: bool | None = None, dump: Callable[[], bytes | str] | None = None) -> None:
        """``dump`` returns the Flight Recorder's JSON (default: torch's ``_dump_fr_trace_json``)."""
        self.flight_recorder = flight_recorder_on() if flight_recorder is None else flight_recorder
        self.dump = dump or _dump_flight_recorder
        self.groups: dict[int, _Group] = {}  # id(LocalComm) -> the group
        self.last_read = -1e18
        self.reads = 0  # Flight Recorder dumps taken (bench/overhead.py reports them)
        self.read_seconds = 0.0
        self.failed = False

    def describe(self) -> str:
        """The counting in force, for the report's runtime line."""
        if self.failed:
            return "Collectives counted by the Python hooks only (this torch keeps no process-group records)"
        source = "sequence numbers and Flight Recorder" if self.flight_recorder else "sequence numbers only"
        return f"Collectives counted from process-group records ({source}) and Python hooks"

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
        started = time.perf_counter()
        try:
            entries = json.loads(self.dump()).get("entries", [])
        except Exception as e:  # noqa: BLE001 - no usable Flight Recorder: types stay estimates
            log.info("rasd: the Flight Recorder cannot be read (%s); op types beneath the hooks count as Other", e)
            self.flight_recorder = False
            return
        finally:
            self.read_seconds += time.perf_counter() - started
        self.reads += 1
        self.last_read = now
        by_name: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            if entry.get("is_p2p"):
                continue  # point-to-point calls are counted by the hooks (gloo does not record them)
            group_name = entry.get("process_group", ["", ""])[0]
            by_name.setdefault(str(group_name), []).append(entry)
        for group in self.groups.values():
            self._take(group, by_name.get(group.name, []))
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


def _dump_flight_recorder() -> bytes:
    import torch

    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json")  # noqa: B009 - private, untyped
    return dump(includeCollectives=True, onlyActive=False)


def _finished(entry: dict[str, Any]) -> bool:
    """gloo marks a finished collective ``retired``; NCCL's watchdog sets its state to ``completed``."""
    return bool(entry.get("retired")) or entry.get("state") == "completed"
