"""A silence verdict needs the whole job's silence, and a healed partition leaves one job (rasd/core/reunion.py).

On the simulator, 64 nodes on 8 hosts, timers scaled by 0.2 (dead limit 12 s of virtual time):

* a partition past the dead limit: each side declares the other dead (each right about what it cannot see); after
  the heal the smaller side's processes learn that the larger side holds them dead and leave, so every remaining
  process agrees on who is dead and a gather returns exactly the larger side;
* equal sides: the side with the lowest address stays;
* one broken link past the dead limit: the node at one end cannot hear the other, the rest of the job can, so nobody
  is declared dead (the HUNG verdict is refuted and the refutation vouches for the peer).
"""

from __future__ import annotations

import dataclasses

import pytest

from rasd.core import wire
from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.core.peers import Addr
from rasd.core.reunion import MEASURED_FOR, PROBE_EVERY, Side
from rasd.sim import Simulation

FACTOR = 0.2

#: Each test runs a simulation of seconds (a test over a second is slow, README).
pytestmark = pytest.mark.slow
TIMERS = dataclasses.replace(Timers().scaled(FACTOR), tick=Timers().scaled(FACTOR).keepalive / 2)
N = 64


def keys(sim: Simulation, nodes: set[int]) -> set:
    return {sim.key(i) for i in nodes}


def test_a_partition_past_the_dead_limit_gives_each_side_its_verdict_and_after_the_heal_the_smaller_side_leaves():
    t = TIMERS
    sim = Simulation(N, seed=3, timers=t, procs_per_host=8)
    minority = set(range(16, 24))  # one whole host
    majority = set(range(N)) - minority
    sim.start(bootstrap="quiet")
    sim.run_until(1.0)
    p = sim.partition(minority, majority)
    # During the partition: the larger side comes to hold exactly the other side dead about one dead limit in (a
    # silence death, then the reachability gather's suspicions); the smaller side, which reaches less than half of
    # the job, waits one more dead limit, then holds exactly the larger side dead. Nobody is expelled.
    assert sim.run_while(
        lambda: not all(sim.nodes[i].node.dead == keys(sim, minority) for i in majority), limit=1.5 * t.dead
    )
    assert sim.now - 1.0 > t.dead
    assert not any(sim.nodes[i].node.dead for i in minority)
    assert sim.run_while(
        lambda: not all(sim.nodes[i].node.dead == keys(sim, majority) for i in minority), limit=1.5 * t.dead
    )
    assert sim.now - 1.0 > 1.5 * t.dead
    assert all(sim.nodes[i].node.dead == keys(sim, minority) for i in majority)
    assert not any(s.node.expelled for s in sim.nodes)
    sim.heal(p)
    healed = sim.now
    # After the heal: within a few probe intervals every process of the smaller side has left.
    assert sim.run_while(
        lambda: not all(sim.nodes[i].node.expelled for i in minority), limit=4 * PROBE_EVERY * t.hang
    ), [i for i in minority if not sim.nodes[i].node.expelled]
    left_after = sim.now - healed
    # Two probe intervals at most to meet, one gather's hard limit if the first probe finds a side not measured.
    assert left_after <= 2 * PROBE_EVERY * t.hang + t.leg_timeout + t.gather_extra + t.handshake
    sim.run_until(sim.now + t.dead)
    # The larger side is untouched and agrees: the same dead set, the same table, a complete gather.
    for i in majority:
        node = sim.nodes[i].node
        assert not node.expelled and node.dead == keys(sim, minority), i
    assert len({sim.nodes[i].node.table.hash for i in majority}) == 1
    assert len({sim.nodes[i].node.dead_hash for i in majority}) == 1
    sim.gather(0, 77)
    sim.run_until(sim.now + t.leg_timeout + t.gather_extra)
    _, done = sim.gathers_done[(0, 77)]
    assert set(done.snapshot.responses) == keys_addr(sim, majority)
    assert done.snapshot.dead == keys_addr(sim, minority)
    # Each process of the smaller side said that it left, once: told by a probe's comparison of the sides or by its
    # side's OUTVOTED flood ("the larger side ..."), or, where it reached a process of the larger side first, by
    # that process (YOU_ARE_DEAD, as a resumed zombie is).
    why = []
    for i in minority:
        mine = [e for _, e in sim.nodes[i].events if e.kind is Kind.PEER_DEAD and e.addr == sim.addr(i)]
        assert len(mine) == 1
        why.append(mine[0].details)
    assert any("larger side of a healed partition" in w for w in why), why
    declared = {(o, e.addr) for o, _, e in sim.events(Kind.PEER_DEAD) if o in minority and e.addr != sim.addr(o)}
    assert not {a for _, a in declared} & keys_addr(sim, minority)  # no split within the smaller side either


def keys_addr(sim: Simulation, nodes: set[int]) -> set[Addr]:
    return {sim.addr(i) for i in nodes}


@pytest.mark.parametrize("healed_at", [0.9, 1.0, 1.05, 1.1, 1.2, 1.6, 2.05, 2.15])
def test_whenever_a_partition_heals_the_larger_side_stays_whole_and_the_smaller_side_leaves_or_stays(healed_at):
    """A heal at any time: before the dead limit nobody dies; after it the larger side keeps every one of its
    processes and ends with one view (the smaller side dead), whatever the smaller side had decided by then."""
    t = TIMERS
    sim = Simulation(N, seed=7, timers=t, procs_per_host=8)
    minority = set(range(40, 48))
    majority = set(range(N)) - minority
    sim.start(bootstrap="quiet")
    sim.run_until(1.0)
    p = sim.partition(minority, majority)
    sim.run_until(1.0 + healed_at * t.dead)
    sim.heal(p)
    sim.run_until(sim.now + 2 * t.dead)
    assert not [i for i in majority if sim.nodes[i].node.expelled]
    views = {frozenset(sim.nodes[i].node.dead) for i in majority}
    assert len(views) == 1, "the larger side disagrees about who is dead"
    (dead,) = views
    assert dead <= keys(sim, minority)
    if healed_at < 1.0:
        assert not dead and not any(sim.nodes[i].node.expelled for i in minority)
    elif healed_at >= 1.2:
        assert dead == keys(sim, minority) and all(sim.nodes[i].node.expelled for i in minority)
    # Each process of the smaller side either left (the job holds it dead) or is back in the one job, agreeing.
    for i in minority:
        node = sim.nodes[i].node
        assert node.expelled == (sim.key(i) in dead), i
        if not node.expelled:
            assert node.dead == dead and node.table.hash == sim.nodes[0].node.table.hash, i


def test_equal_sides_keep_the_side_with_the_lowest_address():
    t = TIMERS
    n = 8
    sim = Simulation(n, seed=4, timers=t, procs_per_host=2)
    low, high = set(range(4)), set(range(4, 8))
    sim.start(bootstrap="quiet")
    sim.run_until(1.0)
    p = sim.partition(low, high)
    # Each side walks the other a ring neighbour at a time: wait until each holds exactly the other dead.
    assert sim.run_while(
        lambda: not all(sim.nodes[i].node.dead == keys(sim, high if i in low else low) for i in range(n)),
        limit=6 * t.dead,
    )
    sim.heal(p)
    assert sim.run_while(lambda: not all(sim.nodes[i].node.expelled for i in high), limit=4 * PROBE_EVERY * t.hang)
    sim.run_until(sim.now + t.dead)
    assert not any(sim.nodes[i].node.expelled for i in low)
    assert all(sim.nodes[i].node.dead == keys(sim, high) for i in low)


def test_sides_compare_by_size_then_by_lowest_address():
    a, b = Addr("10.0.0.1", 1), Addr("10.0.0.2", 1)
    assert Side(5, b).beats(Side(4, a)) and not Side(4, a).beats(Side(5, b))
    assert Side(4, a).beats(Side(4, b)) and not Side(4, b).beats(Side(4, a))


def test_one_broken_link_past_the_dead_limit_kills_nobody():
    """Node 10 cannot reach node 11 (and back) for two dead limits; everybody else hears both. 10 flags 11 HUNG, the
    job refutes it, and the refutation vouches for 11: no PEER_DEAD anywhere."""
    t = TIMERS
    sim = Simulation(N, seed=5, timers=t, procs_per_host=8)
    sim.start(bootstrap="quiet")
    sim.run_until(1.0)
    p = sim.partition({10}, {11})
    sim.run_until(1.0 + 2 * t.dead)
    assert sim.events(Kind.PEER_DEAD) == [] and sim.events(Kind.PEER_TIMEOUT_DEAD) == []
    assert not any(s.node.expelled for s in sim.nodes)
    # The verdict was raised and refuted (a RECOVERED flood), not silently skipped.
    assert any(e.addr == sim.addr(11) for _, _, e in sim.events(Kind.PEER_HUNG))
    sim.heal(p)
    sim.run_until(sim.now + t.dead)
    assert sim.events(Kind.PEER_DEAD) == []
    assert all(sim.key(11) not in s.node.hung for s in sim.nodes)


def test_a_probe_carries_the_measured_side_only_to_a_process_held_dead():
    t = TIMERS
    sim = Simulation(8, seed=6, timers=t)
    sim.start()
    sim.run_until(1.0)
    node = sim.nodes[3].node
    conn = next(iter(node.conns.values()))
    assert node.reunion.conninit(conn.id, sim.now).side_lowest is None  # not a probe: no side
    node.reunion.dialled(conn.id)  # made a probe
    unmeasured = node.reunion.conninit(conn.id, sim.now)
    assert (unmeasured.side_live, unmeasured.side_lowest) == (0, sim.addr(3))  # live 0: not measured (and itself)
    # A reachability gather measures the side: what it reached, the lowest address among them.
    node.carry_out(node.suspicion.measure(sim.now), sim.now)
    sim.run_until(sim.now + t.leg_timeout)
    probe = node.reunion.conninit(conn.id, sim.now)
    assert (probe.side_live, probe.side_lowest) == (8, sim.addr(0))
    assert wire.decode_body(wire.encode(probe)[4:]) == probe
    # A measurement stands MEASURED_FOR gather hard limits, no longer.
    sim.run_until(sim.now + MEASURED_FOR * (t.leg_timeout + t.gather_extra))
    assert node.reunion.conninit(conn.id, sim.now).side_live == 0
