"""The input of a status report: what the root of a gather knows when the gather ends, and how it is merged.

Belongs here: ``JobSnapshot`` and the one merge of its communicators (``merge_communicators``, giving
``MergedCommunicator``), which the stuck sweeper (``stuck.py``) and the report (``rasd/report/model.py``) both use,
so they can never disagree about one snapshot. ``rasd.report`` turns a ``JobSnapshot`` into the report model and
renders it; the gather in ``rasd.core`` produces it. Keeping it a plain value makes the report a pure function, tested
without a mesh. It imports nothing of the stuck detector (which reads snapshots): the verdicts it carries are values
of ``stuck_verdict.py``.

Dead and departed processes travel in one representation, the gather's, from here to the report: the current table
entries by address (``dead``, ``left``: disjoint) and the older processes at those addresses by their table entries
(``former_dead``, ``former_left``). The report reads these fields as they are; it does not convert them.

The merge (docs/architecture.md section 4): each responding process reports the communicators it holds ranks of.
They are merged by (hash, size): two communicators with one hash but different sizes are a hash collision and are
kept apart. A rank reported twice is taken from the first process in process order (peer-table order, then any
process the table does not know). A record with size <= 0 or a rank outside [0, size) is left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from .comms import CommRecord, ProcessData, RankRecord
from .peers import Addr, PeerInfo, addr_order
from .stuck_verdict import StuckVerdict

#: Communicator hashes are 64-bit (the wire's u64); a wider value is cut to that.
HASH_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class JobSnapshot:
    #: The whole peer table of the root, sorted by address, dead and departed peers included: one entry per address.
    peers: tuple[PeerInfo, ...]
    #: Peers known dead (permanent) and peers that left cleanly (a finished process is not a fault), by address:
    #: about the entry of ``peers`` at that address, the newest process known there. Disjoint: an address given in
    #: both is taken out of ``dead`` (it said goodbye first). The gather never gives one in both, as the verdicts
    #: about one process are exclusive; a snapshot built by hand may.
    dead: frozenset[Addr] = frozenset()
    left: frozenset[Addr] = frozenset()
    #: Older processes at addresses a newer one holds now (a restarted process that got its predecessor's port
    #: back): each is dead, or departed if it left cleanly. They are not in ``peers`` (docs/architecture.md 2.6).
    former_dead: tuple[PeerInfo, ...] = ()
    former_left: tuple[PeerInfo, ...] = ()
    #: What each responding process contributed, by address. The root itself is always among them.
    responses: dict[Addr, ProcessData] = field(default_factory=dict)
    #: Legs of the gather that went quiet or were cut (NCCL's nLegTimeouts).
    timeouts: int = 0
    #: Seconds from the start of the gather to its end.
    collection_time: float = 0.0
    #: Launch counts that differ only because the leading ranks are inside an operation that started less than
    #: this many seconds ago are operations in flight, not a MISMATCH. 0: any difference is one (NCCL's rule).
    in_flight_grace: float = 0.0
    #: Standing COMM_STUCK verdicts the root holds: communicator hash -> what is stuck and who is to blame.
    stuck: dict[int, StuckVerdict] = field(default_factory=dict)
    #: What the gather asked for (``wire.Ask``'s value: the snapshot sits below the wire format), and for any ask but
    #: STATUS each answer by address (``responses`` then holds an empty ``ProcessData`` per answer).
    ask: int = 0
    answers: dict[Addr, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.dead.isdisjoint(self.left):
            object.__setattr__(self, "dead", self.dead - self.left)  # frozen: set once, here

    def expected(self) -> list[PeerInfo]:
        """The peers the gather expected an answer from: the table less the dead and the departed."""
        return [p for p in self.peers if p.addr not in self.dead and p.addr not in self.left]

    def missing(self) -> list[PeerInfo]:
        """Live peers that did not answer (NCCL's missing = peers - dead - responders; departed peers excluded)."""
        return [p for p in self.expected() if p.addr not in self.responses]


#: The sort key of a process in process order: (0, its position in the table) for a known address, (1, its
#: address) for one the table does not know.
ProcessOrder = tuple[int, int, bytes, int]


def process_order(snapshot: JobSnapshot) -> Callable[[Addr], ProcessOrder]:
    """The key of process order in this snapshot: peer-table order, then any address the table does not know."""
    position = {p.addr: i for i, p in enumerate(sorted(snapshot.peers, key=lambda p: addr_order(p.addr)))}

    def key(addr: Addr) -> ProcessOrder:
        known = position.get(addr)
        return (0, known, b"", 0) if known is not None else (1, *addr_order(addr))

    return key


class ReportedRank(NamedTuple):
    """A communicator rank as one process reported it."""

    addr: Addr
    record: RankRecord


@dataclass
class MergedCommunicator:
    """One communicator of the job, merged across the processes that hold its ranks."""

    comm_hash: int
    size: int
    #: Communicator rank -> the first report of it in process order.
    ranks: dict[int, ReportedRank] = field(default_factory=dict)
    #: The records that carry a rank map (communicator rank -> global rank), in process order.
    mapped: list[CommRecord] = field(default_factory=list)

    def global_rank(self, comm_rank: int) -> int | None:
        """The global rank of a communicator rank, where some rank map tells."""
        return next((g for g in (r.global_rank(comm_rank) for r in self.mapped) if g is not None), None)


def merge_communicators(snapshot: JobSnapshot) -> list[MergedCommunicator]:
    """Every communicator of the snapshot that some process holds a valid rank of, in (hash, size) order."""
    merged: dict[tuple[int, int], MergedCommunicator] = {}
    for addr in sorted(snapshot.responses, key=process_order(snapshot)):
        for comm in snapshot.responses[addr].comms:
            if comm.size <= 0:
                continue
            key = (comm.comm_hash & HASH_MASK, comm.size)
            for rank in comm.ranks:
                if not 0 <= rank.comm_rank < comm.size:
                    continue  # a malformed record; the communicator cannot hold it
                entry = merged.setdefault(key, MergedCommunicator(*key))
                entry.ranks.setdefault(rank.comm_rank, ReportedRank(addr, rank))
            if comm.rank_map and key in merged:
                merged[key].mapped.append(comm)
    return [merged[key] for key in sorted(merged)]
