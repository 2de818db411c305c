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

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from .answer import Answer
from .comms import ProcessData, RankRecord
from .fold import Members, RankState, States, fold_into, unfold
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
    #: What each responding process contributed, by address, less its communicators: those are in ``states``. The
    #: root itself is always among them. Communicators given here are folded into ``states`` when the snapshot is
    #: made (a snapshot built by hand); the gather gives them folded.
    responses: dict[Addr, ProcessData] = field(default_factory=dict)
    #: The responders' communicator ranks, folded (fold.py): each member's process is an index into ``responders``
    #: (the order of ``responses``).
    states: States = field(default_factory=dict)
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
    answers: dict[Addr, Answer] = field(default_factory=dict)
    #: ``peers`` are in address order already (a ``PeerTable``'s, as the gather gives them): ``table_order`` takes
    #: them as they are instead of sorting 100,000 entries again for every report.
    ordered: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen: these are set once, here.
        if not self.dead.isdisjoint(self.left):
            object.__setattr__(self, "dead", self.dead - self.left)
        if any(data.comms for data in self.responses.values()):
            states = {state: _copy(members) for state, members in self.states.items()}
            responses = {}
            for proc, (addr, data) in enumerate(self.responses.items()):
                fold_into(states, proc, data)
                responses[addr] = dataclasses.replace(data, comms=()) if data.comms else data
            object.__setattr__(self, "states", states)
            object.__setattr__(self, "responses", responses)

    @functools.cached_property
    def responders(self) -> tuple[Addr, ...]:
        """The responding addresses in the order of ``responses``: what the members of ``states`` index."""
        return tuple(self.responses)

    def contributions(self) -> dict[Addr, ProcessData]:
        """What each responder contributed, its communicators unfolded from ``states`` (``fold.unfold``)."""
        comms = unfold(self.states, len(self.responses))
        return {
            addr: dataclasses.replace(data, comms=held) if held else data
            for (addr, data), held in zip(self.responses.items(), comms, strict=True)
        }

    def expected(self) -> list[PeerInfo]:
        """The peers the gather expected an answer from: the table less the dead and the departed."""
        gone = self.dead | self.left
        return [p for p in self.peers if p.addr not in gone] if gone else list(self.peers)

    def missing(self) -> list[PeerInfo]:
        """Live peers that did not answer (NCCL's missing = peers - dead - responders; departed peers excluded)."""
        places = self.process_ranks
        if len(places) == len(self.peers) and (not places or max(places) < len(places)):
            # Every table position has its responder (places are distinct, each below the table's length): all
            # answered, the common case, known without looking each peer up (100,000 of them at the root).
            return []
        return [p for p in self.expected() if p.addr not in self.responses]

    @functools.cached_property
    def table_order(self) -> tuple[PeerInfo, ...]:
        """``peers`` sorted by address (``by_address``), whatever order they were given in. Worked out once per
        snapshot, as ``positions``: the merge and the report both read them (the snapshot is frozen; these caches
        are the only attributes set after it is made)."""
        return self.peers if self.ordered else tuple(by_address(self.peers))

    @functools.cached_property
    def positions(self) -> dict[Addr, int]:
        """Each address of the table -> its position in ``table_order``."""
        return {p.addr: i for i, p in enumerate(self.table_order)}

    @functools.cached_property
    def peer_at(self) -> Mapping[Addr, PeerInfo]:
        """Each address of the table -> its entry, read through ``positions`` (no second dict of the table)."""
        return _PeerAt(self.table_order, self.positions)

    @functools.cached_property
    def process_ranks(self) -> list[int]:
        """Each responder (by its index in ``responders``) -> a number that sorts it in process order (its position
        in the table; after the table, one the table does not know, by address)."""
        positions = self.positions
        places = [positions.get(addr, -1) for addr in self.responders]
        if -1 in places:
            after = len(self.table_order)
            unknown = sorted((a for a, p in zip(self.responders, places, strict=True) if p < 0), key=addr_order_memo())
            extra = {a: after + i for i, a in enumerate(unknown)}
            places = [p if p >= 0 else extra[a] for a, p in zip(self.responders, places, strict=True)]
        return places


class _PeerAt(Mapping[Addr, PeerInfo]):
    """A table's entries by address: its entries in order and each address's position (``JobSnapshot.peer_at``)."""

    __slots__ = ("_order", "_positions")

    def __init__(self, order: tuple[PeerInfo, ...], positions: dict[Addr, int]) -> None:
        self._order, self._positions = order, positions

    def __getitem__(self, addr: Addr) -> PeerInfo:
        return self._order[self._positions[addr]]

    def get(self, addr: Addr, default: PeerInfo | None = None) -> PeerInfo | None:  # type: ignore[override]
        at = self._positions.get(addr)
        return default if at is None else self._order[at]

    def __contains__(self, addr: object) -> bool:
        return addr in self._positions

    def __iter__(self) -> Iterator[Addr]:
        return iter(self._positions)

    def __len__(self) -> int:
        return len(self._positions)


def _copy(members: Members) -> Members:
    return Members(members.procs[:], members.comm_ranks[:], members.devices[:], members.idle_ms[:])


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
    """``peers`` in table order: sorted by ``addr_order`` of their addresses. The hosts are sorted first, then the
    peers by an integer (the host's place, then the port): no key tuple per peer (a table of 100,000)."""
    listed = list(peers)
    hosts = sorted({p.addr.host for p in listed}, key=host_order)
    place = {host: i << 32 for i, host in enumerate(hosts)}  # ports are 16-bit: any below 2**32 sorts exactly
    return sorted(listed, key=lambda p: place[p.addr.host] + p.addr.port)


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
    """One communicator of the job, merged across the processes that hold its ranks: its ranks folded by state
    (fold.py), each rank once (the first report of it in process order), every one in ``[0, size)``."""

    comm_hash: int
    size: int
    #: Its states and their ranks, in the order the snapshot lists them; no state is empty.
    states: list[tuple[RankState, Members]]
    #: The snapshot's responders (what members index) and each one's place in process order.
    responders: tuple[Addr, ...] = ()
    process_ranks: list[int] = field(default_factory=list)
    #: The states that carry a rank map, each with the place in process order from which its map counts
    #: (``merge_communicators``), those whose ranks were all left out included.
    maps: list[tuple[int, RankState]] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many ranks some process reported (each once, by the merge)."""
        return sum(len(members) for _, members in self.states)

    @functools.cached_property
    def present(self) -> frozenset[int]:
        """The communicator ranks some process reported."""
        out: set[int] = set()
        for _, members in self.states:
            out.update(members.comm_ranks)
        return frozenset(out)

    def rows(self) -> Iterable[tuple[RankState, int, int, int, int]]:
        """(state, process, communicator rank, device, idle ms) of each rank, state by state."""
        for state, members in self.states:
            for proc, comm_rank, device, idle_ms in members.rows():
                yield state, proc, comm_rank, device, idle_ms

    @functools.cached_property
    def ranks(self) -> dict[int, ReportedRank]:
        """Communicator rank -> its report, in process order (then rank order). Made on first use: the report
        classifies states, and reads single ranks only to print them."""
        order, responders = self.process_ranks, self.responders
        rows = sorted(self.rows(), key=lambda row: (order[row[1]], row[2]))
        return {
            comm_rank: ReportedRank(responders[proc], state.record(comm_rank, device, idle_ms))
            for state, proc, comm_rank, device, idle_ms in rows
        }

    def first(self) -> tuple[int, ReportedRank]:
        """The rank the others are compared with: the first in (process, rank) order, and its report."""
        order = self.process_ranks
        best: tuple[int, int, int] | None = None  # (process place, communicator rank, state)
        row = 0
        for s, (_, members) in enumerate(self.states):
            places = list(map(order.__getitem__, members.procs))
            place = min(places)
            if places.count(place) == 1:  # the common case, a process holding one rank of it: no tuple per row
                at = places.index(place)
                comm_rank = members.comm_ranks[at]
            else:
                place, comm_rank, at = min(
                    zip(places, members.comm_ranks, range(len(members)), strict=True)  # by rank within the process
                )
            if best is None or (place, comm_rank) < best[:2]:
                best, row = (place, comm_rank, s), at
        assert best is not None  # a merged communicator holds a rank
        _, comm_rank, s = best
        state, members = self.states[s]
        record = state.record(comm_rank, members.devices[row], members.idle_ms[row])
        return comm_rank, ReportedRank(self.responders[members.procs[row]], record)

    @functools.cached_property
    def mapped(self) -> dict[tuple[tuple[int, int, int], ...], RankState]:
        """Each distinct rank map (communicator rank -> global rank) -> a state that carries it, in process order of
        the first rank carrying it. Looking a rank up reads each map once."""
        first: dict[tuple[tuple[int, int, int], ...], tuple[int, RankState]] = {}
        for place, state in self.maps:
            held = first.get(state.rank_map)
            if held is None or place < held[0]:
                first[state.rank_map] = (place, state)
        return {m: state for m, (_, state) in sorted(first.items(), key=lambda item: item[1][0])}

    def global_rank(self, comm_rank: int) -> int | None:
        """The global rank of a communicator rank, where some rank map tells (the first that does, in process
        order)."""
        return next((g for g in (s.global_rank(comm_rank) for s in self.mapped.values()) if g is not None), None)


def merge_communicators(snapshot: JobSnapshot) -> list[MergedCommunicator]:
    """Every communicator of the snapshot that some process holds a valid rank of, in (hash, size) order.

    Linear in the ranks with a small constant, at C speed where the ranks are well formed and reported once: a
    communicator's states are put together by (hash, size), a rank outside ``[0, size)`` is dropped, and a rank
    reported by several processes is kept from the first of them in process order (within one process, from the
    state first in ``_state_order``: a process reports each rank once, and the order of its records is not kept).

    Rank maps are read as a merge record by record reads them: a record's map counts from its process's place in
    process order, once some process at or before that place holds a valid rank of the communicator (an out-of-range
    rank's record included, a rank kept from another process's report included)."""
    by_key: dict[tuple[int, int], list[tuple[RankState, Members]]] = {}
    starts: dict[tuple[int, int], int] = {}  # the first place in process order of a valid rank
    # Every state with a rank map, with its first place in process order, and for one whose ranks are not all in
    # range, its members (its first place may come before any valid rank: ``start`` below).
    carriers: dict[tuple[int, int], list[tuple[RankState, int, Members | None]]] = {}
    order = snapshot.process_ranks
    for state, members in snapshot.states.items():
        size = state.size
        if size <= 0 or not len(members):
            continue
        key = (state.comm_hash & HASH_MASK, size)
        first = min(map(order.__getitem__, members.procs))
        if min(members.comm_ranks) < 0 or max(members.comm_ranks) >= size:
            if state.rank_map:
                carriers.setdefault(key, []).append((state, first, members))
            members = members.only(i for i, r in enumerate(members.comm_ranks) if 0 <= r < size)
            if not len(members):
                continue  # malformed records: the communicator cannot hold them
            first = min(map(order.__getitem__, members.procs))
        elif state.rank_map:
            carriers.setdefault(key, []).append((state, first, None))
        by_key.setdefault(key, []).append((state, members))
        starts[key] = min(starts.get(key, first), first)
    out = []
    for key in sorted(by_key):
        states = by_key[key]
        if len(states) > 1:
            states.sort(key=_state_order)
        start = starts[key]
        maps = []
        for state, first, whole in carriers.get(key, ()):
            if whole is not None and first < start:  # out-of-range ranks before any valid one: from ``start`` on
                first = min((p for p in map(order.__getitem__, whole.procs) if p >= start), default=-1)
            if first >= 0:
                maps.append((first, state))
        if len(maps) > 1:
            maps.sort(key=lambda item: (item[0], _state_order((item[1], None))))
        out.append(MergedCommunicator(*key, _first_reports(states, order), snapshot.responders, order, maps))
    return out


def _state_order(item: tuple[RankState, Members | None]) -> tuple[object, ...]:
    """A communicator's states in an order of their own values, whatever order the gather's legs brought them in."""
    s = item[0]
    flags = (s.finalize_called, s.destroy_flag, s.abort_flag)
    return (s.comm_hash, s.rank_map, s.init_state, s.async_error, flags, s.launched, s.completed)


def _first_reports(states: list[tuple[RankState, Members]], order: list[int]) -> list[tuple[RankState, Members]]:
    """``states`` with each communicator rank kept once: from the first process in process order (then the first
    state, then the first row); a state left with none is dropped."""
    seen: set[int] = set()
    total = 0
    for _, members in states:
        seen.update(members.comm_ranks)
        total += len(members)
    if len(seen) == total:
        return states  # every rank reported once: the common case
    best: dict[int, tuple[int, int, int]] = {}  # rank -> (process place, state, row)
    for s, (_, members) in enumerate(states):
        for row, (proc, comm_rank) in enumerate(zip(members.procs, members.comm_ranks, strict=True)):
            candidate = (order[proc], s, row)
            if comm_rank not in best or candidate < best[comm_rank]:
                best[comm_rank] = candidate
    keep: dict[int, list[int]] = {}
    for _, s, row in best.values():
        keep.setdefault(s, []).append(row)
    return [(state, members.only(sorted(keep[s]))) for s, (state, members) in enumerate(states) if s in keep]
