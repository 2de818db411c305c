"""A whole job starting through the bootstrap store, on the simulator (issue 30).

``Simulation.start_through`` starts every process as ``rasd/net/bootstrap.py`` does: six operations per process at one
modelled store server (``rasd/sim/store.py``), which serves them one at a time, then a connection to the two seeds
the store named, and gossip for the rest. Whatever the job's size and however the starts are spread, every node
ends up listing every process, the store did the expected work, and a seed replays exactly.

The 64-node runs take a fraction of a second; the 200-node ones a few seconds each (``slow``).
"""

from __future__ import annotations

import pytest

from rasd.core import wire
from rasd.core.connections import ConnState
from rasd.core.events import Kind
from rasd.sim import Simulation
from rasd.sim.store import OPS_PER_PROCESS, StoreModel

SEED = 11
FAST = 0.0001  # seconds per store operation
SLOW = 0.002
RTT = 0.0005
LIMIT = 30.0  # simulated seconds for every table to be complete
TINY = 1e-9


@pytest.fixture(autouse=True)
def _wire_caches(monkeypatch):
    """The simulator raises the wire's entry-cache bound for the whole process: put it back afterwards."""
    monkeypatch.setattr(wire, "PEER_CACHE_MAX", wire.PEER_CACHE_MAX)


def _start(n: int, service: float = FAST, window: float = 0.0, seed: int = SEED):
    sim = Simulation(n, seed=seed)
    store = StoreModel(service, RTT)
    sim.start_through(store, window=window)
    return sim, store


def _complete(sim: Simulation, n: int) -> bool:
    return all(len(s.node.table) == n for s in sim.nodes)


def _run(n: int, service: float = FAST, window: float = 0.0, seed: int = SEED):
    sim, store = _start(n, service, window, seed)
    done = sim.run_while(lambda: not _complete(sim, n), LIMIT, step=0.05)
    return sim, store, done


def _check_started(sim: Simulation, store: StoreModel, n: int, done: bool) -> None:
    assert done, f"not every table complete within {LIMIT} s: {sorted(len(s.node.table) for s in sim.nodes)[:5]}"
    assert sim.now <= LIMIT
    everyone = {s.node.me.addr for s in sim.nodes}
    for s in sim.nodes:
        assert {p.addr for p in s.node.table} == everyone, s.index
        assert not s.node.expelled and not s.node.dead and not s.node.left, s.index
        assert any(c.state is ConnState.READY for c in s.node.conns_list()), f"node {s.index} has no READY link"
    assert len({s.node.table.hash for s in sim.nodes}) == 1
    assert not sim.events(Kind.PEER_DEAD) and not sim.events(Kind.PEER_HUNG)
    # Six operations per process; the first two join indices have fewer seeds to read (none, then one).
    assert OPS_PER_PROCESS * n - 4 <= store.ops <= OPS_PER_PROCESS * n
    assert store.joined == n and set(store.set_at) == set(range(1, n + 1)) and not store.waiting
    # One server, one operation at a time: it was busy at least ``service`` for each.
    assert store.free_at >= store.ops * store.service - TINY


def test_64_processes_all_at_once_know_each_other():
    sim, store, done = _run(64)
    _check_started(sim, store, 64, done)


def test_64_processes_started_over_a_second_know_each_other():
    sim, store, done = _run(64, window=1.0)
    _check_started(sim, store, 64, done)


@pytest.mark.slow
@pytest.mark.parametrize("window", [0.0, 1.0])
def test_200_processes_know_each_other(window):
    sim, store, done = _run(200, window=window)
    _check_started(sim, store, 200, done)


def test_nothing_is_known_before_the_store_first_answers():
    """All at once, the first answer (to the secret's compare_set) is back a round trip and one service after the
    start: until then every process has sent its first operation only and knows only itself."""
    n = 64
    sim, store = _start(n, service=SLOW)
    first_answer = RTT + SLOW
    sim.run_until(first_answer - 1e-6)
    assert store.ops == n
    assert store.free_at >= n * SLOW - TINY  # n operations queued, one service each
    assert all(len(s.node.table) == 1 for s in sim.nodes)
    assert all(not s.node.conns_list() for s in sim.nodes)
    sim.run_until(first_answer + 1e-6)
    assert store.ops == n + 1 and store.joined == 1  # the first process's join is on its way


def test_the_same_seed_replays_the_same_start():
    runs = [_run(64, window=0.5) for _ in range(2)]
    (a, sa, _), (b, sb, _) = runs
    assert a.messages_sent == b.messages_sent > 0 and a.bytes_sent == b.bytes_sent
    assert a.now == b.now and sa.ops == sb.ops and sa.free_at == sb.free_at and sa.set_at == sb.set_at


@pytest.mark.slow
def test_the_same_seed_replays_the_same_start_of_200():
    (a, sa, _), (b, sb, _) = _run(200), _run(200)
    assert a.messages_sent == b.messages_sent > 0 and a.bytes_sent == b.bytes_sent
    assert a.now == b.now and sa.ops == sb.ops and sa.free_at == sb.free_at


def test_a_slow_store_delays_the_start():
    n = 64
    fast, fast_store, fast_done = _run(n, service=FAST)
    slow, slow_store, slow_done = _run(n, service=SLOW)
    _check_started(slow, slow_store, n, slow_done)
    assert fast_done and fast_store.ops == slow_store.ops
    assert slow_store.free_at > fast_store.free_at
    assert slow.now > fast.now


@pytest.mark.slow
def test_a_slow_store_delays_the_start_of_200():
    n = 200  # the slow store is busy for about 2.4 s
    fast, fast_store, fast_done = _run(n, service=FAST)
    slow, slow_store, slow_done = _run(n, service=SLOW)
    _check_started(slow, slow_store, n, slow_done)
    assert fast_done and slow_store.free_at >= (OPS_PER_PROCESS * n - 4) * SLOW - TINY
    assert slow.now > fast.now + 1.0
