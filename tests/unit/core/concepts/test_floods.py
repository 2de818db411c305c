"""floods.py alone: flood ids, dedup, and what a node does with a verdict flood it sees first, as effects."""

import pytest

from rasd.core import wire
from rasd.core.effects import (
    Broadcast,
    Dead,
    Expel,
    Heard,
    HoldStuck,
    Hung,
    Left,
    Notify,
    Outvoted,
    Recovered,
    ReleaseStuck,
    Suspect,
    Vouch,
)
from rasd.core.events import Kind
from rasd.core.floods import Floods
from rasd.core.liveness import REFUTE
from rasd.core.stuck import StuckVerdict

from .world import FakeWorld, peer

ME, P2, P3, P4 = peer(1), peer(2), peer(3), peer(4)
P3_NEW = peer(3, incarnation=9003)
K = wire.FloodKind


def _floods():
    world = FakeWorld(ME, [P2, P3, P4])
    conn = world.add_conn(7, P2)
    return world, Floods(world), conn


def _flood(kind, subject=P3, origin=P2, flood_id=1, stamp=0.0):
    return wire.Flood(origin.addr, flood_id, kind, subject.addr, subject.incarnation, stamp)


def test_originate_numbers_every_flood_from_this_node():
    _, f, _ = _floods()
    assert f.originate(K.DEAD, P3.key) == [Broadcast(_flood(K.DEAD, origin=ME, flood_id=1), None)]
    assert f.originate(K.HUNG, P4.key, 4.5) == [Broadcast(_flood(K.HUNG, P4, ME, 2, 4.5), None)]
    v = StuckVerdict(5, 0, 1, (0,), ())
    assert f.originate_comm(v, stuck=True) == [Broadcast(wire.CommVerdict(ME.addr, 3, True, v), None)]


def test_a_flood_is_applied_and_passed_on_once():
    _, f, conn = _floods()
    msg = _flood(K.DEAD)
    assert f.on_flood(conn, msg, 1.0) == [Dead(P3.key, None, flood=False), Broadcast(msg, 7)]
    assert f.on_flood(conn, msg, 2.0) == []
    (ours,) = f.originate(K.LEFT, P4.key)
    assert f.on_flood(conn, ours.msg, 3.0) == []  # our own flood coming back


def test_seed_46_a_flood_whose_origin_we_hold_dead_is_neither_applied_nor_passed_on():
    world, f, conn = _floods()
    world.dead.add(P4.key)
    for kind in K:
        assert f.on_flood(conn, _flood(kind, origin=P4, flood_id=int(kind)), 1.0) == []
    # A newer process at the dead one's address is somebody else: its floods count.
    world.merge(peer(4, incarnation=9004))
    assert f.on_flood(conn, _flood(K.DEAD, origin=P4, flood_id=99), 2.0)[0] == Dead(P3.key, None, flood=False)


def test_dead_about_us_is_passed_on_first_then_expels_us():
    _, f, conn = _floods()
    msg = _flood(K.DEAD, subject=ME)
    assert f.on_flood(conn, msg, 1.0) == [Broadcast(msg, 7), Expel()]


def test_hung_about_us_is_refuted_with_our_own_clock():
    _, f, conn = _floods()
    assert f.on_flood(conn, _flood(K.HUNG, subject=ME, stamp=3.0), 42.0) == [
        Broadcast(_flood(K.RECOVERED, subject=ME, origin=ME, flood_id=1, stamp=42.0), None)
    ]


@pytest.mark.parametrize("kind", [K.LEFT, K.RECOVERED, K.HEARD])
def test_other_verdicts_about_us_stop_here(kind):
    _, f, conn = _floods()
    assert f.on_flood(conn, _flood(kind, subject=ME), 1.0) == []


def test_hung_is_refuted_by_a_keepalive_stamped_well_after_the_verdict():
    world, f, conn = _floods()
    world.clocks[P3.key] = 100.0
    margin = REFUTE * world.timers.hang
    assert f.on_flood(conn, _flood(K.HUNG, stamp=100.0 - margin - 0.5), 1.0) == [
        Broadcast(_flood(K.RECOVERED, origin=ME, flood_id=1, stamp=100.0), None)  # ours; the HUNG stops here
    ]
    stale = _flood(K.HUNG, flood_id=2, stamp=100.0 - margin)  # not fresher by REFUTE: applied
    assert f.on_flood(conn, stale, 2.0) == [Hung(P3.key, "peer silent beyond the hang limit"), Broadcast(stale, 7)]


def test_hung_overtaken_by_a_fresher_recovered_is_old_news():
    world, f, conn = _floods()
    world.recoveries[P3.key] = 50.0
    assert f.on_flood(conn, _flood(K.HUNG, stamp=10.0), 1.0) == []
    unstamped = _flood(K.HUNG, flood_id=2, stamp=0.0)  # no claim about P3's clock: nothing refutes it
    assert f.on_flood(conn, unstamped, 1.0) == [
        Hung(P3.key, "peer silent beyond the hang limit"),
        Broadcast(unstamped, 7),
    ]


def test_hung_about_a_peer_whose_training_the_jobs_collectives_show_is_not_applied_but_passed_on():
    world, f, conn = _floods()
    world.moved = (3, None)
    msg = _flood(K.HUNG, stamp=5.0)
    assert f.on_flood(conn, msg, 50.0) == [
        Notify(
            Kind.PEER_UNRESPONSIVE,
            P3.key,
            "peer silent for 10s, but 3 collectives that need it completed here since: its training runs, no verdict",
        ),
        Broadcast(msg, 7),
    ]


def test_left_and_recovered_are_applied_and_passed_on():
    _, f, conn = _floods()
    left = _flood(K.LEFT, flood_id=1)
    recovered = _flood(K.RECOVERED, subject=P4, flood_id=2, stamp=7.0)
    assert f.on_flood(conn, left, 1.0) == [Left(P3.key), Broadcast(left, 7)]
    assert f.on_flood(conn, recovered, 1.0) == [Recovered(P4.key), Vouch(P4.key, 7.0), Broadcast(recovered, 7)]


def test_seed_471_heard_vouches_clears_the_suspicion_and_goes_on():
    # HEARD, not RECOVERED, is what clears a suspicion: RECOVERED only says "heard after the HUNG's origin did", which
    # may be long ago (sweep seed 471).
    _, f, conn = _floods()
    heard = _flood(K.HEARD, flood_id=1, stamp=9.0)
    assert f.on_flood(conn, heard, 1.0) == [Vouch(P3.key, 9.0), Heard(P3.key), Broadcast(heard, 7)]
    recovered = _flood(K.RECOVERED, flood_id=2, stamp=9.0)
    assert not any(isinstance(e, Heard) for e in f.on_flood(conn, recovered, 1.0))


def test_suspect_and_outvoted_go_to_their_rooms_with_the_connection():
    world, f, conn = _floods()
    suspect = _flood(K.SUSPECT, subject=P3, flood_id=1)
    assert f.on_flood(conn, suspect, 1.0) == [Suspect(7, suspect, P3.key)]
    about_us = _flood(K.SUSPECT, subject=ME, flood_id=2)
    assert f.on_flood(conn, about_us, 1.0) == [Suspect(7, about_us, ME.key)]  # the suspect answers it
    world.dead.add(P4.key)
    assert f.on_flood(conn, _flood(K.SUSPECT, subject=P4, flood_id=3), 1.0) == []  # gone already
    outvoted = _flood(K.OUTVOTED, subject=P4, flood_id=4)
    assert f.on_flood(conn, outvoted, 1.0) == [Outvoted(7, outvoted, P4.key)]


def test_verdicts_about_a_stale_gone_or_unknown_process_are_dropped():
    world, f, conn = _floods()
    world.merge(P3_NEW)
    world.dead.add(P4.key)
    assert f.on_flood(conn, _flood(K.DEAD, subject=P3, flood_id=1), 1.0) == []  # an older incarnation
    assert f.on_flood(conn, _flood(K.HUNG, subject=P4, flood_id=2), 1.0) == []  # already dead
    assert f.on_flood(conn, _flood(K.DEAD, subject=peer(9), flood_id=3), 1.0) == []  # unknown


def test_comm_verdicts_are_held_or_released_and_passed_on_once():
    _, f, conn = _floods()
    v = StuckVerdict(5, 0, 1, (0,), ())
    stuck = wire.CommVerdict(P2.addr, 1, True, v)
    clear = wire.CommVerdict(P2.addr, 2, False, v)
    assert f.on_comm_verdict(conn, stuck, 1.0) == [HoldStuck(v), Broadcast(stuck, 7)]
    assert f.on_comm_verdict(conn, stuck, 1.0) == []
    assert f.on_comm_verdict(conn, clear, 2.0) == [ReleaseStuck(5, "counters moving again"), Broadcast(clear, 7)]
    # Process floods and communicator floods share the id space of their origin.
    assert f.on_flood(conn, _flood(K.DEAD, origin=P2, flood_id=2), 3.0) == []
