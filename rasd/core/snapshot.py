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

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from .comms import CommRecord, ProcessData, RankRecord
from .peers import Addr, PeerInfo, host_order
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
        gone = self.dead | self.left
        return [p for p in self.peers if p.addr not in gone] if gone else list(self.peers)

    def missing(self) -> list[PeerInfo]:
        """Live peers that did not answer (NCCL's missing = peers - dead - responders; departed peers excluded)."""
        return [p for p in self.expected() if p.addr not in self.responses]

    @functools.cached_property
    def table_order(self) -> tuple[PeerInfo, ...]:
        """``peers`` sorted by address (``by_address``), whatever order they were given in. Worked out once per
        snapshot, as ``positions``: the merge and the report both read them (the snapshot is frozen; these caches
        are the only attributes set after it is made)."""
        return tuple(by_address(self.peers))

    @functools.cached_property
    def positions(self) -> dict[Addr, int]:
        """Each address of the table -> its position in ``table_order``."""
        return {p.addr: i for i, p in enumerate(self.table_order)}


def addr_order_memo() -> Callable[[Addr], tuple[int, bytes, int]]:
    """``peers.addr_order`` (host, then port, for any address), each host's part worked out once per key function
    made here: parsing an IP is the slow part of a sort of the table, and a job has several processes per host."""
    hosts: dict[str, tuple[int, bytes]] = {}

    def key(addr: Addr) -> tuple[int, bytes, int]:
        host = hosts.get(addr.host)
        if host is None:
            host = hosts[addr.host] = host_order(addr.host)
        return (host[0], host[1], addr.port)

    return key


def by_address(peers: Iterable[PeerInfo]) -> list[PeerInfo]:
    """``peers`` in table order: sorted by ``addr_order`` of their addresses."""
    key = addr_order_memo()
    return sorted(peers, key=lambda p: key(p.addr))


#: The sort key of a process in process order: (0, its position in the table) for a known address, (1, its
#: address) for one the table does not know.
ProcessOrder = tuple[int, int, bytes, int]


def process_order(snapshot: JobSnapshot) -> Callable[[Addr], ProcessOrder]:
    """The key of process order in this snapshot: peer-table order, then any address the table does not know."""
    position = snapshot.positions
    unknown = addr_order_memo()

    def key(addr: Addr) -> ProcessOrder:
        known = position.get(addr)
        return (0, known, b"", 0) if known is not None else (1, *unknown(addr))

    return key


def in_process_order(snapshot: JobSnapshot) -> list[Addr]:
    """The responding addresses in process order (``sorted(snapshot.responses, key=process_order(snapshot))``,
    read off the table instead of sorting: no key to make per process)."""
    responses, positions, table = snapshot.responses, snapshot.positions, snapshot.table_order
    if len(positions) == len(table):  # one entry per address, as the gather makes it
        known = [p.addr for p in table if p.addr in responses]
    else:  # an address listed twice takes its last position
        known = [p.addr for i, p in enumerate(table) if p.addr in responses and positions[p.addr] == i]
    if len(known) == len(responses):
        return known
    unknown = addr_order_memo()
    return known + sorted((a for a in responses if a not in positions), key=unknown)


class ReportedRank(NamedTuple):
    """A communicator rank as one process reported it."""

    addr: Addr
    record: RankRecord


@dataclass
class MergedCommunicator:
    """One communicator of the job, merged across the processes that hold its ranks."""

    comm_hash: int
    size: int
    #: Communicator rank -> the first report of it in process order; in the order they were first reported, which
    #: is process order.
    ranks: dict[int, ReportedRank] = field(default_factory=dict)
    #: Each distinct rank map (communicator rank -> global rank) -> the first record that carries it, in process
    #: order. The processes of a communicator mostly report one map: looking a rank up reads each map once, not
    #: every process's copy of it.
    mapped: dict[tuple[tuple[int, int, int], ...], CommRecord] = field(default_factory=dict)

    def global_rank(self, comm_rank: int) -> int | None:
        """The global rank of a communicator rank, where some rank map tells (the first that does, in process
        order)."""
        return next((g for g in (r.global_rank(comm_rank) for r in self.mapped.values()) if g is not None), None)


def merge_communicators(snapshot: JobSnapshot) -> list[MergedCommunicator]:
    """Every communicator of the snapshot that some process holds a valid rank of, in (hash, size) order. Each one's
    ``ranks`` are in the order they were first reported: in process order."""
    merged: dict[tuple[int, int], MergedCommunicator] = {}
    responses = snapshot.responses
    for addr in in_process_order(snapshot):
        for comm in responses[addr].comms:
            size = comm.size
            if size <= 0:
                continue
            key = (comm.comm_hash & HASH_MASK, size)
            entry = merged.get(key)
            for rank in comm.ranks:
                comm_rank = rank.comm_rank
                if not 0 <= comm_rank < size:
                    continue  # a malformed record; the communicator cannot hold it
                if entry is None:
                    entry = merged[key] = MergedCommunicator(*key)
                if comm_rank not in entry.ranks:
                    entry.ranks[comm_rank] = ReportedRank(addr, rank)
            if comm.rank_map and entry is not None and comm.rank_map not in entry.mapped:
                entry.mapped[comm.rank_map] = comm
    return [merged[key] for key in sorted(merged)]
