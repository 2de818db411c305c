"""sweeper.py alone: who sweeps, when, what a sweep's snapshot makes of communicator verdicts, and holding them."""

from rasd.core.actions import Emit
from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord
from rasd.core.effects import SWEEP_QUERY, OriginateComm, StartGather
from rasd.core.events import Event, Kind
from rasd.core.snapshot import JobSnapshot
from rasd.core.stuck import StuckVerdict
from rasd.core.sweeper import Sweeper

from .world import FakeWorld, peer

P1, P2, P3 = peer(1), peer(2), peer(3)
COMM = CommRecord(77, 2, (RankRecord(0),), rank_map=((10, 2, 1),))
V = StuckVerdict(77, 0, 1, (1,), (0,), (11,), (10,))


def _sweeper(me=P1, comms=(COMM,)):
    world = FakeWorld(me, [P1, P2, P3])
    world.local_data = lambda: ProcessData(comms=comms)
    return world, Sweeper(world)


def _counts(launched: int, completed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (launched,) + (0,) * (N_OPS - 1), (completed,) + (0,) * (N_OPS - 1)


def _snapshot(rank1_launched: int) -> JobSnapshot:
    """Rank 0 launched one broadcast it has not completed; rank 1 launched ``rank1_launched``; both idle 30 s."""
    l0, c0 = _counts(1, 0)
    l1, c1 = _counts(rank1_launched, rank1_launched)
    comm = CommRecord(
        77,
        2,
        (
            RankRecord(0, launched=l0, completed=c0, idle_ms=30_000),
            RankRecord(1, launched=l1, completed=c1, idle_ms=30_000),
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
    assert s.tick(sweep) == [StartGather(SWEEP_QUERY)]
    assert s.tick(3 * sweep) == []  # its gather has not ended
    s.swept(JobSnapshot(peers=()), 3 * sweep)
    assert s.tick(3 * sweep) == [StartGather(SWEEP_QUERY)]  # overdue: at once


def test_a_sweeper_that_holds_no_communicator_does_not_gather():
    world, s = _sweeper(comms=())
    s.start(0.0)
    assert s.tick(world.timers.sweep) == []
    world.local_data = lambda: ProcessData(comms=(COMM,))
    assert s.tick(world.timers.sweep + 0.1) == []  # the next sweep is a sweep later
    assert s.tick(2 * world.timers.sweep) == [StartGather(SWEEP_QUERY)]


def test_another_process_does_not_sweep():
    world, s = _sweeper(P2)
    s.start(0.0)
    assert s.tick(100.0) == []


def test_a_stuck_communicator_is_announced_once_refreshed_each_sweep_and_cleared_when_it_moves():
    world, s = _sweeper()
    assert s.swept(_snapshot(0), 5.0) == []  # the first sight: counters idle 30 s, not yet seen unchanged
    stuck = Event(kind=Kind.COMM_STUCK, at=10.0, details=V.describe(), comm_hash=77, ranks=(11, 10))
    assert s.swept(_snapshot(0), 10.0) == [Emit(stuck), OriginateComm(V, stuck=True)]
    assert s.stuck == {77: (V, 10.0)} and s.standing() == {77: V}
    assert s.swept(_snapshot(0), 15.0) == [OriginateComm(V, stuck=True)]  # re-flooded, not announced again
    assert s.stuck == {77: (V, 15.0)}
    recovered = Event(kind=Kind.COMM_RECOVERED, at=20.0, details="counters moving again", comm_hash=77, ranks=(11, 10))
    assert s.swept(_snapshot(1), 20.0) == [Emit(recovered), OriginateComm(V, stuck=False)]
    assert s.stuck == {}


def test_an_expelled_sweeper_ends_its_sweep_quietly():
    world, s = _sweeper()
    s.start(0.0)
    s.tick(world.timers.sweep)
    world.expelled = True
    assert s.swept(_snapshot(0), 10.0) == []
    world.expelled = False
    assert s.tick(2 * world.timers.sweep) == [StartGather(SWEEP_QUERY)]


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
