"""The mesh under faults, on the simulator: a thousand nodes, message loss, a partition, kills, short and long pauses.

The invariants of issue 2:

* no node is ever declared dead while it is reachable (alive, and not paused or cut off past the dead limit);
* every dead node is known dead by every survivor, within a bound;
* a node paused past the dead limit is dead everywhere and, once resumed, expels itself and never comes back;
* a gather at the end returns every live node;
* the same seed gives the same run.

Timers are scaled by 0.2 (keepalive 0.2 s, UNRESPONSIVE 1 s, HUNG 2 s, reset 4 s, DEAD 12 s of virtual time) and the
driver ticks twice per keepalive, so a run of one and a half dead limits is short in real time. Retransmissions are
scaled with the timers (TCP's 200 ms minimum RTO against a 5 s warning).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import os
import subprocess
import sys

import pytest

from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.sim import Simulation
from sim_scenario import Scenario

FACTOR = 0.2
TIMERS = dataclasses.replace(Timers().scaled(FACTOR), tick=Timers().scaled(FACTOR).keepalive / 2)
RETRANSMIT = 0.2 * FACTOR


def run_scenario(n: int, seed: int, loss: float = 0.02) -> Scenario:
    """The fault schedule of the big test, laid out on ``n`` nodes (8 per host)::

    t=1          kill 3 scattered nodes and one whole host (8 processes)
    t=1.5        pause 3 nodes for half the dead limit, and 2 nodes for 1.1 dead limits
    t=2          partition 1 host (8 processes, one short pause among them) from the rest for half the
                 dead limit
    t=4          kill one more node while the partition holds (the cut-off side learns after the heal)
    t=7.5, 8     resume the short pauses, heal the partition
    t=14.7       resume the long pauses: zombies
    t=16.2       end
    """
    t = TIMERS
    sim = Simulation(n, seed=seed, timers=t, procs_per_host=8, loss=loss, retransmit=RETRANSMIT)
    sc = Scenario(sim)
    sim.start(bootstrap="quiet")  # every node knows every node, without N squared PEER_NEW events to record
    sc.run_until(1.0)
    host = (n // 8 // 2) * 8  # a whole host in the middle of the table
    sc.kill([37 % n, n // 3 + 1, n // 2 + 13, *range(host, host + 8)])
    sc.run_until(1.5)
    short = [101 % n, (7 * n) // 10 + 2, n - 97]
    long = [n // 4, (5 * n) // 6 + 3]
    sc.pause(short)
    sc.pause(long)
    sc.run_until(2.0)
    # One host: every link across the cut brings, at the heal, the HUNG verdicts the cut-off side made and a
    # RECOVERED flood per wrongly hung peer; with 1,000 nodes that flood storm is most of the run's messages
    # (4 hosts: 2.2 million, 2 hosts: 1.2 million, 1 host: 0.8 million), and one host cut off proves the same.
    first = short[0] // 8 * 8
    cut = set(range(first, first + 8))
    p = sc.partition(cut, set(range(n)) - cut)
    sc.run_until(4.0)
    sc.kill([(3 * n) // 5])
    sc.run_until(1.5 + 0.5 * t.dead)
    sc.resume(short)
    sc.run_until(2.0 + 0.5 * t.dead)
    sc.heal(p)
    sc.run_until(1.5 + 1.1 * t.dead)
    sc.resume(long)
    sc.run_until(1.5 + 1.1 * t.dead + 1.5)
    sc.short, sc.long, sc.cut = short, long, cut
    return sc


class Index:
    """The events of a run, read once: (observer, time) of each verdict by subject, and PEER_NEW by subject."""

    def __init__(self, sc: Scenario) -> None:
        idx = sc.sim.addr_index
        self.by_kind: dict[Kind, dict[int, list[tuple[int, float]]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )
        for s in sc.sim.nodes:
            for at, e in s.events:
                if e.addr is not None:
                    self.by_kind[e.kind][idx[e.addr]].append((s.index, at))

    def about(self, kind: Kind, subject: int) -> list[tuple[int, float]]:
        return self.by_kind[kind].get(subject, [])


@pytest.fixture(scope="module")
def big():
    sc = run_scenario(1000, seed=7)
    sim = sc.sim
    # A status query at the end, from a survivor.
    root = sc.survivors()[0]
    sim.gather(root, 1)
    sim.run_until(sim.now + 1.0)
    return sc, Index(sc), root


@pytest.mark.slow
def test_the_run_is_big_enough_and_the_faults_happened(big):
    sc, index, _ = big
    assert len(sc.sim.nodes) >= 1000
    assert len(sc.rec.killed) == 12 and len(sc.zombies()) == 2 and len(sc.rec.partitions) == 1
    # The faults were felt: silence was noticed and the partition made peers hang for a while.
    assert index.by_kind[Kind.PEER_UNRESPONSIVE] and index.by_kind[Kind.PEER_HUNG]
    assert index.by_kind[Kind.PEER_KEEPALIVE_TIMEOUT]


@pytest.mark.slow
def test_no_node_is_declared_dead_while_reachable(big):
    sc, _, _ = big
    wrong = [
        (observer, subject, at)
        for observer, subject, at in sc.dead_verdicts()
        if not sc.may_be_declared_dead(subject, at, observer)
    ]
    assert wrong == []


@pytest.mark.slow
def test_short_pauses_and_a_short_partition_cost_nobody_anything(big):
    sc, index, _ = big
    for i in [*sc.short, *sc.cut]:
        assert index.about(Kind.PEER_DEAD, i) == [], i
        assert not sc.sim.nodes[i].node.expelled
    for i in sc.survivors():
        n = sc.sim.nodes[i].node
        assert not n.hung, f"node {i} still holds a HUNG verdict about {n.hung}"
        assert not any(c.delayed for c in n.contacts.values()), f"node {i} still has delayed links"
    # Everybody flagged as hung during the faults was declared recovered again (or died).
    doomed = sc.doomed()
    for subject in index.by_kind[Kind.PEER_HUNG]:
        if subject not in doomed:
            assert index.about(Kind.PEER_RECOVERED, subject), subject


@pytest.mark.slow
def test_every_killed_node_is_known_dead_by_every_survivor_within_a_bound(big):
    sc, index, _ = big
    # Fast death: a killed process is known job-wide in well under the UNRESPONSIVE limit, not the dead limit,
    # counted from the moment a survivor could hear anything (the end of its own pause or of its partition).
    bound = TIMERS.unresponsive
    survivors = sc.survivors()
    for j, killed_at in sc.rec.killed.items():
        first = {}
        for observer, at in index.about(Kind.PEER_DEAD, j):
            first.setdefault(observer, at)
        for s in survivors:
            assert s in first, f"survivor {s} never learnt that {j} died"
            assert first[s] - sc.cut_off_until(s, killed_at) <= bound, (s, j, first[s], killed_at)
            assert sc.sim.key(j) in sc.sim.nodes[s].node.dead


@pytest.mark.slow
def test_a_node_paused_past_the_dead_limit_is_dead_everywhere_and_expels_itself_for_good(big):
    sc, index, _ = big
    survivors = sc.survivors()
    t = TIMERS
    for z in sc.zombies():
        start, resumed = sc.rec.paused[z]
        addr = sc.sim.addr(z)
        first = {}
        for observer, at in index.about(Kind.PEER_DEAD, z):
            first.setdefault(observer, at)
        # Dead everywhere, within the time a verdict takes after the dead limit (counted from the pause): its HUNG
        # standing unrefuted and a reachability gather (rasd/core/suspicion.py), plus an UNRESPONSIVE limit.
        for s in survivors:
            assert s in first and first[s] <= start + t.dead + sc.grace() + t.unresponsive, (s, z)
            assert sc.sim.key(z) in sc.sim.nodes[s].node.dead
            assert addr not in {p.addr for p in sc.sim.nodes[s].node.live_peers()}
        # Resumed, it learnt it is dead, said so about itself, and stopped.
        zombie = sc.sim.nodes[z]
        assert zombie.node.expelled
        assert first[z] >= resumed
        assert not zombie.node.conns and not zombie.node.contacts
        # Never came back: no survivor connected to it after declaring it dead, none met it again as new.
        for kind in (Kind.PEER_CONNECTED, Kind.PEER_CONNECTING, Kind.PEER_RECOVERED):
            assert [(o, at) for o, at in index.about(kind, z) if o != z and at > first.get(o, float("inf"))] == []
        assert all(at == 0.0 for _, at in index.about(Kind.PEER_NEW, z))
        for s in survivors:
            assert not any(c.peer == addr for c in sc.sim.nodes[s].node.conns.values())


@pytest.mark.slow
def test_survivors_agree_on_the_table_and_on_who_is_dead(big):
    sc, _, _ = big
    nodes = [sc.sim.nodes[i].node for i in sc.survivors()]
    doomed = {sc.sim.key(i) for i in sc.doomed()}
    assert {n.table.hash for n in nodes} == {nodes[0].table.hash}
    assert all(n.dead == doomed for n in nodes)
    assert not any(n.expelled for n in nodes)


@pytest.mark.slow
def test_a_gather_at_the_end_returns_every_live_node(big):
    sc, _, root = big
    at, done = sc.sim.gathers_done[(root, 1)]
    snap = done.snapshot
    assert set(snap.responses) == {sc.sim.addr(i) for i in sc.survivors()}
    assert snap.missing() == [] and snap.timeouts == 0
    assert snap.dead == {sc.sim.addr(i) for i in sc.doomed()}
    assert snap.collection_time < TIMERS.leg_timeout


# ----------------------------------------------------------------------------------------------------------------
# Loss alone, and reproducibility


@pytest.mark.slow
def test_heavy_loss_kills_nobody_a_leaver_is_left_and_gathers_stay_complete():
    # 5 % of segments lost, each costing an (unscaled) 200 ms retransmission: a fifth of the UNRESPONSIVE limit.
    t = TIMERS
    n, leaver = 256, 77
    sim = Simulation(n, seed=11, timers=t, loss=0.05, retransmit=0.2)
    sim.start()
    sim.run_until(1.0)
    sim.leave(leaver)
    sim.run_until(1.5 * t.dead)
    assert sim.events(Kind.PEER_DEAD) == []
    assert not any(s.node.expelled for s in sim.nodes)
    left = {i for i, _, e in sim.events(Kind.PEER_LEFT) if e.addr == sim.addr(leaver)}
    assert left == set(range(n)) - {leaver}
    sim.gather(0, 1)
    sim.run_until(sim.now + t.leg_timeout + t.gather_extra + 1)
    snap = sim.gathers_done[(0, 1)][1].snapshot
    assert len(snap.responses) == n - 1 and snap.missing() == [] and snap.left == {sim.addr(leaver)}


@pytest.mark.slow
def test_the_table_spreads_by_gossip_from_a_single_seed_each():
    t = TIMERS
    n = 128
    sim = Simulation(n, seed=5, timers=t, loss=0.01, retransmit=RETRANSMIT)
    sim.start(bootstrap="seed")  # each node learns one earlier node, as from the store
    assert sim.run_while(
        lambda: len({s.node.table.hash for s in sim.nodes}) > 1 or any(len(s.node.table) < n for s in sim.nodes),
        limit=t.dead / 2,
    )
    assert sim.events(Kind.PEER_DEAD) == []
    for s in sim.nodes:
        assert sum(1 for _, e in s.events if e.kind is Kind.PEER_NEW) == n


def _digest(sc: Scenario) -> str:
    return hashlib.sha256(repr(sc.trace()).encode()).hexdigest()


REPRO = """
import hashlib, sys
sys.path.insert(0, {here!r})
from test_sim_faults import run_scenario
sc = run_scenario(96, seed=9)
print(hashlib.sha256(repr(sc.trace()).encode()).hexdigest(), sc.sim.messages_sent)
"""


@pytest.mark.slow
def test_the_same_seed_gives_the_same_trace_here_and_in_other_processes_whatever_the_hash_seed():
    """Reproducible from the seed alone: not from set order, which PYTHONHASHSEED changes between processes
    (found by this test: ``Node._relink`` opened connections in set order), nor from anything one run leaves
    behind for the next in the same process. A fresh process with each of two hash seeds and this process, after
    a run with another seed, give the same trace and the same message count; the other seed gives another trace.
    The two fresh processes run while this one does (the suite's machines have two cores)."""
    here = os.path.dirname(os.path.abspath(__file__))
    repository = os.path.dirname(os.path.dirname(here))
    others = [
        subprocess.Popen(
            [sys.executable, "-c", REPRO.format(here=here)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED=hash_seed),
            cwd=repository,
        )
        for hash_seed in ("1", "2")
    ]
    try:
        other = run_scenario(96, seed=10)
        mine = run_scenario(96, seed=9)
        outs = [process.communicate(timeout=600)[0].strip() for process in others]
    finally:
        for process in others:
            process.kill()
            process.wait()
    assert [process.returncode for process in others] == [0, 0]
    assert outs == [f"{_digest(mine)} {mine.sim.messages_sent}"] * 2
    assert _digest(other) != _digest(mine)


def test_a_node_cut_off_while_a_hang_ends_does_not_keep_the_hang_verdict():
    """A HUNG verdict must not outlive the hang: once the peer answers again, nobody may hold it.

    OPEN (reported, not fixed): this test fails. HUNG and RECOVERED are floods with no backstop (the dead and
    departed lists have their hash in every keepalive; the hung set has none). A node that misses the RECOVERED
    flood (partitioned, paused, or with its links reset at that moment) keeps the HUNG verdict for ever, and
    ``_on_flood`` does not pass on a RECOVERED it had no verdict for, so the gap spreads behind it. The same
    happens in the random fault schedules that overlap pauses and partitions. Fixing it needs a design choice
    (hung set synced like the dead list, versioned per origin, or verdicts that expire unless refreshed).
    """
    t = TIMERS
    n, subject = 32, 5
    sim = Simulation(n, seed=0, timers=t)
    sim.start()
    sim.run_until(1.0)
    sim.pause(subject)  # hangs: every node hears the HUNG verdict
    sim.run_until(1.0 + t.hang + t.unresponsive)
    assert all(sim.key(subject) in s.node.hung for s in sim.nodes if s.index != subject)
    group = set(range(20, 24))  # four processes away from the subject
    p = sim.partition(group, set(range(n)) - group)
    sim.run_until(1.0 + 0.5 * t.dead)
    sim.resume(subject)  # the hang ends (well before the dead limit) while the group is cut off
    sim.run_until(sim.now + t.unresponsive)
    sim.heal(p)
    sim.run_until(sim.now + 1.5 * t.dead)
    assert sim.events(Kind.PEER_DEAD) == []
    still = [s.index for s in sim.nodes if sim.key(subject) in s.node.hung]
    assert still == [], f"nodes {still} still hold a HUNG verdict about a node that answers again"
