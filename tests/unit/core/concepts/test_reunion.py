"""reunion.py alone: sides and how they compare, the acceptor's rulings, probing the ring gap, measuring, and
losing, as effects."""

import pytest

from rasd.core import wire
from rasd.core.effects import Broadcast, Dial, Drop, Expel, Measure, Originate, Purpose, Say, SendTable, Side
from rasd.core.reunion import MEASURED_FOR, PROBE_EVERY, Reunion, spread

from .world import FakeWorld, peer

P = {i: peer(i) for i in range(1, 8)}
LOST = "the larger side of a healed partition holds this process dead"
YOU_ARE_DEAD = wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD)
MEASURE = wire.ConnInitAck(wire.Nack.MEASURE)
OUTNUMBERED = wire.ConnInitAck(wire.Nack.OUTNUMBERED)


def _reunion(me: int = 1, dead=(), n: int = 7):
    world = FakeWorld(P[me], [P[i] for i in range(1, n + 1)])
    world.dead.update(P[i].key for i in dead)
    return world, Reunion(world)


def _probe(i: int, live: int, lowest: int) -> wire.ConnInit:
    return wire.ConnInit(P[i], 0, 0, live, P[lowest].addr)


# --- sides ---------------------------------------------------------------------------------------------------------


def test_more_members_win_and_equal_sides_go_to_the_lower_lowest_address():
    assert Side(5, P[7].addr).beats(Side(4, P[1].addr))
    assert not Side(4, P[1].addr).beats(Side(5, P[7].addr))
    assert Side(4, P[1].addr).beats(Side(4, P[2].addr))
    assert not Side(4, P[2].addr).beats(Side(4, P[1].addr))
    assert not Side(4, P[1].addr).beats(Side(4, P[1].addr))  # strict: a side never beats itself


def test_a_measured_side_stands_for_a_while_and_a_complete_one_only_if_no_leg_was_lost():
    world, r = _reunion()
    limit = MEASURED_FOR * (world.timers.leg_timeout + world.timers.gather_extra)
    assert r.side(0.0) is None
    assert r.measured(Side(4, P[1].addr), False, 10.0) is None
    assert r.side(10.0 + limit) == Side(4, P[1].addr)
    assert r.side(10.0, complete=True) is None
    assert r.side(10.0 + limit + 0.1) is None


# --- the acceptor's rulings ----------------------------------------------------------------------------------------


def test_a_zombie_gets_our_lists_and_you_are_dead():
    world, r = _reunion(dead=[3])
    r.measured(Side(4, P[1].addr), True, 0.0)
    assert r.judge(9, P[3].key, wire.ConnInit(P[3], 0, 0), 1.0) == [SendTable(9), Say(9, YOU_ARE_DEAD), Drop(9)]
    world.dead.clear()
    world.left.add(P[3].key)
    assert r.judge(9, P[3].key, _probe(3, 9, 1), 1.0) == [Say(9, YOU_ARE_DEAD), Drop(9)]  # departed: no lists


def test_a_probe_from_a_process_no_longer_current_is_a_zombie():
    world, r = _reunion(dead=[3])
    world.merge(peer(3, incarnation=9003))
    r.measured(Side(1, P[1].addr), True, 0.0)
    assert r.judge(9, P[3].key, _probe(3, 9, 1), 1.0) == [SendTable(9), Say(9, YOU_ARE_DEAD), Drop(9)]


def test_a_probe_whose_side_is_larger_wins_and_our_side_leaves():
    _, r = _reunion(dead=[3])
    r.measured(Side(3, P[1].addr), True, 0.0)
    assert r.judge(9, P[3].key, _probe(3, 4, 3), 1.0) == [
        Say(9, OUTNUMBERED),
        Drop(9),
        Originate(wire.FloodKind.OUTVOTED, P[3].key),
        Expel(LOST),
    ]


def test_a_probe_whose_side_is_smaller_or_equal_with_a_higher_lowest_loses():
    _, r = _reunion(dead=[3])
    r.measured(Side(3, P[1].addr), True, 0.0)
    for side in ((2, 3), (3, 3)):
        assert r.judge(9, P[3].key, _probe(3, *side), 1.0) == [SendTable(9), Say(9, YOU_ARE_DEAD), Drop(9)]


def test_seeds_55_and_121_a_side_not_measured_lately_is_measured_first():
    # Sides are measured by a reachability gather, never counted from the table: the smaller side of a partition
    # that still held part of the larger side alive counted it as its own, and the larger side left (seeds 55, 121).
    _, r = _reunion(dead=[3])
    # Ours unmeasured: we start a gather, the prober probes again.
    assert r.judge(9, P[3].key, _probe(3, 4, 3), 1.0) == [Measure(), Say(9, MEASURE), Drop(9)]
    # The prober's unmeasured (live 0): only the prober gathers.
    r.measured(Side(3, P[1].addr), True, 1.0)
    assert r.judge(9, P[3].key, _probe(3, 0, 3), 2.0) == [Say(9, MEASURE), Drop(9)]


def test_we_measure_again_before_leaving_if_our_gather_lost_a_leg():
    _, r = _reunion(dead=[3])
    r.measured(Side(3, P[1].addr), False, 0.0)  # a lost leg may have hidden part of our side
    assert r.judge(9, P[3].key, _probe(3, 4, 3), 1.0) == [Measure(), Say(9, MEASURE), Drop(9)]
    assert r.judge(9, P[3].key, _probe(3, 2, 3), 1.0) == [SendTable(9), Say(9, YOU_ARE_DEAD), Drop(9)]  # we win anyway


# --- probing -------------------------------------------------------------------------------------------------------


def test_probe_due_spreads_the_probes_over_the_ring_gap():
    world, r = _reunion(dead=[2, 3, 4, 5, 6])
    every = PROBE_EVERY * world.timers.hang
    assert r.gap() == [P[i].addr for i in (2, 3, 4, 5, 6)]
    order = []
    for turn in range(6):
        (dial,) = r.probe_due(turn * every)
        assert dial.purpose is Purpose.PROBE
        order.append(dial.addr)
        assert r.probe_due(turn * every + every / 2) == []
    assert order == [P[i].addr for i in (2, 5, 3, 6, 4, 2)]  # far apart first, each once in five turns


def test_the_gap_ends_at_the_next_live_process_and_skips_departed_ones():
    world, r = _reunion(dead=[2, 3, 5, 7])
    world.left.add(P[4].key)
    assert r.gap() == [P[i].addr for i in (2, 3, 5)]
    _, r = _reunion(me=7, dead=[1, 2])
    assert r.gap() == [P[1].addr, P[2].addr]  # wraps around the table


def test_no_probe_without_the_dead_while_one_is_out_or_once_leaving():
    world, r = _reunion()
    assert r.probe_due(0.0) == []
    world.dead.add(P[2].key)
    r.dialled(5)
    assert r.is_probe(5)
    assert r.probe_due(100.0) == []
    r.met(5)
    assert not r.is_probe(5)
    assert r.probe_due(200.0) == [Dial(P[2].addr, Purpose.PROBE)]
    r.dialled(6)
    r.forget_conn(6)
    world.leaving = True
    assert r.probe_due(300.0) == []


@pytest.mark.parametrize("n", range(1, 25))
def test_spread_probes_every_member_of_the_gap_once_in_n_turns(n):
    assert sorted(spread(t, n) for t in range(n)) == list(range(n))


def test_a_probe_answered_measure_is_made_again_once_our_gather_ended():
    world, r = _reunion(dead=[3])
    keepalive = world.timers.keepalive
    assert r.measure(100.0, again=P[3].addr) == [Measure()]
    assert r.probe_due(100.0 + keepalive - 0.1) == []
    world.gathering = True
    assert r.probe_due(100.0 + keepalive) == []  # our own gather first: the probe carries its measure
    world.gathering = False
    assert r.probe_due(100.0 + keepalive) == [Measure()]  # it ended without a complete measure: once more
    r.measured(Side(4, P[1].addr), True, 101.5)
    assert r.probe_due(102.0) == [Dial(P[3].addr, Purpose.PROBE)]
    assert r.probe_due(102.5) == []  # done; the next probe of the gap comes at its own time


def test_a_second_measure_from_the_same_process_waits_a_gather_hard_limit():
    world, r = _reunion(dead=[3])
    r.measured(Side(4, P[1].addr), True, 0.0)
    assert r.measure(1.0, again=P[3].addr) == []  # measured lately: no gather, just the wait
    assert r.measure(2.0, again=P[3].addr) == []
    hard = world.timers.leg_timeout + world.timers.gather_extra
    assert r.probe_due(2.0 + hard - 0.1) == []
    world.dead.clear()
    assert r.probe_due(2.0 + hard) == []  # no longer dead: no probe
    r.answered()
    world.dead.add(P[3].key)
    assert r.measure(3.0, again=P[3].addr) == []
    assert r.probe_due(3.0 + world.timers.keepalive - 0.1) == []
    assert r.probe_due(3.0 + world.timers.keepalive) == [Dial(P[3].addr, Purpose.PROBE)]  # the count started again


def test_our_conninit_carries_our_measured_side_only_on_a_probe():
    world, r = _reunion(dead=[3])
    world.dead_hash = 5
    plain = wire.ConnInit(P[1], world.table.hash, 5)
    r.measured(Side(4, P[1].addr), True, 0.0)
    assert r.send_conninit(8, 1.0) == [Say(8, plain)]
    r.dialled(8)
    assert r.send_conninit(8, 1.0) == [Say(8, wire.ConnInit(P[1], world.table.hash, 5, 4, P[1].addr))]
    r.measured(Side(4, P[1].addr), False, 2.0)  # a lost leg: no side, rather than one that could lose wrongly
    assert r.conninit(8, 3.0) == wire.ConnInit(P[1], world.table.hash, 5, 0, P[1].addr)


# --- losing --------------------------------------------------------------------------------------------------------


def test_losing_tells_our_side_then_leaves():
    _, r = _reunion()
    assert r.lost(P[5].key, 1.0) == [Originate(wire.FloodKind.OUTVOTED, P[5].key), Expel(LOST)]


def test_outvoted_expels_those_who_hold_the_winner_dead():
    world, r = _reunion(dead=[5])
    msg = wire.Flood(P[2].addr, 1, wire.FloodKind.OUTVOTED, P[5].addr, P[5].incarnation)
    assert r.outvoted(4, msg, P[5].key, 1.0) == [Broadcast(msg, 4), Expel(LOST)]
    assert r.outvoted(4, msg, P[6].key, 1.0) == []  # we hold the winner alive: we are on its side
    assert r.outvoted(4, msg, P[1].key, 1.0) == []  # we are the winner
