"""Folded gathers (fold.py, ``wire.Fold``, ``gather.responses_of``): a STATUS or SWEEP gather's entries come back as
they were sent, however relays cut them into legs and merge them; a process that answered twice counts once, from its
first answer; a malformed fold is a ``ProtocolError`` and nothing else, the structure refused by a relay and the
records and states by the root; and the report and the stuck detector, which classify states, say what they would
say of the ranks one by one."""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rasd.core import gather, wire
from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord, RestartRecord, mapped_rank
from rasd.core.fold import RankState, raised
from rasd.core.frames import POSITION_FRAMES, Frame
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import HASH_MASK, JobSnapshot, MergedCommunicator, merge_communicators
from rasd.core.stuck import StuckVerdict, attribute, signature
from rasd.report import CommErrors, Status, build_report, render_json, render_text

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: A gather through relays, and three reports of it: fewer examples.
PLAN_SETTINGS = settings(SETTINGS, max_examples=100)

U32 = 2**32 - 1
U64 = 2**64 - 1
ROOT = Addr("10.0.0.1", 1)


def counts(**by_op: int) -> tuple[int, ...]:
    out = [0] * N_OPS
    for name, n in by_op.items():
        out[OP_TYPES.index(name)] = n
    return tuple(out)


#: Few counters, so that ranks of different processes often share a state.
COUNTS = (counts(), counts(AllReduce=5), counts(AllReduce=6), counts(AllReduce=5, Broadcast=1))


def canonical(entries: Iterable[tuple[Addr, ProcessData]]) -> dict[Addr, tuple[ProcessData, list[tuple[object, ...]]]]:
    """Each process's data less its communicators, and the sorted multiset of its ranks with their communicator
    (hash, size, rank map): what survives a fold, which regroups a process's ranks one record per state."""
    out = {}
    for addr, data in entries:
        ranks = sorted((c.comm_hash, c.size, c.rank_map, dataclasses.astuple(r)) for c in data.comms for r in c.ranks)
        out[addr] = (dataclasses.replace(data, comms=()), ranks)
    return out


def through_the_wire(msg: wire.CollResp) -> wire.CollResp:
    got = wire.decode_body(wire.encode(msg)[4:])
    assert isinstance(got, wire.CollResp) and got == msg
    return got


def folded(entries: Iterable[tuple[Addr, ProcessData]]) -> wire.Fold:
    fold = wire.Fold()
    for addr, data in entries:
        fold.add(addr, data)
    return fold


# ----------------------------------------------------------------------------------------------------------------
# Data the wire carries: every field at its bounds somewhere


addrs = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str)).flatmap(
    lambda host: st.integers(1, 65535).map(lambda port: Addr(host, port))
)
wire_ranks = st.builds(
    RankRecord,
    comm_rank=st.sampled_from([0, 1, 2, 3, U32]),
    init_state=st.sampled_from([0, 7, 255]),
    async_error=st.sampled_from([0, 3]),
    finalize_called=st.booleans(),
    destroy_flag=st.booleans(),
    abort_flag=st.booleans(),
    device=st.sampled_from([-1, 0, 1, 32767, -32768]),
    launched=st.sampled_from([*COUNTS, (U64,) * N_OPS]),
    completed=st.sampled_from(COUNTS),
    idle_ms=st.sampled_from([0, 5, U32]),
)
RANK_MAPS = ((), ((0, 4, 1),), ((-(2**31), U32, 2**31 - 1), (5, 1, -3)))
wire_comms = st.builds(
    CommRecord,
    comm_hash=st.sampled_from([0, 1, U64]),
    size=st.sampled_from([1, 4, U32]),
    ranks=st.lists(wire_ranks, min_size=1, max_size=3).map(tuple),
    rank_map=st.sampled_from(RANK_MAPS),
)
restarts = st.none() | st.builds(
    RestartRecord,
    iteration=st.integers(0, U32),
    restarts=st.integers(0, U32),
    cause=st.text(max_size=12),
    terminated=st.lists(st.integers(0, 2**31 - 1), unique=True, max_size=3).map(sorted).map(tuple),
    seconds_lost=st.floats(0, 1e6),
)
positions = st.lists(
    st.builds(Frame, st.text(max_size=8), st.integers(0, U32), st.text(max_size=8)), max_size=POSITION_FRAMES
).map(tuple)
process_datas = st.builds(
    ProcessData,
    comms=st.lists(wire_comms, max_size=3).map(tuple),
    restart=restarts,
    waiting=st.booleans(),
    where=st.just(()) | positions,
)


# ----------------------------------------------------------------------------------------------------------------
# 1. The round trip


@SETTINGS
@given(entries=st.lists(st.tuples(addrs, process_datas), max_size=6, unique_by=lambda e: e[0]))
def test_a_folded_collresp_gives_back_every_process_and_its_ranks(entries):
    fold = folded(entries)
    msg = through_the_wire(wire.CollResp(ROOT, 1, 0, fold.count, fold.encode()))
    assert msg.count == len(entries) and (fold.size == len(msg.raw) or not entries)
    back = msg.fold.entries()
    assert [addr for addr, _ in back] == [addr for addr, _ in entries]  # in the order they were added
    assert canonical(back) == canonical(entries)
    # One record per (process, state): each record's ranks share a state, and no two records of a process do.
    for _, data in back:
        states = [{RankState.of(comm, rank) for rank in comm.ranks} for comm in data.comms]
        assert all(len(held) == 1 for held in states)
        assert len({next(iter(held)) for held in states}) == len(states)


def test_a_process_holding_one_communicator_in_two_states_gets_two_records():
    a, b = RankRecord(0, launched=COUNTS[1]), RankRecord(1, launched=COUNTS[2])
    c = RankRecord(2, launched=COUNTS[1], device=3, idle_ms=9)
    data = ProcessData(comms=(CommRecord(7, 4, (a, b, c), ((0, 4, 1),)),))
    ((_, back),) = wire.collresp(ROOT, 1, 0, ((ROOT, data),)).entries
    assert back.comms == (CommRecord(7, 4, (a, c), ((0, 4, 1),)), CommRecord(7, 4, (b,), ((0, 4, 1),)))


# ----------------------------------------------------------------------------------------------------------------
# 2 and 3. Legs, relays of relays, and the root's snapshot


HOSTS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "fe80::1")
POOL = tuple(Addr(host, port) for host in HOSTS for port in range(1, 5))
#: (hash, size) of the communicators: two with one hash and different sizes are kept apart (a hash collision); two
#: of one size may be grouped.
KEYS = ((1, 2), (1, 4), (2, 4), (U64, 2), (5, 1))
REPORT_MAPS = ((), ((0, 4, 1),), ((10, 2, 1), (20, 2, 1)), ((3, 1, 1),))
#: (finalize_called, destroy_flag, abort_flag), mostly none.
FLAGS = ((False, False, False),) * 3 + ((True, False, False), (False, True, False), (False, False, True))


@st.composite
def report_ranks(draw: st.DrawFn, comm_rank: int) -> RankRecord:
    finalize, destroy, abort = draw(st.sampled_from(FLAGS))
    return RankRecord(
        comm_rank,
        init_state=draw(st.sampled_from([0, 0, 7, 3])),
        async_error=draw(st.sampled_from([0, 0, 7, 5])),
        finalize_called=finalize,
        destroy_flag=destroy,
        abort_flag=abort,
        device=draw(st.sampled_from([-1, 0, 1])),
        launched=draw(st.sampled_from(COUNTS)),
        completed=draw(st.sampled_from(COUNTS)),
        idle_ms=draw(st.sampled_from([0, 10, 5000])),
    )


@st.composite
def report_datas(draw: st.DrawFn, lowest_rank: int = 0, keys: Sequence[tuple[int, int]] = KEYS) -> ProcessData:
    """A process's data whose report does not depend on the order of the snapshot's states: of each communicator it
    holds, one rank map and each rank once (a process reporting one rank twice, or two rank maps of one communicator,
    is a tie that the state order breaks). Its ranks of a communicator are in one or two records; some are out of
    range; other processes may hold the same ranks."""
    comms = []
    held = st.lists(st.sampled_from(keys), unique_by=lambda k: (k[0] & HASH_MASK, k[1]), max_size=3)
    for comm_hash, size in draw(held):
        rank_map = draw(st.sampled_from(REPORT_MAPS))
        ranks = draw(st.lists(st.integers(lowest_rank, size + 1), unique=True, min_size=1, max_size=3))
        records = [draw(report_ranks(r)) for r in ranks]
        cut = draw(st.integers(1, len(records)))
        comms.append(CommRecord(comm_hash, size, tuple(records[:cut]), rank_map))
        if cut < len(records):
            comms.append(CommRecord(comm_hash, size, tuple(records[cut:]), rank_map))
    return ProcessData(
        comms=tuple(draw(st.permutations(comms))),
        restart=draw(restarts),
        waiting=draw(st.booleans()),
        where=draw(st.just(()) | positions),
    )


@dataclass
class Plan:
    """A gather: the root's own entry, each relay's own entries, and who answers whom in which order (``order[-1]``:
    the root's legs)."""

    root: tuple[Addr, ProcessData]
    own: list[list[tuple[Addr, ProcessData]]]
    order: dict[int, list[int]]
    peers: tuple[PeerInfo, ...]
    dead: frozenset[Addr]
    left: frozenset[Addr]
    #: Every entry, unique addresses, in the order drawn (the root's first), and the second answers, if any.
    entries: list[tuple[Addr, ProcessData]] = field(default_factory=list)
    again: list[tuple[Addr, ProcessData]] = field(default_factory=list)


@st.composite
def peer_tables(draw: st.DrawFn, responders: Sequence[Addr]) -> tuple[tuple[PeerInfo, ...], frozenset, frozenset]:
    """Some of the responders and some silent processes, global ranks unique (the rank maps name some of them), and
    dead and departed processes among the silent ones."""
    addrs = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=10))
    global_ranks = draw(
        st.lists(st.sampled_from([-1, 0, 1, 2, 3, 4, 10, 11, 20, 21]), min_size=len(addrs), max_size=len(addrs))
    )
    used: set[int] = set()
    peers = []
    for i, (addr, rank) in enumerate(zip(addrs, global_ranks, strict=True)):
        if rank in used:
            rank = -1
        used.add(rank)
        peers.append(PeerInfo(addr, pid=i, hostname=f"h{addr.host}", incarnation=1, rank=rank))
    silent = [a for a in addrs if a not in responders]
    dead = draw(st.lists(st.sampled_from(silent), max_size=2).map(frozenset)) if silent else frozenset()
    rest = [a for a in silent if a not in dead]
    left = draw(st.lists(st.sampled_from(rest), max_size=2).map(frozenset)) if rest else frozenset()
    return tuple(peers), dead, left


@st.composite
def plans(draw: st.DrawFn, twice: bool = False) -> Plan:
    entries = draw(
        st.lists(st.tuples(st.sampled_from(POOL), report_datas()), min_size=1, max_size=10, unique_by=lambda e: e[0])
    )
    root, rest = entries[0], entries[1:]
    again: list[tuple[Addr, ProcessData]] = []
    if twice:
        again = draw(
            st.lists(st.tuples(st.sampled_from([a for a, _ in entries]), report_datas()), min_size=1, max_size=4)
        )
        rest = draw(st.permutations(rest + again))
    legs = draw(st.integers(1, 4))
    parent = [draw(st.integers(-1, i - 1)) for i in range(legs)]  # a relay of relays answers a relay
    at = draw(st.lists(st.integers(0, legs - 1), min_size=len(rest), max_size=len(rest)))
    if draw(st.booleans()):
        at.sort()  # consecutive entries in a leg, else interleaved
    own = [[e for e, leg in zip(rest, at, strict=True) if leg == i] for i in range(legs)]
    order = {p: draw(st.permutations([i for i in range(legs) if parent[i] == p])) for p in range(-1, legs)}
    peers, dead, left = draw(peer_tables([a for a, _ in entries]))
    return Plan(root, own, order, peers, dead, left, entries, again)


@dataclass
class Gathered:
    snapshot: JobSnapshot
    #: Every entry the root got, in the order it got them (the parts one after the other).
    flattened: list[tuple[Addr, ProcessData]]
    #: Each relay's fold: (its size, the length of what it encodes to), after its own entries and after the merges.
    sizes_added: list[tuple[int, int]]
    sizes_merged: list[tuple[int, int]]


def gathered(plan: Plan) -> Gathered:
    """The gather as the relays and the root run it (``Gathering.on_collreq``, ``on_collresp``): a relay adds its
    own entries, merges each leg's fold as it arrives (from the wire), and passes its fold on; the root decodes each
    of its legs' folds (with the states it decoded so far) and puts the parts together."""
    sizes_added: list[tuple[int, int]] = []
    sizes_merged: list[tuple[int, int]] = []

    def relay(i: int) -> tuple[wire.Fold, list[tuple[Addr, ProcessData]]]:
        fold = folded(plan.own[i])
        shadow = list(plan.own[i])
        if fold.count:
            sizes_added.append((fold.size, len(fold.encode())))
        for child in plan.order[i]:
            received, theirs = relay(child)
            if received.count:  # an empty answer (a duplicate's) is not merged
                fold.merge(received)
                shadow += theirs
        if fold.count:  # an empty fold encodes to nothing, its size says 8 (the two counts it would write)
            sizes_merged.append((fold.size, len(fold.encode())))
        msg = through_the_wire(wire.CollResp(ROOT, 1, 0, fold.count, fold.encode()))
        received = msg.fold
        assert received.count == fold.count
        if received.count:
            assert received.size == len(msg.raw) == len(received.encode())
            assert received.encode() == msg.raw  # a fold passed on as it came is the same bytes
        return received, shadow

    known: dict[bytes, RankState] = {}
    parts = [gather.own_part(*plan.root)]
    flattened = [plan.root]
    for child in plan.order[-1]:
        received, theirs = relay(child)
        if received.count:
            parts.append(received.decoded(known))
            flattened += theirs
    responses, states = gather.responses_of(parts)
    assert {state for _, _, states in parts[1:] for state in states} == set(known.values())  # each decoded once
    snapshot = JobSnapshot(
        peers=plan.peers,
        dead=plan.dead,
        left=plan.left,
        responses=responses,
        states=states,
        timeouts=1,
        collection_time=0.25,
        in_flight_grace=0.5,
    )
    return Gathered(snapshot, flattened, sizes_added, sizes_merged)


def by_hand(plan: Plan, entries: Iterable[tuple[Addr, ProcessData]]) -> JobSnapshot:
    return JobSnapshot(
        peers=plan.peers,
        dead=plan.dead,
        left=plan.left,
        responses=dict(entries),
        timeouts=1,
        collection_time=0.25,
        in_flight_grace=0.5,
    )


def rendered(snapshot: JobSnapshot) -> tuple[str, str, str]:
    report = build_report(snapshot)
    return (
        render_text(report, version_line="v", runtime_line="r"),
        render_text(report, version_line="v", runtime_line="r", verbose=True),
        render_json(report, timestamp=0.0, torchras_version="0", torch_version="0"),
    )


def members_index_responses(snapshot: JobSnapshot) -> None:
    for members in snapshot.states.values():
        assert len(members) and all(0 <= p < len(snapshot.responses) for p in members.procs)


@PLAN_SETTINGS
@given(plan=plans())
def test_the_roots_snapshot_is_the_one_its_entries_make_however_relays_merge_them(plan):
    got = gathered(plan)
    snapshot = got.snapshot
    # Each process once, in the order the root got them: its own, then each leg's, a relay's own before its legs'.
    assert list(snapshot.responses) == [addr for addr, _ in got.flattened]
    assert len(got.flattened) == len(plan.entries) and dict(got.flattened) == dict(plan.entries)
    members_index_responses(snapshot)
    assert canonical(snapshot.contributions().items()) == canonical(plan.entries)
    assert rendered(snapshot) == rendered(by_hand(plan, plan.entries))
    # The bound a relay checks is exact: after its own entries and after each leg's merged.
    assert all(size == length for size, length in got.sizes_added)
    assert all(size == length for size, length in got.sizes_merged)


def test_the_size_of_a_fold_is_what_it_encodes_to_after_adds_and_after_the_wire():
    data = ProcessData(comms=(CommRecord(5, 2, (RankRecord(0), RankRecord(1, device=1)), ((0, 2, 1),)),))
    fold = folded([(ROOT, data), (Addr("fe80::1", 2), ProcessData(waiting=True))])
    assert fold.size == len(fold.encode())
    assert wire.Fold.decode(fold.count, fold.encode()).size == len(fold.encode())


def test_the_size_of_a_merged_fold_is_what_it_encodes_to_when_the_legs_hold_different_states():
    one = ProcessData(comms=(CommRecord(5, 2, (RankRecord(0),), ((0, 2, 1),)),))
    other = ProcessData(comms=(CommRecord(6, 2, (RankRecord(1),), ((0, 2, 1),)),))
    fold = folded([(ROOT, one)])
    leg = folded([(Addr("10.0.0.2", 1), other)])
    fold.merge(wire.Fold.decode(leg.count, leg.encode()))
    assert fold.size == len(fold.encode())


def test_the_size_of_a_merged_fold_is_what_it_encodes_to_when_the_legs_share_a_state():
    data = ProcessData(comms=(CommRecord(5, 2, (RankRecord(0),), ((0, 2, 1),)),))
    fold = folded([(ROOT, data)])
    leg = folded([(Addr("10.0.0.2", 1), data)])
    fold.merge(wire.Fold.decode(leg.count, leg.encode()))
    assert fold.size == len(fold.encode())
    fold.merge(folded([(Addr("10.0.0.3", 1), data)]))  # a fold added to here, not from the wire
    assert fold.size == len(fold.encode()) and len(fold.states) == 1


@PLAN_SETTINGS
@given(plan=plans(twice=True))
def test_a_process_that_answered_twice_counts_once_from_its_first_answer(plan):
    got = gathered(plan)
    snapshot = got.snapshot
    first: dict[Addr, ProcessData] = {}
    for addr, data in got.flattened:
        first.setdefault(addr, data)
    assert len(got.flattened) == len(plan.entries) + len(plan.again) and set(first) == set(dict(plan.entries))
    assert list(snapshot.responses) == list(first)
    members_index_responses(snapshot)
    assert canonical(snapshot.contributions().items()) == canonical(first.items())
    assert rendered(snapshot) == rendered(by_hand(plan, first.items()))


def test_the_first_answer_keeps_its_ranks_and_the_second_loses_all_of_its():
    p2, p3 = Addr("10.0.0.2", 1), Addr("10.0.0.3", 1)
    state = CommRecord(7, 4, (RankRecord(0), RankRecord(1)), ((0, 4, 1),))
    first = ProcessData(comms=(CommRecord(7, 4, (RankRecord(2, device=2),), ((0, 4, 1),)),))
    second = ProcessData(comms=(CommRecord(7, 4, (RankRecord(3), RankRecord(2, abort_flag=True)), ((0, 4, 1),)),))
    mine = ProcessData(comms=(state,))
    legs = [folded([(p2, first)]), folded([(p3, ProcessData()), (p2, second), (ROOT, second)])]
    known: dict[bytes, RankState] = {}
    parts = [gather.own_part(ROOT, mine)]
    for leg in legs:
        msg = through_the_wire(wire.CollResp(ROOT, 1, 0, leg.count, leg.encode()))
        parts.append(msg.fold.decoded(known))
    responses, states = gather.responses_of(parts)
    assert list(responses) == [ROOT, p2, p3]
    snapshot = JobSnapshot(peers=(), responses=responses, states=states)
    assert snapshot.contributions() == {ROOT: mine, p2: first, p3: ProcessData()}
    rows = sorted((p, r, d) for m in states.values() for p, r, d, _ in m.rows())
    assert rows == [(0, 0, -1), (0, 1, -1), (1, 2, 2)]  # rank 3 and the aborted rank 2 of the second answers: gone
    (comm,) = build_report(snapshot).communicators
    assert [r.comm_rank for r in comm.ranks] == [0, 1, 2] and comm.status_bits == Status.RUNNING | Status.NOCOMM


# ----------------------------------------------------------------------------------------------------------------
# 4. Malformed folds: a ProtocolError, at a relay the structure, at the root the records and states


def state_key(
    comm_hash: int = 7,
    size: int = 4,
    rank_map: tuple[tuple[int, int, int], ...] = ((0, 4, 1),),
    init_state: int = 0,
    async_error: int = 0,
    flags: int = 0,
    nops: int = N_OPS,
    launched: tuple[int, ...] = COUNTS[1],
    completed: tuple[int, ...] = COUNTS[1],
) -> bytes:
    """A state as the wire carries it (wire.py, "Folds"), written from the format, not by the code under test."""
    out = struct.pack("!QIH", comm_hash, size, len(rank_map))
    for run in rank_map:
        out += struct.pack("!iIi", *run)
    out += struct.pack("!BBBB", init_state, async_error, flags, nops)
    return out + struct.pack(f"!{len(launched)}Q", *launched) + struct.pack(f"!{len(completed)}Q", *completed)


def fold_bytes(records: bytes, states: Sequence[tuple[bytes, Sequence[tuple[int, int, int, int]]]]) -> bytes:
    """A fold's bytes from its parts: the records' length and the records, then each state with its four
    little-endian columns (process u32, communicator rank u32, device i16, idle ms u32)."""
    out = struct.pack("!I", len(records)) + records + struct.pack("!I", len(states))
    for key, rows in states:
        out += struct.pack("!H", len(key)) + key + struct.pack("!I", len(rows))
        for column, fmt in enumerate("IIhI"):
            out += b"".join(struct.pack("<" + fmt, row[column]) for row in rows)
    return out


P2, P6 = Addr("10.0.0.2", 7), Addr("fe80::1", 65535)
RECORDS = wire.encode_entry(ROOT, ProcessData()) + wire.encode_entry(P2, ProcessData(waiting=True))
ROWS = [(0, 3, 1, 10), (1, 0, -1, U32)]


def more_states(raw: bytes) -> bytes:
    """``raw`` with its count of states one more than it holds."""
    at = 4 + len(RECORDS)
    (n,) = struct.unpack_from("!I", raw, at)
    return raw[:at] + struct.pack("!I", n + 1) + raw[at + 4 :]


def test_the_fold_format_is_the_documented_one():
    data = ProcessData(
        comms=(
            CommRecord(
                7, 4, (RankRecord(3, device=1, launched=COUNTS[1], completed=COUNTS[1], idle_ms=10),), ((0, 4, 1),)
            ),
        )
    )
    other = ProcessData(
        comms=(CommRecord(7, 4, (RankRecord(0, launched=COUNTS[1], completed=COUNTS[1], idle_ms=U32),), ((0, 4, 1),)),),
        waiting=True,
    )
    fold = folded([(ROOT, data), (P2, other)])
    assert fold.encode() == fold_bytes(RECORDS, [(state_key(), ROWS)])


RICH = [
    (
        P6,
        ProcessData(
            comms=(
                CommRecord(
                    U64, 4, (RankRecord(0, async_error=7, abort_flag=True, device=3), RankRecord(3)), RANK_MAPS[2]
                ),
                CommRecord(5, 1, (RankRecord(0, launched=COUNTS[3], idle_ms=U32),)),
            ),
            restart=RestartRecord(2, 1, "PEER_DEAD of rank 2", (2,), 0.5),
            where=(Frame("train.py", 31, "step"), Frame("é" * 20, U32, "λ")),
        ),
    ),
    (ROOT, ProcessData(waiting=True)),
    (P2, ProcessData(comms=(CommRecord(U64, 4, (RankRecord(1),), RANK_MAPS[2]),))),
]


def relayed() -> wire.Fold:
    """A relay's fold: its own entry, then a leg's (from the wire) that shares a state with it."""
    fold = folded(RICH[:1])
    leg = folded(RICH[1:])
    fold.merge(wire.CollResp(ROOT, 1, 0, leg.count, leg.encode()).fold)
    return fold


@pytest.mark.parametrize("fold", [folded(RICH), relayed()], ids=["added", "merged"])
def test_every_truncation_of_a_folded_collresp_is_a_protocol_error(fold):
    body = wire.encode(wire.CollResp(ROOT, 1, 0, fold.count, fold.encode()))[4:]
    assert len(wire.decode_body(body).fold.decoded()[0]) == 3  # whole, it decodes
    for cut in range(len(body)):
        with pytest.raises(wire.ProtocolError):
            msg = wire.decode_body(body[:cut])
            assert isinstance(msg, wire.CollResp)
            msg.fold.decoded()


@pytest.mark.parametrize(
    ("count", "raw"),
    [
        (2, fold_bytes(RECORDS, [(state_key(), [(2, 0, 0, 0)])])),  # a process the fold does not hold
        (2, fold_bytes(RECORDS, [(state_key(), [(0, 0, 0, 0), (U32, 1, 0, 0)])])),
        (2, fold_bytes(RECORDS, [(state_key(), [])])),  # a state with no rank
        (2, fold_bytes(RECORDS, [(state_key(), ROWS), (state_key(), [(0, 1, 0, 0)])])),  # a state twice
        (2, fold_bytes(RECORDS, [(state_key(), ROWS)]) + b"\x00"),  # trailing bytes
        (2, fold_bytes(RECORDS, [(state_key(), ROWS)])[:-1]),
        (2, more_states(fold_bytes(RECORDS, [(state_key(), ROWS)]))),  # two states said, one there
        (0, fold_bytes(RECORDS, [(state_key(), ROWS)])),  # no process, yet bytes
        (0, b"\x00"),
    ],
    ids=[
        "proc-is-count",
        "proc-u32-max",
        "no-rows",
        "state-twice",
        "trailing",
        "cut",
        "more-states",
        "count-0",
        "count-0-byte",
    ],
)
def test_a_malformed_fold_structure_is_refused_by_a_relay(count, raw):
    msg = through_the_wire(wire.CollResp(ROOT, 1, 0, count, raw)) if count else wire.CollResp(ROOT, 1, 0, 0, raw)
    with pytest.raises(wire.ProtocolError):
        msg.fold  # noqa: B018 - decoding is the point
    with pytest.raises(wire.ProtocolError):
        wire.Fold.decode(count, raw)


def passes_a_relay_fails_at_the_root(count: int, raw: bytes) -> None:
    """``raw`` passes a relay (its structure is sound: the relay merges it into its own fold without decoding a
    process or a state, and passes it on), and the root refuses it."""
    leg = through_the_wire(wire.CollResp(ROOT, 1, 0, count, raw)).fold
    assert leg.count == count and leg.size == len(raw)
    relay = folded([(Addr("10.0.0.9", 9), ProcessData(comms=(CommRecord(7, 4, (RankRecord(0),), ((0, 4, 1),)),)))])
    relay.merge(leg)
    up = through_the_wire(wire.CollResp(ROOT, 1, 0, relay.count, relay.encode())).fold
    with pytest.raises(wire.ProtocolError):
        leg.decoded()
    with pytest.raises(wire.ProtocolError):
        up.decoded({})
    with pytest.raises(wire.ProtocolError):
        up.entries()


@pytest.mark.parametrize(
    "key",
    [
        state_key(nops=N_OPS - 1, launched=COUNTS[1][:-1], completed=COUNTS[1][:-1]),
        state_key(nops=N_OPS - 1),  # the op count says one fewer than the counters there are
        state_key(flags=8),
        state_key(flags=255),
        state_key() + b"\x00",  # a byte after the counters
        state_key()[:-1],
        b"",
    ],
    ids=["ops-11", "ops-11-long", "flags-8", "flags-255", "key-trailing", "key-cut", "key-empty"],
)
def test_a_bad_state_passes_a_relay_and_is_refused_by_the_root(key):
    passes_a_relay_fails_at_the_root(2, fold_bytes(RECORDS, [(key, ROWS)]))


@pytest.mark.parametrize(
    ("count", "records"),
    [
        (1, b"\xff" * 20),  # not an address
        (2, RECORDS[:-1]),  # the last record cut
        (3, RECORDS),  # fewer records than processes
        (1, RECORDS),  # more records than processes
        (2, RECORDS + b"\x00"),
        (
            2,
            wire.encode_entry(ROOT, ProcessData(RICH[0][1].comms))
            + RECORDS[len(wire.encode_entry(ROOT, ProcessData())) :],
        ),
        (2, RECORDS[:-2] + b"\x02\x00"),  # the second process's "waiting" is not a boolean
    ],
    ids=["garbage", "cut", "too-few", "too-many", "trailing", "communicators-outside", "bad-boolean"],
)
def test_garbage_process_records_pass_a_relay_and_are_refused_by_the_root(count, records):
    passes_a_relay_fails_at_the_root(count, fold_bytes(records, [(state_key(), [(0, 3, 1, 10)])]))


@settings(max_examples=200, deadline=None)
@given(
    fold=st.sampled_from([folded(RICH), relayed()]),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=3),
)
def test_a_folded_collresp_with_bytes_changed_decodes_or_raises_protocol_error(fold, flips):
    body = bytearray(wire.encode(wire.CollResp(ROOT, 1, 0, fold.count, fold.encode()))[4:])
    for pos, x in flips:
        body[pos % len(body)] ^= x
    try:
        msg = wire.decode_body(bytes(body))
        assert isinstance(msg, wire.CollResp)
        msg.fold.decoded()
    except wire.ProtocolError:
        pass


# ----------------------------------------------------------------------------------------------------------------
# 5. The report classifies states as it would the ranks one by one


@dataclass
class Reference:
    """A communicator merged rank by rank, in process order (the merge before folds): each rank's first report, and
    the rank maps in the order the records carrying them come once the communicator holds a rank."""

    ranks: dict[int, tuple[Addr, RankRecord]] = field(default_factory=dict)
    maps: list[tuple[tuple[int, int, int], ...]] = field(default_factory=list)

    def global_rank(self, comm_rank: int) -> int | None:
        """The first map that tells (the arithmetic is ``comms.mapped_rank``'s; their order is what is checked)."""
        return next((g for g in (mapped_rank(m, comm_rank) for m in self.maps) if g is not None), None)


def rank_bit(record: RankRecord) -> int:
    if record.abort_flag:
        return 16
    if record.finalize_called or record.destroy_flag:
        return 8
    return 4 if record.init_state == 0 else 2


#: As ``KEYS``, and a hash wider than 64 bits, which is merged with the one it is cut to.
WIDE_KEYS = (*KEYS, ((1 << 64) | 5, 1))


@st.composite
def report_snapshots(draw: st.DrawFn) -> tuple[JobSnapshot, dict[Addr, ProcessData]]:
    """A snapshot, and what each process contributed as drawn."""
    datas = report_datas(lowest_rank=-1, keys=WIDE_KEYS)
    responses = draw(
        st.lists(st.tuples(st.sampled_from(POOL), datas), min_size=1, max_size=8, unique_by=lambda e: e[0])
    )
    peers, dead, left = draw(peer_tables([a for a, _ in responses]))
    return JobSnapshot(peers=peers, dead=dead, left=left, responses=dict(responses)), dict(responses)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(report_snapshots())
def test_the_report_classifies_states_as_it_would_each_rank(drawn):
    assert_classified_rank_by_rank(*drawn)


def assert_classified_rank_by_rank(snapshot: JobSnapshot, contributions: dict[Addr, ProcessData]) -> None:
    """``build_report(snapshot)`` says of each communicator what a merge rank by rank of ``contributions`` (what the
    processes sent, record by record) says."""
    table = {p.addr for p in snapshot.peers}

    def place(addr: Addr) -> tuple[bool, int, bytes, int]:
        ip = ipaddress.ip_address(addr.host)
        return (addr not in table, ip.version, ip.packed, addr.port)

    merged: dict[tuple[int, int], Reference] = {}
    for addr in sorted(contributions, key=place):
        for comm in contributions[addr].comms:
            key = (comm.comm_hash & HASH_MASK, comm.size)
            for rank in comm.ranks:
                if 0 <= rank.comm_rank < comm.size:
                    merged.setdefault(key, Reference()).ranks.setdefault(rank.comm_rank, (addr, rank))
            if key in merged and comm.rank_map and comm.rank_map not in merged[key].maps:
                merged[key].maps.append(comm.rank_map)

    by_global_rank = {p.rank: p for p in snapshot.peers if p.rank >= 0}
    silent = [p for p in snapshot.peers if p.addr not in snapshot.dead | snapshot.left | set(contributions)]
    everyone_answered = not silent and not snapshot.dead
    report = build_report(snapshot)
    assert {(c.comm_hash, c.size) for c in report.communicators} == set(merged)
    for comm in report.communicators:
        ref = merged[(comm.comm_hash, comm.size)]
        assert {r.comm_rank: (r.addr, r.record) for r in comm.ranks} == ref.ranks
        assert comm.present == len(ref.ranks)
        first = min(ref.ranks, key=lambda r: (place(ref.ranks[r][0]), r))
        assert (comm.reference.comm_rank, comm.reference.addr, comm.reference.record) == (first, *ref.ranks[first])

        missing = []
        for r in range(comm.size):
            if r in ref.ranks:
                continue
            g = ref.global_rank(r)
            process = by_global_rank.get(g) if g is not None else None
            nocomm = everyone_answered or (
                process is not None and (process.addr in contributions or process.addr in snapshot.left)
            )
            missing.append((r, g, process, "NOCOMM" if nocomm else "INCOMPLETE"))
        assert [(m.comm_rank, m.global_rank, m.process, m.reason.value) for m in comm.missing] == missing

        records = [record for _, record in ref.ranks.values()]
        bits = 0
        for record in records:
            bits |= rank_bit(record)
        if any(reason == "NOCOMM" for *_, reason in missing):
            bits |= 1
        assert comm.status_bits == Status(bits)
        totals = {sum(record.launched) for record in records}
        errors = 0
        if bin(bits).count("1") > 1 or len(totals) > 1:
            errors |= 1
        if any(record.init_state not in (0, 7) or record.async_error not in (0, 7) for record in records):
            errors |= 2
        if any(reason == "INCOMPLETE" for *_, reason in missing):
            errors |= 4
        assert comm.errors == CommErrors(errors)
        ops = tuple(op for op in range(N_OPS) if len({record.launched[op] for record in records}) > 1)
        assert comm.mismatched_ops == (ops if len(totals) > 1 else ())

        per_node = Counter(addr.host for addr, _ in ref.ranks.values())
        assert (comm.node_count, comm.ranks_per_node_min, comm.ranks_per_node_max) == (
            len(per_node),
            min(per_node.values()),
            max(per_node.values()),
        )
    for group in report.groups:
        pairs = {
            (addr, record.device)
            for comm in group.communicators
            for addr, record in merged[(comm.comm_hash, comm.size)].ranks.values()
        }
        assert group.ranks_in_group == len(pairs)
        assert group.ranks_per_node_min == min(c.ranks_per_node_min for c in group.communicators)
        assert group.ranks_per_node_max == max(c.ranks_per_node_max for c in group.communicators)


def test_ranks_in_group_counts_each_process_and_device_once_over_the_groups_communicators():
    a, b = Addr("10.0.0.1", 1), Addr("10.0.0.1", 2)
    same = ProcessData(
        comms=(
            CommRecord(7, 4, (RankRecord(0, device=0), RankRecord(1, device=0)), ()),
            CommRecord(8, 4, (RankRecord(0, device=0), RankRecord(1, device=2, async_error=7)), ()),
        )
    )
    apart = ProcessData(
        comms=(
            CommRecord(7, 4, (RankRecord(2, device=0), RankRecord(3, device=1)), ()),
            CommRecord(8, 4, (RankRecord(3, device=1), RankRecord(2, device=1)), ()),
        )
    )
    report = build_report(JobSnapshot(peers=(), responses={a: same, b: apart}))
    (group,) = report.groups
    # (a, 0), (a, 2), (b, 0), (b, 1): communicator 8's ranks are in two states, and so are its groups' pairs.
    assert [c.present for c in group.communicators] == [4, 4] and group.ranks_in_group == 4


def test_a_rank_map_counts_from_the_first_process_that_carries_it():
    r, q, v, t, s, u = (Addr("10.0.0.1", port) for port in range(1, 7))
    short, mine, other = ((100, 1, 1),), ((200, 3, 1),), ((300, 3, 1),)
    contributions = {
        r: ProcessData(comms=(CommRecord(7, 3, (RankRecord(0),), short),)),
        q: ProcessData(comms=(CommRecord(7, 3, (RankRecord(0),), mine),)),  # rank 0 again: r's is kept
        v: ProcessData(comms=(CommRecord(7, 3, (RankRecord(5),), other),)),  # out of range: only its map counts
        t: ProcessData(comms=(CommRecord(7, 3, (RankRecord(1),), mine),)),  # q's state: it keeps t's rank 1
    }
    peers = (
        *(PeerInfo(a, pid=i, hostname="h", incarnation=1) for i, a in enumerate((r, q, v, t))),
        PeerInfo(s, pid=5, hostname="h", incarnation=1, rank=202),  # silent: rank 2 (202 by q's map) is INCOMPLETE
        PeerInfo(u, pid=6, hostname="h", incarnation=1, rank=302),  # left: 302 (by v's map) would be NOCOMM
    )
    snapshot = JobSnapshot(peers=peers, left=frozenset({u}), responses=contributions)
    (comm,) = build_report(snapshot).communicators
    # Rank 2 is 202 by q's map (q is before v in process order), whose process is silent: INCOMPLETE. Placing q's
    # map at t's place (the rank its state keeps) would take v's map first: 302, whose process left, so NOCOMM.
    assert [(m.comm_rank, m.global_rank, m.reason.value) for m in comm.missing] == [(2, 202, "INCOMPLETE")]
    assert_classified_rank_by_rank(snapshot, contributions)


def test_the_report_does_not_depend_on_the_order_of_responses_when_a_process_reports_a_rank_twice():
    a, b = Addr("10.0.0.1", 1), Addr("10.0.0.1", 2)
    twice = ProcessData(comms=(CommRecord(7, 2, (RankRecord(0), RankRecord(0, abort_flag=True), RankRecord(1)), ()),))
    other = ProcessData(comms=(CommRecord(7, 2, (RankRecord(1, abort_flag=True),), ()),))
    peers = (PeerInfo(a, 1, "h", 1), PeerInfo(b, 2, "h", 1))
    one = build_report(JobSnapshot(peers=peers, responses={a: twice, b: other}))
    two = build_report(JobSnapshot(peers=peers, responses={b: other, a: twice}))
    # Which of a's two records of rank 0 is kept follows the states' own order (merge_communicators), the same
    # whichever answer came first: an order of arrival would make one report RUNNING and the other RUNNING | ABORT.
    assert one.communicators[0].status_bits == two.communicators[0].status_bits == Status.RUNNING


# ----------------------------------------------------------------------------------------------------------------
# 6. The stuck detector reads states


#: (launched, completed) pairs: alike, behind, inside.
PAIRS = (
    (counts(AllReduce=5), counts(AllReduce=5)),
    (counts(AllReduce=6), counts(AllReduce=5)),
    (counts(AllReduce=6), counts(AllReduce=6)),
    (counts(AllReduce=5, Broadcast=1), counts(AllReduce=5, Broadcast=1)),
    (counts(Broadcast=2), counts(Broadcast=1)),
)
STUCK_MAP = ((100, 8, 2),)


@st.composite
def spread(draw: st.DrawFn, size: int, counters: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> JobSnapshot:
    """A snapshot of communicator 77 whose ranks hold ``counters``, spread over processes, records and states: what
    else a rank reports (flags, device, idle time) and which process holds it are drawn."""
    held: dict[int, list[RankRecord]] = {}
    for r, (launched, completed) in counters.items():
        finalize, destroy, abort = draw(st.sampled_from(FLAGS))
        record = RankRecord(
            r,
            init_state=draw(st.sampled_from([0, 0, 7])),
            finalize_called=finalize,
            destroy_flag=destroy,
            abort_flag=abort,
            device=draw(st.sampled_from([-1, 0, 1])),
            launched=launched,
            completed=completed,
            idle_ms=draw(st.sampled_from([0, 10, 5000])),
        )
        held.setdefault(draw(st.integers(0, 3)), []).append(record)
    responses = {}
    for proc, records in held.items():
        cut = draw(st.integers(1, len(records)))
        comms = [CommRecord(77, size, tuple(records[:cut]), STUCK_MAP)]
        if cut < len(records):
            comms.append(CommRecord(77, size, tuple(records[cut:]), STUCK_MAP))
        responses[Addr("10.0.0.1", 100 + proc)] = ProcessData(comms=tuple(comms))
    return JobSnapshot(peers=(), responses=responses)


def merged_one(snapshot: JobSnapshot) -> MergedCommunicator:
    (comm,) = merge_communicators(snapshot)
    return comm


@st.composite
def two_sweeps(draw: st.DrawFn) -> tuple[dict, JobSnapshot, dict, JobSnapshot]:
    size = draw(st.integers(1, 6))
    ranks = draw(st.lists(st.integers(0, size - 1), unique=True, min_size=1))
    before = {r: draw(st.sampled_from(PAIRS)) for r in ranks}
    after = {r: draw(st.sampled_from([before[r], before[r], *PAIRS])) for r in ranks}
    if draw(st.booleans()) and len(after) > 1:
        del after[draw(st.sampled_from(sorted(after)))]
    return before, draw(spread(size, before)), after, draw(spread(size, after))


@SETTINGS
@given(two_sweeps())
def test_the_signature_changes_when_and_only_when_a_ranks_counters_change(sweeps):
    before, first, after, second = sweeps
    assert (signature(merged_one(first)) == signature(merged_one(second))) == (before == after)


def test_a_rank_moving_between_states_with_equal_counters_keeps_the_signature():
    launched, completed = PAIRS[1]

    def sweep(aborted: int) -> JobSnapshot:
        ranks = tuple(
            RankRecord(r, abort_flag=r == aborted, launched=launched, completed=completed, idle_ms=r) for r in range(3)
        )
        return JobSnapshot(peers=(), responses={ROOT: ProcessData(comms=(CommRecord(77, 3, ranks, STUCK_MAP),))})

    one, two = merged_one(sweep(2)), merged_one(sweep(0))
    assert sorted(sorted(m.comm_ranks) for _, m in one.states) == [[0, 1], [2]]
    assert sorted(sorted(m.comm_ranks) for _, m in two.states) == [[0], [1, 2]]
    assert signature(one) == signature(two) == ((launched, completed, (0, 1, 2)),)


@st.composite
def stuck_snapshots(draw: st.DrawFn) -> JobSnapshot:
    """Ranks spread over states, some reported by two processes with different counters (the first one counts)."""
    size = draw(st.integers(1, 6))
    ranks = draw(st.lists(st.integers(0, size - 1), unique=True, min_size=1))
    snapshot = draw(spread(size, {r: draw(st.sampled_from(PAIRS)) for r in ranks}))
    again = draw(st.lists(st.sampled_from(ranks), unique=True, max_size=2))
    if again:
        extra = draw(spread(size, {r: draw(st.sampled_from(PAIRS)) for r in again}))
        moved = {Addr("10.0.0.2", a.port): data for a, data in extra.contributions().items()}
        merged = dict(snapshot.contributions())
        merged.update(moved)
        snapshot = JobSnapshot(peers=(), responses=merged)
    return snapshot


@SETTINGS
@given(stuck_snapshots())
def test_attribution_on_states_is_the_one_rank_by_rank(snapshot):
    comm = merged_one(snapshot)
    ranks = {r: reported.record for r, reported in comm.ranks.items()}
    totals = {r: sum(record.launched) for r, record in ranks.items()}
    top = max(totals.values())
    behind = tuple(sorted(r for r, total in totals.items() if total < top))
    inside = tuple(sorted(r for r, record in ranks.items() if sum(record.launched) > sum(record.completed)))
    if not behind and not inside:
        assert attribute(comm) is None
        return
    op = next(
        (
            op
            for op in range(N_OPS)
            if len({record.launched[op] for record in ranks.values()}) > 1
            or any(record.launched[op] > record.completed[op] for record in ranks.values())
        ),
        N_OPS - 1,
    )
    seq = max(record.launched[op] for record in ranks.values())
    expected = StuckVerdict(
        77, op, seq, behind, inside, tuple(100 + 2 * r for r in behind), tuple(100 + 2 * r for r in inside)
    )
    assert attribute(comm) == expected


@given(
    st.lists(st.integers(0, 2**31), max_size=300),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["little", "big"]),
)
def test_raising_a_column_adds_the_offset_to_each_index_and_to_nothing_else(indices, offset, byteorder):
    """``fold.raised``, the relays' and the root's one addition per column, is the same as adding index by index
    (every sum below 2**32, as a fold's are): no lane carries into its neighbour, whatever the byte order."""
    raw = b"".join(i.to_bytes(4, byteorder) for i in indices)
    out = raised(raw, offset, byteorder)
    assert [int.from_bytes(out[k : k + 4], byteorder) for k in range(0, len(out), 4)] == [i + offset for i in indices]


def test_a_relay_passes_a_legs_rows_on_with_their_processes_moved_and_nothing_else_changed():
    """A state in both a relay's own fold and its leg's: the merged fold's rows are the relay's then the leg's, the
    leg's process indices raised by the relay's count, the other columns as they came."""
    relay, leg = wire.Fold(), wire.Fold()

    def comm(ranks: list[int]) -> CommRecord:
        return CommRecord(7, 4, tuple(RankRecord(r, device=r % 2, idle_ms=10 * r) for r in ranks))

    relay.add(Addr("10.0.0.1", 1), ProcessData(comms=(comm([0]),)))
    relay.add(Addr("10.0.0.1", 2), ProcessData(comms=(comm([1]),)))
    for port, r in ((3, 2), (4, 3)):
        leg.add(Addr("10.0.0.2", port), ProcessData(comms=(comm([r]),)))
    relay.merge(wire.Fold.decode(leg.count, leg.encode()))
    addrs, _, states = wire.Fold.decode(relay.count, relay.encode()).decoded()
    ((_, members),) = states.items()
    assert [addrs[p].port for p in members.procs] == [1, 2, 3, 4]
    assert list(members.comm_ranks) == [0, 1, 2, 3] and list(members.devices) == [0, 1, 0, 1]
    assert list(members.idle_ms) == [0, 10, 20, 30] and relay.size == len(relay.encode())


@given(
    st.lists(
        st.tuples(
            st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(str),
            st.integers(0, 65535),
            st.sampled_from([ProcessData(), ProcessData(waiting=True), ProcessData(restart=RestartRecord(3, 1))]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_the_roots_one_call_reading_of_records_is_the_record_by_record_one(entries):
    """``wire._ipv4_bare`` (every record an IPv4 address with nothing but communicators, read in one call) gives
    what ``wire._records`` gives, and declines any fold where one record is of another kind."""
    fold = wire.Fold()
    for host, port, data in entries:
        fold.add(Addr(host, port), data)
    buf = b"".join(fold.processes)
    fast = wire._ipv4_bare(buf, fold.count)
    slow = wire._records(buf, fold.count)
    simple = all(":" not in host and data.restart is None for host, _, data in entries)
    assert (fast is not None) == simple
    if fast is not None:
        assert fast == slow
    assert wire.Fold.decode(fold.count, fold.encode()).decoded()[:2] == slow
