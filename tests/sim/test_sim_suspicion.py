"""Silence deaths decided with the job's view (rasd/core/suspicion.py): a region is declared dead only once nobody on
this side has heard any of it for the dead limit.

On the simulator, 64 nodes on 8 hosts, timers scaled by 0.2 (dead limit 12 s of virtual time). A region of three
hosts has an inside (the middle host) whose ring and skip links all stay inside the region, so no node outside ever
hears it directly: only its edges are heard. A reachability gather that runs while the region is cut off (here,
started by a process paused for good elsewhere) leaves the whole region unreached; the run rule keeps the inside
alive while the edges were heard within the dead limit, and lets the whole region be declared once they were not.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from rasd.core import wire
from rasd.core.actions import Send
from rasd.core.comms import ProcessData
from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.core.liveness import CONFIRM
from rasd.core.peers import Addr, PeerInfo
from rasd.core.reunion import spread
from rasd.core.snapshot import JobSnapshot
from rasd.core.suspicion import ECHO, unreached_runs
from rasd.sim import Simulation

FACTOR = 0.2
TIMERS = dataclasses.replace(Timers().scaled(FACTOR), tick=Timers().scaled(FACTOR).keepalive / 2)
N = 64
REGION = set(range(0, 24))  # hosts 0, 1 and 2: the inside (host 1) has every link inside the region
PAUSED = 40  # paused for good: its silence death starts the reachability gathers


def dead_about(sim: Simulation, nodes: set[int]) -> list[tuple[int, int, float]]:
    idx = sim.addr_index
    return [
        (o, idx[e.addr], at) for o, at, e in sim.events(Kind.PEER_DEAD) if idx[e.addr] in nodes and idx[e.addr] != o
    ]


def _job(seed: int) -> tuple[Simulation, set[int]]:
    """The 64-node job, settled at t = 1 s, and the processes outside REGION."""
    sim = Simulation(N, seed=seed, timers=TIMERS, procs_per_host=8, record=frozenset({Kind.PEER_DEAD}))
    sim.start(bootstrap="quiet")
    sim.run_until(1.0)
    return sim, set(range(N)) - REGION


@pytest.mark.slow
def test_a_region_cut_off_for_less_than_the_dead_limit_while_gathers_run_loses_nobody():
    t = TIMERS
    sim, rest = _job(11)
    sim.pause(PAUSED)
    # Cut off from 0.6 to 1.5 dead limits after the pause: the paused process's silence death (about one dead limit
    # in) and every reachability gather it starts fall inside the partition.
    sim.run_until(1.0 + 0.6 * t.dead)
    p = sim.partition(REGION, rest)
    sim.run_until(1.0 + 1.5 * t.dead)
    sim.heal(p)
    sim.run_until(sim.now + 2 * t.dead)
    assert dead_about(sim, REGION) == []
    assert not any(sim.nodes[i].node.expelled for i in REGION)
    # The paused process was declared dead, by everyone (the region too, after the heal).
    for s in sim.nodes:
        if s.index != PAUSED:
            assert s.node.dead == {sim.key(PAUSED)}, s.index


@pytest.mark.slow
def test_a_region_cut_off_past_the_dead_limit_is_declared_whole_inside_included():
    t = TIMERS
    sim, rest = _job(12)
    sim.partition(REGION, rest)
    region = {sim.key(i) for i in REGION}
    assert sim.run_while(lambda: not all(sim.nodes[i].node.dead == region for i in rest), limit=2 * t.dead)
    took = sim.now - 1.0
    assert t.dead < took <= t.dead + 3 * (t.leg_timeout + t.gather_extra), took
    # No verdict about the region before the dead limit, by anyone (its last keepalive before the cut may be one
    # interval old, and a verdict waits for a tick).
    earliest = 1.0 + t.dead - t.keepalive - 2 * t.tick
    assert min(at for _, _, at in dead_about(sim, REGION)) >= earliest


@pytest.mark.slow
def test_a_silence_death_is_called_again_after_a_heal_before_it_is_declared():
    # Sweep seed 3432: process 21 sits by address inside a cut-off region (host 2) but on the larger side. Its ring
    # neighbours 20 and 22, cut off, hold it silent and flood HUNG on their side only, where nobody can refute it. The
    # partition heals just before the dead limit, moments after 21 is paused for good: their silence passes the dead
    # limit on the larger side, whose nodes heard 21 until its pause. The HUNG flood of the DEAD rung (its last
    # call) is refuted by them, and 21 dies only a dead limit into its pause.
    t = TIMERS
    sim, _ = _job(13)
    cut = set(range(16, 24)) - {21}
    p = sim.partition(cut, set(range(N)) - cut)
    heal = 1.0 + 0.94 * t.dead
    sim.run_until(heal - 0.5)
    sim.pause(21)
    paused = sim.now
    sim.run_until(heal)
    sim.heal(p)
    sim.run_until(paused + 2 * t.dead)
    deaths = dead_about(sim, {21})
    assert deaths, "the paused process was never declared"
    earliest = paused + t.dead - t.keepalive - 2 * t.tick
    assert min(at for _, _, at in deaths) >= earliest, sorted(deaths, key=lambda d: d[2])[:3]
    assert dead_about(sim, set(range(N)) - {21}) == []


def _live(n: int) -> list[PeerInfo]:
    return [PeerInfo(Addr("10.0.0.1", 20000 + i), 100 + i, "h", 1, i) for i in range(n)]


def _answered(live: list[PeerInfo], indexes: set[int]) -> set[Addr]:
    return {live[i].addr for i in indexes}


def test_unreached_processes_fall_into_runs_of_consecutive_ones_wrapping_around_the_ring():
    live = _live(10)
    runs = unreached_runs(live, _answered(live, {2, 3, 7}))
    index = {p.key: i for i, p in enumerate(live)}
    by_index = {index[k]: {index[m] for m in run} for k, run in runs.items()}
    assert by_index[0] == by_index[9] == by_index[1] == {8, 9, 0, 1}
    assert by_index[4] == by_index[6] == {4, 5, 6}
    assert set(by_index) == {0, 1, 4, 5, 6, 8, 9}
    assert unreached_runs(live, _answered(live, set(range(10)))) == {}


@given(st.integers(min_value=1, max_value=300))
def test_probes_visit_every_member_of_a_gap_once_per_round(n):
    assert sorted(spread(turn, n) for turn in range(n)) == list(range(n))


def test_the_first_probes_of_a_long_gap_land_far_from_its_near_end():
    # A process whose own side left holds them dead too: they are the near end of its gap.
    first = [spread(turn, 63) for turn in range(3)]
    assert len(set(first)) == 3 and sum(i >= 8 for i in first) == 2  # 8: one host of processes


def _smaller_side_node():
    """Node 0 of a settled 8-node job, made to believe it is on the smaller side of a partition."""
    t = TIMERS
    sim = Simulation(8, seed=1, timers=t)
    sim.start()
    sim.run_until(2.0)
    node = sim.nodes[0].node
    node.suspicion.majority = False
    return sim, node


def test_the_smaller_side_makes_a_last_call_before_a_death_and_a_refutation_answers_it():
    t = TIMERS
    sim, node = _smaller_side_node()
    s, key, now = node.suspicion, sim.key(3), sim.now
    s.suspects[key] = now - t.dead - 1  # due: suspected more than a dead limit ago
    node.carry_out(s._decide(now), now)
    calls = [m for m in sent_floods(node) if m.kind is wire.FloodKind.SUSPECT and m.subject == key.addr]
    assert len({m.flood_id for m in calls}) == 1 and not node.verdicts.gone(key)  # the call went out; no death yet
    s.refuted(key, now + 0.1)  # somebody reachable heard it
    node.carry_out(s._decide(now + CONFIRM * t.unresponsive), now + CONFIRM * t.unresponsive)
    assert not node.verdicts.gone(key) and key not in s.suspects
    # Unanswered, the same call ends in the death.
    s.suspects[key] = now - t.dead - 1
    later = now + 2 * ECHO * t.leg_timeout
    node.carry_out(s._decide(later), later)
    node.carry_out(s._decide(later + CONFIRM * t.unresponsive), later + CONFIRM * t.unresponsive)
    assert node.verdicts.gone(key)


def test_a_refutation_seen_just_before_the_last_call_answers_it():
    # Another node's SUSPECT, refuted, moments before ours came due: the refuters would not answer again within ECHO.
    t = TIMERS
    sim, node = _smaller_side_node()
    s, key, now = node.suspicion, sim.key(3), sim.now
    s.pending[key] = now - t.dead - 1
    s._suspected[key] = now - 1.0
    s.refuted(key, now - 0.5)
    node.carry_out(s._decide(now), now)
    node.carry_out(s._decide(now + CONFIRM * t.unresponsive), now + CONFIRM * t.unresponsive)
    assert not node.verdicts.gone(key) and key not in s.pending


def test_a_last_call_of_an_earlier_suspicion_is_not_taken_for_a_later_one():
    t = TIMERS
    sim, node = _smaller_side_node()
    s, key, now = node.suspicion, sim.key(3), sim.now
    s.suspects[key] = now - t.dead - 1
    node.carry_out(s._decide(now), now)  # the last call starts ...
    del s.suspects[key]  # ... and a gather reaches it (the heal)
    for k in range(5):
        node.carry_out(s.tick(now + 0.1 * k), now + 0.1 * k)
    later = now + 10 * t.dead  # another partition, the same process suspected again and due
    s.majority = False
    s.suspects[key] = later - t.dead - 1
    node.carry_out(s._decide(later), later)
    assert not node.verdicts.gone(key), "declared without a last call of its own"


def sent_floods(node, actions=None) -> list[wire.Flood]:
    """The floods among ``actions``, or among what the node has queued to send."""
    out = []
    for a in node._flush() if actions is None else actions:
        if isinstance(a, Send):
            msg = wire.decode_body(a.data[4:])
            if isinstance(msg, wire.Flood):
                out.append(msg)
    return out


def test_a_suspicion_is_answered_by_heard_not_by_a_recovered_about_an_old_hang():
    # RECOVERED refutes a HUNG verdict ("heard after its origin did", maybe long ago); only HEARD ("heard within the
    # dead limit") answers a suspicion (sweep seed 471).
    sim, node = _smaller_side_node()
    s, key, now = node.suspicion, sim.key(3), sim.now
    conn = next(c for c in node.conns.values() if c.peer is not None)
    origin = sim.addr(5)
    for kind, flood_id, cleared in ((wire.FloodKind.RECOVERED, 901, False), (wire.FloodKind.HEARD, 902, True)):
        s.suspects[key] = now
        flood = wire.Flood(origin, flood_id, kind, key.addr, key.incarnation, 0.0)
        node.received(conn.id, wire.encode(flood), now)
        assert (key not in s.suspects) is cleared, kind


def _suspect_flood(sim: Simulation, origin: int, flood_id: int, subject: int) -> bytes:
    key = sim.key(subject)
    return wire.encode(wire.Flood(sim.addr(origin), flood_id, wire.FloodKind.SUSPECT, key.addr, key.incarnation, 0.0))


def test_a_suspicion_needs_a_suspect_flood_sent_after_it_began():
    # Sweep seed 5482: a suspicion raised just after a heal flooded nothing, because a SUSPECT about the same process
    # had gone by moments before, flooded on the smaller side while the partition held: the suspect never saw it,
    # never refuted, and was declared dead although reachable. Such a suspicion floods its own before a death.
    t = TIMERS
    sim, node = _smaller_side_node()
    s, now = node.suspicion, sim.now
    s.majority = True
    confirm = CONFIRM * t.unresponsive
    old, late = sim.key(3), sim.key(4)  # node 0 links to neither: it passes SUSPECTs about them on
    s._suspected[old] = now - confirm - 0.5  # another node's SUSPECT, before ours was raised
    s.suspects[old] = now - confirm
    sent_floods(node)
    node.carry_out(s._decide(now), now)
    calls = [m for m in sent_floods(node) if m.kind is wire.FloodKind.SUSPECT and m.subject == old.addr]
    assert len({m.flood_id for m in calls}) == 1 and not node.verdicts.gone(old)
    node.carry_out(s._decide(now + confirm - 0.01), now + confirm - 0.01)
    assert not node.verdicts.gone(old)
    node.carry_out(s._decide(now + confirm), now + confirm)
    assert node.verdicts.gone(old)
    # Another node's SUSPECT seen after ours was raised stands for it: no flood of our own, a death CONFIRM after it.
    conn = next(c for c in node.conns.values() if c.peer is not None)
    s.suspects[late] = now
    sent = node.received(conn.id, _suspect_flood(sim, 5, 921, 4), now + 0.1)
    node.carry_out(s._decide(now + 0.1 + confirm), now + 0.1 + confirm)
    assert node.verdicts.gone(late)
    sent += node._flush()
    suspects = [m for m in sent_floods(node, sent) if m.kind is wire.FloodKind.SUSPECT]
    assert suspects and all(m.origin == sim.addr(5) for m in suspects)  # passed the other's on, sent none of ours


def test_the_suspect_answers_every_suspect_about_itself():
    # However lately it answered one: its last HEARD may have gone out before this suspecter could be reached.
    sim, node = _smaller_side_node()
    conn = next(c for c in node.conns.values() if c.peer is not None)
    now = sim.now
    sent_floods(node)
    sent = node.received(conn.id, _suspect_flood(sim, 5, 931, 0), now)
    sent += node.received(conn.id, _suspect_flood(sim, 6, 932, 0), now + 0.1)
    heard = [m for m in sent_floods(node, sent) if m.kind is wire.FloodKind.HEARD and m.subject == node.me.addr]
    assert len({m.flood_id for m in heard}) == 2


def test_a_refuter_that_answered_lately_passes_the_suspect_flood_on_towards_the_suspect():
    # Its HEARD went out lately, maybe before this suspecter could be reached; it sends no second one (ECHO), and the
    # SUSPECT must not stop next to the suspect, which answers every SUSPECT about itself.
    sim, node = _smaller_side_node()
    s, now = node.suspicion, sim.now
    conn = next(c for c in node.conns.values() if c.peer is not None)
    neighbour = sim.key(1)
    assert node.links.heard_within(neighbour, TIMERS.dead, now)
    sent = node.received(conn.id, _suspect_flood(sim, 5, 941, 1), now)
    first = sent_floods(node, sent)
    assert [m.kind for m in first if m.subject == neighbour.addr] and all(m.kind is wire.FloodKind.HEARD for m in first)
    sent = node.received(conn.id, _suspect_flood(sim, 6, 942, 1), now + 0.1)
    second = sent_floods(node, sent)
    assert second and all(m.kind is wire.FloodKind.SUSPECT and m.flood_id == 942 for m in second)
    assert s._lately(s._heard, neighbour, now + 0.1)


def _majority_snapshot(node, missing) -> JobSnapshot:
    """The end of a reachability gather that every process but ``missing`` answered."""
    live = node.live_peers()
    return JobSnapshot(
        peers=tuple(live), responses={p.addr: ProcessData() for p in live if p.key != missing}, timeouts=1
    )


@pytest.mark.parametrize("refuted", [False, True])
def test_a_silence_death_called_on_the_smaller_side_is_called_again_when_a_heal_makes_it_the_larger(refuted):
    # Sweep seed 7705: a node cut off past the dead limit found a link of the larger side silent; its last call (the
    # HUNG flood of the DEAD rung) went out on the smaller side only, where nobody hears that process. The first
    # gather after the heal measured the larger side and declared the death at once, about a process the larger side
    # heard all along. Now that gather calls again (our HUNG once more) and the death waits CONFIRM for an answer.
    t = TIMERS
    sim, node = _smaller_side_node()
    s, now = node.suspicion, sim.now
    contact = next(iter(node.links.contacts.values()))
    key = contact.key
    contact.last_heard = contact.vouched = now - t.dead - 1.0  # silent past the dead limit
    s.pending[key] = now - CONFIRM * t.unresponsive - 0.1  # its last call went out, on the smaller side, and stood
    s._gathering, s._gathered = True, now - 0.01  # and this gather began after it
    sent_floods(node)
    node.carry_out(s.reached(_majority_snapshot(node, key), now), now)
    assert s.majority and not node.verdicts.gone(key), "declared on a last call nobody on the larger side saw"
    calls = [m for m in sent_floods(node) if m.kind is wire.FloodKind.HUNG and m.subject == key.addr]
    assert calls, "no second last call"
    confirm = CONFIRM * t.unresponsive
    node.carry_out(s._decide(now + confirm - 0.01), now + confirm - 0.01)
    assert not node.verdicts.gone(key)
    if refuted:
        # A node of the larger side hears it and answers the call (its RECOVERED, stamped with the peer's clock).
        node.links.vouch(key, node.links.stamp(key) + 10 * t.hang, now + 0.1)
    node.carry_out(s._decide(now + confirm), now + confirm)
    assert node.verdicts.gone(key) is not refuted


def test_suspicions_raised_on_the_smaller_side_are_raised_afresh_when_a_heal_makes_it_the_larger():
    # The same for a suspicion: its SUSPECT went out on the smaller side; after the heal it is raised again, with a
    # flood the larger side sees, and declared only CONFIRM after that one.
    t = TIMERS
    sim, node = _smaller_side_node()
    s, now = node.suspicion, sim.now
    key = sim.key(3)
    s.suspects[key] = now - t.dead - 1.0
    s._called[key] = now - t.dead - 1.0  # its SUSPECT went out then
    s._gathering, s._gathered = True, now - 0.01
    sent_floods(node)
    node.carry_out(s.reached(_majority_snapshot(node, key), now), now)
    assert not node.verdicts.gone(key) and s.suspects.get(key) == now
    calls = [m for m in sent_floods(node) if m.kind is wire.FloodKind.SUSPECT and m.subject == key.addr]
    assert calls, "no SUSPECT flood of the larger side"
    node.carry_out(s._decide(now + CONFIRM * t.unresponsive - 0.01), now + CONFIRM * t.unresponsive - 0.01)
    assert not node.verdicts.gone(key)
    node.carry_out(s._decide(now + CONFIRM * t.unresponsive), now + CONFIRM * t.unresponsive)
    assert node.verdicts.gone(key)
