"""sweeper.py alone: who sweeps, when, what a sweep's snapshot makes of communicator verdicts, and holding them;
where each process was in its sweeps (positions), and the positions a verdict carries (stuck.located)."""

import dataclasses

from rasd.core import wire
from rasd.core.actions import Emit
from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord
from rasd.core.effects import SWEEP_QUERY, OriginateComm, StartGather
from rasd.core.events import Event, Kind
from rasd.core.frames import Frame, Position
from rasd.core.snapshot import JobSnapshot, merge_communicators
from rasd.core.stuck import StuckVerdict, attribute, located
from rasd.core.sweeper import DUE_SWEEP_FLOOR, SWEEP_FLAT, Sweeper

from .world import FakeWorld, peer

P1, P2, P3 = peer(1), peer(2), peer(3)
COMM = CommRecord(77, 2, (RankRecord(0),), rank_map=((10, 2, 1),))
V = StuckVerdict(77, 0, 1, (1,), (0,), (11,), (10,))
#: ``V`` as the sweeper makes it in the snapshots below: the counters stood 30 s when first seen (their idle time),
#: against the default idle limit, and judged by that first sweep.
MADE = dataclasses.replace(V, stood_ms=30_000, limit_ms=4_000)


def _sweeper(me=P1, comms=(COMM,)):
    world = FakeWorld(me, [P1, P2, P3])
    world.local_data = lambda: ProcessData(comms=comms)
    return world, Sweeper(world)


def _counts(launched: int, completed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (launched,) + (0,) * (N_OPS - 1), (completed,) + (0,) * (N_OPS - 1)


def _snapshot(rank1_launched: int, idle_ms: int = 30_000) -> JobSnapshot:
    """Rank 0 launched one broadcast it has not completed; rank 1 launched ``rank1_launched``; both idle 30 s."""
    l0, c0 = _counts(1, 0)
    l1, c1 = _counts(rank1_launched, rank1_launched)
    comm = CommRecord(
        77,
        2,
        (
            RankRecord(0, launched=l0, completed=c0, idle_ms=idle_ms),
            RankRecord(1, launched=l1, completed=c1, idle_ms=idle_ms),
        ),
        rank_map=((10, 2, 1),),
    )
    return JobSnapshot(peers=(P1, P2), responses={P1.addr: ProcessData(comms=(comm,))})


def test_the_lowest_live_process_not_known_silent_sweeps():
    world, s = _sweeper(P1)
    assert s.is_sweeper()
    world, s = _sweeper(P3)
    assert not s.is_sweeper()
    world.dead.add(P1.key)
    world.hung.add(P2.key)
    assert s.is_sweeper()
    world.hung.clear()
    world.delayed.add(P2.addr)
    assert s.is_sweeper()
    world.delayed.clear()
    world.left.add(P2.key)
    assert s.is_sweeper()


def test_the_sweeper_gathers_every_sweep_one_gather_at_a_time():
    world, s = _sweeper()
    s.start(0.0)
    sweep = world.timers.sweep
    assert s.tick(sweep - 0.1) == []
    assert s.tick(sweep) == [StartGather(SWEEP_QUERY, ask=wire.Ask.SWEEP)]
    assert s.tick(3 * sweep) == []  # its gather has not ended
    s.swept(JobSnapshot(peers=()), 3 * sweep)
    assert s.tick(3 * sweep) == [StartGather(SWEEP_QUERY, ask=wire.Ask.SWEEP)]  # overdue: at once


def test_a_sweeper_that_holds_no_communicator_does_not_gather():
    world, s = _sweeper(comms=())
    s.start(0.0)
    assert s.tick(world.timers.sweep) == []
    world.local_data = lambda: ProcessData(comms=(COMM,))
    assert s.tick(world.timers.sweep + 0.1) == []  # the next sweep is a sweep later
    assert s.tick(2 * world.timers.sweep) == [StartGather(SWEEP_QUERY, ask=wire.Ask.SWEEP)]


def test_another_process_does_not_sweep():
    world, s = _sweeper(P2)
    s.start(0.0)
    assert s.tick(100.0) == []


def test_a_stuck_communicator_is_announced_once_refreshed_each_sweep_and_cleared_when_it_moves():
    world, s = _sweeper()
    # The first sight: the counters have stood 30 s by the ranks' own idle time, past the limit: named at once.
    stuck = Event(kind=Kind.COMM_STUCK, at=5.0, details=MADE.describe(), comm_hash=77, ranks=(11, 10))
    assert s.swept(_snapshot(0), 5.0) == [Emit(stuck), OriginateComm(MADE, stuck=True)]
    assert s.stuck == {77: (MADE, 5.0)} and s.standing() == {77: MADE}
    assert s.swept(_snapshot(0), 10.0) == [OriginateComm(MADE, stuck=True)]
    assert s.swept(_snapshot(0), 15.0) == [OriginateComm(MADE, stuck=True)]  # re-flooded, not announced again
    assert s.stuck == {77: (MADE, 15.0)}
    recovered = Event(kind=Kind.COMM_RECOVERED, at=20.0, details="counters moving again", comm_hash=77, ranks=(11, 10))
    assert s.swept(_snapshot(1, idle_ms=0), 20.0) == [Emit(recovered), OriginateComm(MADE, stuck=False)]
    assert s.stuck == {}


def test_an_expelled_sweeper_ends_its_sweep_quietly():
    world, s = _sweeper()
    s.start(0.0)
    s.tick(world.timers.sweep)
    world.expelled = True
    assert s.swept(_snapshot(0), 10.0) == []
    world.expelled = False
    assert s.tick(2 * world.timers.sweep) == [StartGather(SWEEP_QUERY, ask=wire.Ask.SWEEP)]


def test_hold_and_release_events():
    _, s = _sweeper(P2)
    held = Event(kind=Kind.COMM_STUCK, at=1.0, details=V.describe(), comm_hash=77, ranks=(11, 10))
    assert s.hold(V, 1.0) == [Emit(held)]
    assert s.hold(V, 2.0) == []
    assert s.release(78, 3.0, "x") == []
    assert s.release(77, 3.0, "why") == [
        Emit(Event(kind=Kind.COMM_RECOVERED, at=3.0, details="why", comm_hash=77, ranks=(11, 10)))
    ]
    assert s.release(77, 4.0, "why") == []


def test_a_verdict_nobody_confirms_expires():
    world, s = _sweeper(P2)
    t = world.timers
    limit = 3 * t.sweep + t.leg_timeout + t.gather_extra
    s.hold(V, 0.0)
    s.forgive(1.0)
    assert s.expire(limit + 1.0) == []
    assert s.expire(limit + 1.1) == [
        Emit(
            Event(
                kind=Kind.COMM_RECOVERED,
                at=limit + 1.1,
                details="verdict no longer confirmed",
                comm_hash=77,
                ranks=(11, 10),
            )
        )
    ]


def test_beyond_sweep_flat_processes_sweeps_and_their_verdicts_last_in_proportion_to_the_job():
    world, s = _sweeper(P1)
    t = world.timers
    assert s.interval() == t.sweep  # 3 processes
    # A job of twice SWEEP_FLAT processes (8 per host): a sweep every 2 sweeps, verdicts held 3 of those.
    world.table.merge([peer(i % 8, host=f"10.1.{i // 8 // 256}.{i // 8 % 256}") for i in range(2 * SWEEP_FLAT - 3)])
    assert len(world.table) == 2 * SWEEP_FLAT and s.interval() == 2 * t.sweep
    s.start(0.0)
    assert s.tick(2 * t.sweep - 0.1) == []
    assert s.tick(2 * t.sweep) == [StartGather(SWEEP_QUERY, ask=wire.Ask.SWEEP)]
    limit = 3 * 2 * t.sweep + t.leg_timeout + t.gather_extra
    s.hold(V, 0.0)
    assert s.expire(limit) == []
    assert [e.event.kind for e in s.expire(limit + 0.1) if isinstance(e, Emit)] == [Kind.COMM_RECOVERED]


# --- positions: where each process's main thread was in a sweep (ProcessData.where, frames.py) --------------------

STEP = Frame("/src/train.py", 31, "step")
NEXT = Frame("/src/data.py", 88, "next_batch")
GET = Frame("/usr/lib/python3.11/queue.py", 171, "get")
REDUCE = Frame("/torch/distributed/c10d.py", 2050, "all_reduce")
WAITING = (STEP, NEXT, GET)  # rank 1, behind: waiting for its data
REDUCING = (STEP, REDUCE)  # rank 0, inside the broadcast


def _split(where0: Position, where1: Position, rank1_launched: int = 0) -> JobSnapshot:
    """``_snapshot``'s counters, with rank 0 in process P1 and rank 1 in P2, each where its process says it is."""
    l0, c0 = _counts(1, 0)
    l1, c1 = _counts(rank1_launched, rank1_launched)

    def comm(rank: int, launched: tuple[int, ...], completed: tuple[int, ...]) -> CommRecord:
        return CommRecord(
            77, 2, (RankRecord(rank, launched=launched, completed=completed, idle_ms=30_000),), rank_map=((10, 2, 1),)
        )

    return JobSnapshot(
        peers=(P1, P2),
        responses={
            P1.addr: ProcessData(comms=(comm(0, l0, c0),), where=where0),
            P2.addr: ProcessData(comms=(comm(1, l1, c1),), where=where1),
        },
    )


def test_a_sweep_keeps_each_process_last_position_with_its_time():
    _, s = _sweeper()
    s.swept(_split(REDUCING, WAITING), 5.0)
    assert s.positions == {P1.addr: (REDUCING, 5.0), P2.addr: (WAITING, 5.0)}
    # P2 sends no position in the next sweep (or does not answer): its last one stays, with its own time.
    s.swept(_split((STEP,), ()), 10.0)
    assert s.positions == {P1.addr: ((STEP,), 10.0), P2.addr: (WAITING, 5.0)}
    assert s.last_position(P2.addr) == WAITING and s.last_position(P3.addr) == ()


def test_the_silent_positions_are_of_processes_that_missed_the_last_sweep_or_are_unresponsive_or_hung():
    world, s = _sweeper()
    sweep = world.timers.sweep
    s.swept(_split(REDUCING, WAITING), 5.0)
    assert s.silent_positions(5.0 + sweep) == []  # both answered the last sweep
    s.swept(_split((STEP,), ()), 5.0 + sweep)  # P2 sends no position: its last one ages
    assert s.silent_positions(5.0 + 1.5 * sweep) == []  # not yet a missed sweep
    assert s.silent_positions(5.0 + 1.6 * sweep) == [(P2, WAITING, 1.6 * sweep)]
    world.delayed.add(P1.addr)  # unresponsive: silent however fresh its position
    world.hung.add(P2.key)
    assert s.silent_positions(5.0 + sweep) == [(P1, (STEP,), 0.0), (P2, WAITING, sweep)]


def test_a_verdict_says_where_the_ranks_behind_were_and_keeps_it_while_it_stands():
    _, s = _sweeper()
    effects = s.swept(_split(REDUCING, WAITING), 10.0)
    located = dataclasses.replace(MADE, positions=((1, WAITING),))  # only rank 1: behind
    stuck = Event(
        kind=Kind.COMM_STUCK,
        at=10.0,
        details=located.describe(),
        comm_hash=77,
        ranks=(11, 10),
        positions=((1, WAITING),),
    )
    assert effects == [Emit(stuck), OriginateComm(located, stuck=True)]
    assert "rank 1 in train.py:31 (step) -> data.py:88 (next_batch) -> queue.py:171 (get)" in stuck.details
    # The next sweep sees rank 1 elsewhere (its counters unchanged): the verdict keeps where it was made.
    assert s.swept(_split(REDUCING, (STEP,)), 15.0) == [OriginateComm(located, stuck=True)]
    assert s.stuck == {77: (located, 15.0)} and s.positions[P2.addr] == ((STEP,), 15.0)


def test_a_verdict_without_positions_is_as_before():
    _, s = _sweeper()
    stuck = Event(kind=Kind.COMM_STUCK, at=10.0, details=MADE.describe(), comm_hash=77, ranks=(11, 10))
    assert s.swept(_split((), ()), 10.0) == [Emit(stuck), OriginateComm(MADE, stuck=True)]
    assert s.positions == {}


def test_located_attaches_the_position_of_each_rank_behind_that_sent_one():
    def comm(rank: int, launched: int) -> CommRecord:
        counts = _counts(launched, launched)
        return CommRecord(77, 4, (RankRecord(rank, launched=counts[0], completed=counts[1]),), rank_map=((10, 4, 1),))

    # Ranks 1 and 2 behind (one broadcast less than ranks 0 and 3); rank 2's process sent no position.
    wheres = {0: REDUCING, 1: WAITING, 2: (), 3: REDUCING}
    procs = [peer(10 + r) for r in range(4)]
    snap = JobSnapshot(
        peers=tuple(procs),
        responses={
            procs[r].addr: ProcessData(comms=(comm(r, 5 if r in (0, 3) else 4),), where=wheres[r]) for r in range(4)
        },
    )
    (merged,) = merge_communicators(snap)
    verdict = attribute(merged)
    assert verdict is not None and verdict.behind == (1, 2) and verdict.positions == ()
    assert located(verdict, merged, snap) == dataclasses.replace(verdict, positions=((1, WAITING),))
    assert located(None, merged, snap) is None
    nowhere = JobSnapshot(
        peers=snap.peers, responses={a: dataclasses.replace(d, where=()) for a, d in snap.responses.items()}
    )
    assert located(verdict, merged, nowhere) == verdict


def test_a_sweep_is_brought_forward_to_when_a_verdict_falls_due_but_never_sooner_than_its_floor():
    """Counters that stood 1 s when first seen (idle limit 4 s): the next sweep comes when the verdict falls due,
    3 s later, not a whole sweep later; one due sooner than the floor brings it no sooner than the floor."""
    for idle_ms, next_sweep in ((1_000, 103.0), (3_900, 100.0 + DUE_SWEEP_FLOOR * 5.0)):
        world, s = _sweeper()
        assert world.timers.sweep == 5.0
        s.start(100.0)
        s.swept(_snapshot(0, idle_ms=idle_ms), 100.0)
        assert s._next_sweep == next_sweep
