"""Restarted processes on their predecessors' addresses, on the simulator (issue 9, item 4).

A node dies (or leaves) and a new process starts on its exact address (same IP, same port; a new pid and a newer
incarnation), joining through one seed as from the bootstrap store. Whatever the loss and whichever way the news
spreads, at the end:

* the newcomer is live on every node (its own included): current in every table, in no dead or departed list, and
  no node ever emitted PEER_DEAD, PEER_LEFT or PEER_HUNG about it;
* the predecessor is dead on every node (departed, if it left cleanly), newcomer included, and stays so;
* every node holds the same table and the same dead list, and a gather returns every live node, with the
  predecessors in the report's DEAD list.

Timers at factor 0.2 as in test_sim_faults (DEAD 12 s of virtual time).
"""

from __future__ import annotations

import dataclasses

import pytest

from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.report.model import build_report
from rasd.sim import Simulation

FACTOR = 0.2
TIMERS = dataclasses.replace(Timers().scaled(FACTOR), tick=Timers().scaled(FACTOR).keepalive / 2)


def _verdicts_about(sim: Simulation, key, kinds=(Kind.PEER_DEAD, Kind.PEER_LEFT, Kind.PEER_HUNG)):
    return [
        (s.index, t, e.kind)
        for s in sim.nodes
        for t, e in s.events
        if e.kind in kinds and e.peer is not None and e.peer.key == key
    ]


def _check(sim: Simulation, restarted: dict[int, int], left: set[int] = frozenset()) -> None:
    live = sim.live()
    for old, new in restarted.items():
        old_key, new_key = sim.key(old), sim.key(new)
        assert old_key.addr == new_key.addr and new_key.incarnation > old_key.incarnation
        assert _verdicts_about(sim, new_key) == [], f"a verdict about the newcomer on {old_key.addr}"
        for s in live:
            n = s.node
            assert not n.expelled, s.index
            assert n.table.get(new_key.addr).key == new_key and n.table.entry(old_key) is not None
            assert new_key not in n.dead and new_key not in n.left
            assert (old_key in n.left) if old in left else (old_key in n.dead and old_key not in n.left)
            assert new_key.addr in {p.addr for p in n.live_peers()}
    assert len({(s.node.table.hash, s.node.dead_hash) for s in live}) == 1
    # A gather from node 0 finds every live process; the predecessors are in the report's DEAD or LEFT list.
    query = 100 + len(sim.gathers_done)
    sim.gather(0, query)
    sim.run_until(sim.now + TIMERS.leg_timeout + TIMERS.gather_extra + 1)
    snap = sim.gathers_done[(0, query)][1].snapshot
    assert set(snap.responses) == {s.node.me.addr for s in live} and snap.missing() == []
    report = build_report(snap)
    former_dead = {sim.key(i) for i in restarted if i not in left}
    assert {p.key for p in snap.former_dead} == former_dead
    assert {p.key for p in snap.former_left} == {sim.key(i) for i in restarted if i in left}
    assert {p.key for p in report.dead_processes} >= former_dead
    assert report.summary.process_count == len(snap.peers)


@pytest.mark.parametrize("loss", [0.0, 0.02])
def test_processes_restarted_on_dead_and_departed_predecessors_ports_are_live_everywhere(loss):
    t = TIMERS
    n = 40
    sim = Simulation(n, seed=21, timers=t, procs_per_host=8, loss=loss, retransmit=0.2 * FACTOR)
    sim.start()
    sim.run_until(1.0)
    sim.kill(10)
    sim.kill(33)
    sim.leave(20)
    # Three gaps in a ring of 40 (no skip links below 64): the news crosses each once a fallback connects.
    assert sim.run_while(
        lambda: (
            not all(
                s.node.is_dead(sim.addr(10)) and s.node.is_dead(sim.addr(33)) and s.node.has_left(sim.addr(20))
                for s in sim.live()
            )
        ),
        3 * t.unresponsive,
    )
    restarted = {10: sim.restart(10), 33: sim.restart(33, seed=39), 20: sim.restart(20, seed=19)}
    sim.run_until(sim.now + t.unresponsive)
    _check(sim, restarted, left={20})
    # A dead limit and a half later nothing has changed: the newcomers keep answering, the old stay gone.
    sim.run_until(sim.now + 1.5 * t.dead)
    _check(sim, restarted, left={20})


def test_a_restart_before_the_death_is_noticed_retires_the_predecessor_at_once():
    """Fast death off (NCCL's ladder): the killed process would be DEAD only after 12 s of silence. Its successor
    on the same port shows up 0.5 s after the kill; the job holds the predecessor dead as the news spreads, and
    the successor is never blamed for its predecessor's silence."""
    t = dataclasses.replace(TIMERS, fast_death=False)
    n = 48
    sim = Simulation(n, seed=4, timers=t, procs_per_host=8, loss=0.01, retransmit=0.2 * FACTOR)
    sim.start()
    sim.run_until(1.0)
    sim.kill(17)
    sim.run_until(1.5)
    assert not any(s.node.is_dead(sim.addr(17)) for s in sim.live())
    restarted = {17: sim.restart(17, seed=3)}
    sim.run_until(1.5 + t.unresponsive)
    old = sim.key(17)
    deaths = [at for _, at, _ in _verdicts_about(sim, old, (Kind.PEER_DEAD,))]
    assert len(deaths) == n and max(deaths) < 1.5 + t.unresponsive  # every survivor and the newcomer
    _check(sim, restarted)
    sim.run_until(sim.now + 1.5 * t.dead)
    _check(sim, restarted)
