"""The status report as data: every communicator of the job, merged across its processes, classified and grouped.

Theory of operation (docs/protocol.md §3, docs/architecture.md §4)
-------------------------------------------------------------------
Each responding process reports the communicators it holds ranks of. The root merges them by (hash, size): two
communicators with one hash but different sizes are a hash collision and are kept apart. A rank reported twice
is taken from the first process in process order (peer-table order, then any process the table does not know).
That merge is ``rasd.core.snapshot.merge_communicators``, the one the stuck sweeper uses too, and its
``MergedCommunicator`` is what this module classifies.

A rank nobody reported is *missing*. Its process is found through the communicator's rank map (communicator rank
-> global rank) and the peers' global ranks, and decides what the absence means::

    every process answered and none is dead  ->  NOCOMM      (the members disagree on who is a member)
    its process answered                     ->  NOCOMM      (it does not, or no longer, hold the communicator)
    its process left the job cleanly         ->  NOCOMM      (it finished and destroyed its communicators)
    its process is dead, silent or unknown   ->  INCOMPLETE  (we cannot know what that rank is doing)

Each present rank has one status (ABORT > FINALIZE > RUNNING > INIT, from its flags); the communicator's status
bits are the union, plus NOCOMM when some missing rank is NOCOMM, and it shows the highest. Its error bits:

    MISMATCH    ranks launched different numbers of operations in all, and of some op type (all 12 types are compared),
                or it has more than one status bit
    ERROR       some rank has an init or asynchronous error (any code but success 0 and in-progress 7)
    INCOMPLETE  some missing rank is INCOMPLETE

Communicators are sorted by size, nodes, highest status and errors (all descending), then by present ranks
(ascending, so the one missing most ranks comes first); a *group* is a run with equal size, nodes, status and
errors. ``#x-y`` names communicator y of group x.

The job-level lists: processes that did not answer (live, not dead, not left), dead processes, and processes that
left cleanly, read from the snapshot's dead and left sets as they are (``JobSnapshot``: disjoint, a process given as
both counts as left). The job's in-process restarts (its iteration, restart count and last restart) come from the
responders' restart records (restarts.py).

Odd input never makes the report raise (NCCL crashed on half-initialised communicators, issue #2346): a record with
size <= 0 or a rank outside [0, size) is left out, a communicator nobody holds a rank of is not listed, and a global
rank shared by several peers (a restarted process and its dead predecessor) names the liveliest of them.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rasd.core.comms import N_OPS, RESULT_IN_PROGRESS, RESULT_SUCCESS, RankRecord
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import (  # HASH_MASK: re-exported, the renderers print hashes with it
    HASH_MASK as HASH_MASK,
    JobSnapshot,
    MergedCommunicator,
    ProcessOrder,
    merge_communicators,
    process_order,
)
from rasd.core.stuck_verdict import StuckVerdict

from .ordering import addr_key, processes
from .restarts import RestartSummary, build_restart_summary
from .summary import JobSummary, build_job_summary

#: ``PresentRank.launched(ALL_OPS)``: the operations of every type, the exact total of a rank.
ALL_OPS = -1


class Status(enum.IntFlag):
    """Status bits of a communicator; the order of the values is the order of precedence."""

    NOCOMM = 1
    INIT = 2
    RUNNING = 4
    FINALIZE = 8
    ABORT = 16


class CommErrors(enum.IntFlag):
    MISMATCH = 1
    ERROR = 2
    INCOMPLETE = 4


#: How the report prints each combination of error bits.
ERRORS_TEXT: tuple[str, ...] = (
    "OK",
    "MISMATCH",
    "ERROR",
    "ERROR,MISMATCH",
    "INCOMPLETE",
    "INCOMPLETE,MISMATCH",
    "INCOMPLETE,ERROR",
    "INCOMPLETE,ERROR,MISMATCH",
)


def highest_status(bits: Status) -> Status:
    """The status a communicator shows: the highest bit set (NOCOMM when none is)."""
    return Status(1 << (int(bits).bit_length() - 1)) if bits else Status.NOCOMM


def rank_status(record: RankRecord) -> Status:
    return _status(record.abort_flag, record.finalize_called or record.destroy_flag, record.init_state)


def _status(abort: bool, finalizing: bool, init_state: int) -> Status:
    if abort:
        return Status.ABORT
    if finalizing:
        return Status.FINALIZE
    if init_state == RESULT_SUCCESS:
        return Status.RUNNING
    return Status.INIT


def is_error_code(code: int) -> bool:
    """Whether an init state or asynchronous result is an error (NCCL: anything but success and in progress)."""
    return code not in (RESULT_SUCCESS, RESULT_IN_PROGRESS)


class MissingReason(enum.Enum):
    NOCOMM = "NOCOMM"
    INCOMPLETE = "INCOMPLETE"


@dataclass(frozen=True, slots=True)
class PresentRank:
    """A rank some process reported. Slotted: a report holds one per rank of the job, and fewer objects to track
    make the collector's passes over a large report cheaper."""

    comm_rank: int
    record: RankRecord
    #: The address of the process that reported it, and its peer-table entry (None when the table lacks it).
    addr: Addr
    process: PeerInfo | None

    @property
    def status(self) -> Status:
        return rank_status(self.record)

    def launched(self, op: int) -> int:
        """Operations of type ``op`` launched; ``ALL_OPS``: of every type."""
        counts = self.record.launched
        if op == ALL_OPS:
            return sum(counts)
        return counts[op] if op < len(counts) else 0

    def completed(self, op: int) -> int:
        counts = self.record.completed
        if op == ALL_OPS:
            return sum(counts)
        return counts[op] if op < len(counts) else 0


@dataclass(frozen=True, slots=True)
class MissingRank:
    """A rank no process reported."""

    comm_rank: int
    global_rank: int | None
    #: The process that should hold it, when the rank map and the peer table tell; None otherwise.
    process: PeerInfo | None
    reason: MissingReason
    dead: bool = False
    left: bool = False


@dataclass(frozen=True)
class Communicator:
    comm_hash: int
    size: int
    #: Present and missing ranks, in communicator-rank order.
    ranks: tuple[PresentRank, ...]
    missing: tuple[MissingRank, ...]
    #: The rank the others are compared with: the first in (process, rank) order.
    reference: PresentRank
    node_count: int
    ranks_per_node_min: int
    ranks_per_node_max: int
    status_bits: Status
    errors: CommErrors
    #: Indices into ``OP_TYPES`` of the op types whose launch counts differ between ranks.
    mismatched_ops: tuple[int, ...]
    group: int = -1
    index_in_group: int = -1

    @property
    def status(self) -> Status:
        return highest_status(self.status_bits)

    @property
    def label(self) -> str:
        """``#x-y (hash)``: the name the Errors and Warnings sections use."""
        return f"#{self.group}-{self.index_in_group} ({self.comm_hash & HASH_MASK:016x})"

    @property
    def incomplete_ranks(self) -> tuple[MissingRank, ...]:
        return tuple(m for m in self.missing if m.reason is MissingReason.INCOMPLETE)

    @property
    def nocomm_ranks(self) -> tuple[MissingRank, ...]:
        return tuple(m for m in self.missing if m.reason is MissingReason.NOCOMM)

    @property
    def status_mismatch(self) -> bool:
        return bin(int(self.status_bits)).count("1") > 1


@dataclass(frozen=True)
class CommGroup:
    """A row of the communicator table."""

    number: int
    communicators: tuple[Communicator, ...]
    ranks_per_node_min: int
    ranks_per_node_max: int
    #: Distinct (process, device) pairs over the present ranks of all its communicators.
    ranks_in_group: int

    @property
    def size(self) -> int:
        return self.communicators[0].size

    @property
    def node_count(self) -> int:
        return self.communicators[0].node_count

    @property
    def status(self) -> Status:
        return self.communicators[0].status

    @property
    def errors(self) -> CommErrors:
        return self.communicators[0].errors


@dataclass(frozen=True)
class Report:
    summary: JobSummary
    groups: tuple[CommGroup, ...]
    #: The same communicators in merged-id order (hash, then size): the order of the JSON dump.
    communicators_by_id: tuple[Communicator, ...]
    #: Live processes that did not answer, dead ones, and ones that left: in (host, pid) order.
    missing_processes: tuple[PeerInfo, ...]
    dead_processes: tuple[PeerInfo, ...]
    left_processes: tuple[PeerInfo, ...]
    #: Counts of the dead and left addresses, including any the peer table does not know.
    dead_count: int
    left_count: int
    timeouts: int
    collection_time: float
    #: Standing COMM_STUCK verdicts: communicator hash -> what is stuck and who is to blame (behind / inside).
    stuck: dict[int, StuckVerdict] = field(default_factory=dict)
    #: The job's in-process restarts (restarts.py); None when no process has reported one.
    restarts: RestartSummary | None = None
    #: Processes that joined the running job and wait to be admitted at its next rendezvous round, in (host, pid)
    #: order: in the mesh and counted in the job summary, not yet training (docs/elastic.md §5).
    waiting_processes: tuple[PeerInfo, ...] = ()

    @property
    def collection_seconds(self) -> float:
        """The collection time as printed: a negative or non-finite clock difference shows as 0."""
        t = self.collection_time
        return t if math.isfinite(t) and t >= 0 else 0.0

    @property
    def communicators(self) -> tuple[Communicator, ...]:
        """In table (group) order."""
        return tuple(c for g in self.groups for c in g.communicators)


# --- building ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    """What classifying a communicator needs to know about the job."""

    #: Who answered, who is dead and who left: read from here as they are (``responses``, ``dead``, ``left``).
    snapshot: JobSnapshot
    table: dict[Addr, PeerInfo]
    #: The key of process order (``rasd.core.snapshot.process_order``).
    order: Callable[[Addr], ProcessOrder]
    peers_by_global_rank: dict[int, tuple[PeerInfo, ...]]
    everyone_answered: bool


def _process_of(comm: MergedCommunicator, comm_rank: int, context: _Context) -> tuple[int | None, PeerInfo | None]:
    """The global rank and the process of a missing rank, when the rank map and the peer table tell."""
    global_rank = comm.global_rank(comm_rank)
    if global_rank is None:
        return None, None
    candidates = context.peers_by_global_rank.get(global_rank, ())
    if len(candidates) <= 1:
        return global_rank, candidates[0] if candidates else None

    # A restarted process shares its global rank with its dead predecessor: prefer the liveliest entry.
    snapshot = context.snapshot

    def liveliness(peer: PeerInfo) -> tuple:
        if peer.addr in snapshot.responses:
            rank = 0
        elif peer.addr in snapshot.left:
            rank = 2
        elif peer.addr in snapshot.dead:
            rank = 3
        else:
            rank = 1
        return (rank, addr_key(peer.addr))

    return global_rank, min(candidates, key=liveliness)


def _missing_rank(comm: MergedCommunicator, comm_rank: int, context: _Context) -> MissingRank:
    global_rank, process = _process_of(comm, comm_rank, context)
    snapshot = context.snapshot
    dead = process is not None and process.addr in snapshot.dead
    left = process is not None and process.addr in snapshot.left
    if context.everyone_answered or (process is not None and (process.addr in snapshot.responses or left)):
        reason = MissingReason.NOCOMM
    else:
        reason = MissingReason.INCOMPLETE
    return MissingRank(comm_rank, global_rank, process, reason, dead=dead, left=left)


def _in_flight(ranks: tuple[PresentRank, ...], op: int, grace: float, window: float = 0.0) -> bool:
    """Launch counts that differ only because some ranks already entered the next operation, moments ago::

        rank 0: launched 42, completed 41, counters moved 3 ms ago    (inside operation 42, waiting)
        rank 1: launched 41, completed 41                             (not there yet)

    A skipped operation or a hang looks the same in one snapshot; it differs in time: the leading ranks stay
    inside, and past ``grace`` it is a MISMATCH (and, later, COMM_STUCK). Without a gather window (a snapshot
    taken at one instant), only this is in flight: leaders one operation ahead and inside it, the others done.

    The gather's own timing explains more (docs/reliability.md, "No false alarms from timing"). Each process's
    data are taken when the gather reaches it, all within the gather's ``window`` (its collection time), so a rank
    read late has run on while one read early has not. A difference is in flight when every rank above the lowest
    count moved less than ``window`` ago (after the gather began, so possibly after the lowest ones were read), or
    is inside the next operation within the grace; the lowest ranks are done with their last operation or inside
    it within the grace. A rank that has been ahead since before the gather began is a MISMATCH. The price: in a
    loop whose operations are shorter than a gather, a rank that skipped one is reported only by gathers its
    leaders do not move during (then as MISMATCH), or as COMM_STUCK when the job blocks."""
    if grace <= 0:
        return False
    low = min(r.launched(op) for r in ranks)
    top = max(r.launched(op) for r in ranks)
    for r in ranks:
        launched, completed, idle_ms = r.launched(op), r.completed(op), r.record.idle_ms
        recent = idle_ms <= grace * 1000
        if launched == low:
            if not (completed == low or (window > 0 and completed == low - 1 and recent)):
                return False
        elif not (
            (launched == low + 1 and completed == launched - 1 and recent)
            or (window > 0 and completed >= launched - 1 and idle_ms <= window * 1000 + 1)
        ):
            return False
    return top > low


def _reference(comm: MergedCommunicator, order: Callable[[Addr], ProcessOrder]) -> int:
    """The communicator rank the others are compared with: the first in (process, rank) order. The merge lists a
    communicator's ranks in process order, so only the first process's ranks are read, not every rank."""
    first_key: ProcessOrder | None = None
    best = -1
    for comm_rank, reported in comm.ranks.items():
        key = order(reported.addr)
        if first_key is None:
            first_key, best = key, comm_rank
        elif key != first_key:
            break  # a later process: every rank from here on comes after
        elif comm_rank < best:
            best = comm_rank
    return best


def _status_bits(records: list[RankRecord]) -> Status:
    """The union of the ranks' statuses, read from the distinct flag combinations (a job's ranks share few)."""
    bits = Status(0)
    for flags in {(r.abort_flag, r.finalize_called or r.destroy_flag, r.init_state) for r in records}:
        bits |= _status(*flags)
    return bits


def _classify(comm: MergedCommunicator, context: _Context) -> Communicator:
    """One merged communicator of the snapshot, each present rank with its process's table entry.

    Linear in the communicator's ranks with a small constant: the report classifies every rank of the job. What
    is compared across ranks (statuses, error codes, launch totals) is read as the set of distinct values first,
    and the reference rank from the first process only (``_reference``)."""
    table = context.table
    reported = comm.ranks
    present = []
    for comm_rank in sorted(reported):  # the ranks alone: no (rank, report) pair per rank to sort and collect
        entry = reported[comm_rank]
        present.append(PresentRank(comm_rank, entry.record, entry.addr, table.get(entry.addr)))
    ranks = tuple(present)
    missing = (
        ()
        if len(reported) == comm.size
        else tuple(_missing_rank(comm, r, context) for r in range(comm.size) if r not in reported)
    )
    reference = ranks[bisect.bisect_left(ranks, _reference(comm, context.order), key=_comm_rank)]
    records = [r.record for r in ranks]

    per_node = Counter(r.addr.host for r in ranks)

    status_bits = _status_bits(records)
    if any(m.reason is MissingReason.NOCOMM for m in missing):
        status_bits |= Status.NOCOMM

    # Totals first: they are exact, where a split by type may be an estimate (collectives torch issues beneath
    # the Python hooks are typed from the Flight Recorder, read now and then: rasd/torch/records.py). Ranks whose
    # totals agree, or differ only in flight, are no MISMATCH whatever their split says. The gather's own duration
    # (its collection time) is the window within which the processes' data were taken.
    grace, window = context.snapshot.in_flight_grace, context.snapshot.collection_time
    totals_differ = len({sum(r.launched) for r in records}) > 1 and not _in_flight(ranks, ALL_OPS, grace, window)
    mismatched = []
    if totals_differ:
        for op in range(N_OPS):
            expected = reference.launched(op)
            if any(r.launched(op) != expected for r in ranks) and not _in_flight(ranks, op, grace, window):
                mismatched.append(op)
    mismatched_ops = tuple(mismatched)
    errors = CommErrors(0)
    if mismatched_ops or bin(int(status_bits)).count("1") > 1:
        errors |= CommErrors.MISMATCH
    codes = {r.init_state for r in records} | {r.async_error for r in records}
    if any(is_error_code(code) for code in codes):
        errors |= CommErrors.ERROR
    if any(m.reason is MissingReason.INCOMPLETE for m in missing):
        errors |= CommErrors.INCOMPLETE

    return Communicator(
        comm_hash=comm.comm_hash,
        size=comm.size,
        ranks=ranks,
        missing=missing,
        reference=reference,
        node_count=len(per_node),
        ranks_per_node_min=min(per_node.values()),
        ranks_per_node_max=max(per_node.values()),
        status_bits=status_bits,
        errors=errors,
        mismatched_ops=mismatched_ops,
    )


def _comm_rank(rank: PresentRank) -> int:
    return rank.comm_rank


def _table_order(comm: Communicator) -> tuple:
    return (
        -comm.size,
        -comm.node_count,
        -int(comm.status),
        -int(comm.errors),
        len(comm.ranks),
        comm.comm_hash,
        comm.size,
    )


def _group_key(comm: Communicator) -> tuple:
    return (comm.size, comm.node_count, comm.status, comm.errors)


def _group(communicators: list[Communicator]) -> tuple[CommGroup, ...]:
    runs: list[list[Communicator]] = []
    for comm in sorted(communicators, key=_table_order):
        if runs and _group_key(runs[-1][0]) == _group_key(comm):
            runs[-1].append(comm)
        else:
            runs.append([comm])
    groups = []
    for number, run in enumerate(runs):
        named = tuple(replace(c, group=number, index_in_group=i) for i, c in enumerate(run))
        # (host, port, device) counts as (address, device) does, without hashing an address object per rank.
        devices = {(r.addr.host, r.addr.port, r.record.device) for c in named for r in c.ranks}
        groups.append(
            CommGroup(
                number=number,
                communicators=named,
                ranks_per_node_min=min(c.ranks_per_node_min for c in named),
                ranks_per_node_max=max(c.ranks_per_node_max for c in named),
                ranks_in_group=len(devices),
            )
        )
    return tuple(groups)


def build_report(snapshot: JobSnapshot) -> Report:
    """The report of a finished gather. Never raises on odd input: malformed records are left out."""
    dead, left = snapshot.dead, snapshot.left
    table_order = snapshot.table_order
    table = {p.addr: p for p in table_order}
    missing_processes = processes(snapshot.missing())

    by_global_rank: dict[int, list[PeerInfo]] = {}
    for peer in table_order:
        if peer.rank >= 0:
            by_global_rank.setdefault(peer.rank, []).append(peer)

    context = _Context(
        snapshot=snapshot,
        table=table,
        order=process_order(snapshot),
        peers_by_global_rank={g: tuple(peers) for g, peers in by_global_rank.items()},
        everyone_answered=not missing_processes and not dead,
    )
    by_id = [_classify(comm, context) for comm in merge_communicators(snapshot)]
    groups = _group(by_id)
    named = {(c.comm_hash, c.size): c for g in groups for c in g.communicators}

    return Report(
        summary=build_job_summary(snapshot.peers, left),
        groups=groups,
        communicators_by_id=tuple(named[(c.comm_hash, c.size)] for c in by_id),
        missing_processes=missing_processes,
        # Older processes at an address a newer one holds (JobSnapshot.former_*) are listed with the others.
        dead_processes=processes([*(table[a] for a in dead if a in table), *snapshot.former_dead]),
        left_processes=processes([*(table[a] for a in left if a in table), *snapshot.former_left]),
        dead_count=len(dead) + len(snapshot.former_dead),
        left_count=len(left) + len(snapshot.former_left),
        timeouts=snapshot.timeouts,
        collection_time=snapshot.collection_time,
        stuck=dict(snapshot.stuck),
        restarts=build_restart_summary(snapshot.responses, table, context.order),
        waiting_processes=processes(table[a] for a, data in snapshot.responses.items() if data.waiting and a in table),
    )
