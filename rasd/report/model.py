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

import enum
import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rasd.core.comms import N_OPS, RESULT_IN_PROGRESS, RESULT_SUCCESS, RankRecord
from rasd.core.fold import Members, RankState
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
    return _HIGHEST[int(bits) & 31]


#: ``highest_status`` of every combination of the five bits, worked out once (the report asks it per communicator,
#: and an enum made from an int is slow).
_HIGHEST: tuple[Status, ...] = tuple(Status(1 << (b.bit_length() - 1)) if b else Status.NOCOMM for b in range(32))


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
    #: How many ranks some process reported (``ranks`` lists them).
    present: int
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
    #: The merged communicator this classifies: its ranks, folded (``rasd.core.fold``), and their processes.
    merged: MergedCommunicator | None = field(default=None, compare=False, repr=False)
    #: Each responder's peer-table entry (by its index in the snapshot's responders; None where the table lacks it).
    processes: tuple[PeerInfo | None, ...] = field(default=(), compare=False, repr=False)

    @functools.cached_property
    def ranks(self) -> tuple[PresentRank, ...]:
        """Present ranks, in communicator-rank order: made on first use (the JSON, a section that lists ranks),
        one object per rank, from the folded states the report was classified on."""
        if self.merged is None:
            return ()
        processes, responders = self.processes, self.merged.responders
        present = [
            PresentRank(comm_rank, state.record(comm_rank, device, idle_ms), responders[proc], processes[proc])
            for state, proc, comm_rank, device, idle_ms in self.merged.rows()
        ]
        present.sort(key=_comm_rank)
        return tuple(present)

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
    #: The snapshot's table (address order) and the addresses that left: what ``summary`` is made of.
    table_order: tuple[PeerInfo, ...] = field(default=(), repr=False, compare=False)
    left: frozenset[Addr] = field(default=frozenset(), repr=False, compare=False)

    @functools.cached_property
    def summary(self) -> JobSummary:
        """The job summary of the snapshot's table, made when first read: a text STATUS's head is written from the
        client port's own table as the gather starts (``render_head``), and its tail and the JSON do not print it, so
        the client port's report never reads it (one pass over the table less at the root, issue 30)."""
        return build_job_summary(self.table_order, self.left, ordered=True)

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
    table: Mapping[Addr, PeerInfo]
    #: The key of process order (``rasd.core.snapshot.process_order``).
    order: Callable[[Addr], ProcessOrder]
    peers_by_global_rank: dict[int, tuple[PeerInfo, ...]]
    everyone_answered: bool
    #: Each responder's table entry and host, by its index in the snapshot's responders (what fold members index).
    processes: tuple[PeerInfo | None, ...]
    hosts: list[str]


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


def _in_flight(states: list[tuple[int, int, int]], grace: float, window: float = 0.0) -> bool:
    """Launch counts that differ only because some ranks already entered the next operation, moments ago::

        rank 0: launched 42, completed 41, counters moved 3 ms ago    (inside operation 42, waiting)
        rank 1: launched 41, completed 41                             (not there yet)

    ``states``: (launched, completed, idle ms) of one op type (or all of them), one per state of the communicator,
    the idle time the longest of the state's ranks. Every condition below holds for an idle time if it holds for a
    longer one, so a state's ranks all pass when its longest idle one does.

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
    low = min(launched for launched, _, _ in states)
    top = max(launched for launched, _, _ in states)
    for launched, completed, idle_ms in states:
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


def _count(counts: tuple[int, ...], op: int) -> int:
    """Operations of type ``op`` in ``counts``; ``ALL_OPS``: of every type."""
    if op == ALL_OPS:
        return sum(counts)
    return counts[op] if op < len(counts) else 0


def _state_status(state: RankState) -> int:
    """A state's status bit, as an int."""
    return int(_status(state.abort_flag, state.finalize_called or state.destroy_flag, state.init_state))


def _classify(comm: MergedCommunicator, context: _Context) -> Communicator:
    """One merged communicator of the snapshot, classified on its states (``rasd.core.fold``): what is compared
    across ranks (statuses, error codes, launch counts, idle times) is read once per state, and per rank only its
    process's host (the ranks per node) and its communicator rank (which are missing), at C speed. The report
    classifies every rank of the job, and a job has a communicator per tensor-parallel group (12,500 at 100,000
    processes): bits are ints until the end, and a communicator whose ranks share one state is not compared."""
    states = comm.states
    hosts = context.hosts
    count = comm.count
    missing: tuple[MissingRank, ...] = ()
    if count < comm.size:
        present = comm.present
        missing = tuple(_missing_rank(comm, r, context) for r in range(comm.size) if r not in present)
    comm_rank, first = comm.first()
    reference = PresentRank(comm_rank, first.record, first.addr, context.table.get(first.addr))

    if len(states) == 1:
        held = list(map(hosts.__getitem__, states[0][1].procs))
        # One host (a tensor-parallel group of a host, the common case): no counting.
        per_node = Counter({held[0]: len(held)}) if held.count(held[0]) == len(held) else Counter(held)
    else:
        per_node = Counter()
        for _, members in states:
            per_node.update(map(hosts.__getitem__, members.procs))

    status_bits = 0
    for state, _ in states:
        status_bits |= _state_status(state)
    if missing and any(m.reason is MissingReason.NOCOMM for m in missing):
        status_bits |= Status.NOCOMM.value

    mismatched_ops = _mismatched_ops(states, reference, context.snapshot) if len(states) > 1 else ()
    errors = 0
    if mismatched_ops or status_bits & (status_bits - 1):  # more than one status bit
        errors |= CommErrors.MISMATCH.value
    if any(is_error_code(s.init_state) or is_error_code(s.async_error) for s, _ in states):
        errors |= CommErrors.ERROR.value
    if missing and any(m.reason is MissingReason.INCOMPLETE for m in missing):
        errors |= CommErrors.INCOMPLETE.value

    return Communicator(
        comm_hash=comm.comm_hash,
        size=comm.size,
        present=count,
        missing=missing,
        reference=reference,
        node_count=len(per_node),
        ranks_per_node_min=min(per_node.values()),
        ranks_per_node_max=max(per_node.values()),
        status_bits=Status(status_bits),
        errors=CommErrors(errors),
        mismatched_ops=mismatched_ops,
        merged=comm,
        processes=context.processes,
    )


def _mismatched_ops(
    states: list[tuple[RankState, Members]], reference: PresentRank, snapshot: JobSnapshot
) -> tuple[int, ...]:
    """The op types whose launch counts differ between the states, none when they differ only in flight.

    Totals first: they are exact, where a split by type may be an estimate (collectives torch issues beneath the
    Python hooks are typed from the Flight Recorder, read now and then: rasd/torch/records.py). Ranks whose totals
    agree, or differ only in flight, are no MISMATCH whatever their split says. The gather's own duration (its
    collection time) is the window within which the processes' data were taken."""
    grace, window = snapshot.in_flight_grace, snapshot.collection_time
    longest = [max(members.idle_ms) for _, members in states]  # per state, the longest idle time of its ranks

    def counts(op: int) -> list[tuple[int, int, int]]:
        return [
            (_count(s.launched, op), _count(s.completed, op), idle)
            for (s, _), idle in zip(states, longest, strict=True)
        ]

    if len({sum(s.launched) for s, _ in states}) <= 1 or _in_flight(counts(ALL_OPS), grace, window):
        return ()
    return tuple(
        op
        for op in range(N_OPS)
        if any(_count(s.launched, op) != reference.launched(op) for s, _ in states)
        and not _in_flight(counts(op), grace, window)
    )


def _comm_rank(rank: PresentRank) -> int:
    return rank.comm_rank


def _table_order(comm: Communicator) -> tuple:
    return (
        -comm.size,
        -comm.node_count,
        -int(comm.status),
        -int(comm.errors),
        comm.present,
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
        for i, c in enumerate(run):
            # Each was made by ``_classify`` for this report alone: named in place (frozen, so set once, here), not
            # copied (a report holds one per communicator: 12,500 at 100,000 processes).
            object.__setattr__(c, "group", number)
            object.__setattr__(c, "index_in_group", i)
        named = tuple(run)
        groups.append(
            CommGroup(
                number=number,
                communicators=named,
                ranks_per_node_min=min(c.ranks_per_node_min for c in named),
                ranks_per_node_max=max(c.ranks_per_node_max for c in named),
                ranks_in_group=_devices(named),
            )
        )
    return tuple(groups)


def _devices(named: tuple[Communicator, ...]) -> int:
    """Distinct (process, device) pairs over the present ranks of ``named``: the number of ranks where no process
    holds two of them (the common case, read without a pair per rank), else counted pair by pair."""
    columns = [members for c in named if c.merged is not None for _, members in c.merged.states]
    procs: set[int] = set()
    total = 0
    for members in columns:
        procs.update(members.procs)
        total += len(members)
    if len(procs) == total:
        return total
    pairs: set[tuple[int, int]] = set()
    for members in columns:
        pairs.update(zip(members.procs, members.devices, strict=True))
    return len(pairs)


def build_report(snapshot: JobSnapshot) -> Report:
    """The report of a finished gather. Never raises on odd input: malformed records are left out."""
    dead, left = snapshot.dead, snapshot.left
    table_order = snapshot.table_order
    table = snapshot.peer_at
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
        # By the place process order gives each responder: its table position, or past the table's end.
        processes=tuple(table_order[i] if i < len(table_order) else None for i in snapshot.process_ranks),
        hosts=[addr.host for addr in snapshot.responders],
    )
    by_id = [_classify(comm, context) for comm in merge_communicators(snapshot)]
    groups = _group(by_id)
    named = {(c.comm_hash, c.size): c for g in groups for c in g.communicators}

    return Report(
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
        table_order=tuple(table_order),
        left=frozenset(left),
    )
