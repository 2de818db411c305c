"""COMM_STUCK across a simulated job: the sweeper finds a stalled communicator, every node hears the verdict
naming the rank that is behind, and hears it clear when the counters move again."""

import pytest

from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.core.work import WorkSample
from rasd.sim import Simulation

AR = OP_TYPES.index("AllReduce")
N = 64
TIMERS = Timers().scaled(0.2)  # stuck limit 4 s, sweep 1 s


class Counters:
    """Per node AllReduce counters of one job-wide communicator."""

    def __init__(self) -> None:
        self.launched = [10] * N
        self.completed = [10] * N

    def data(self, i: int) -> ProcessData:
        launched = [0] * N_OPS
        completed = [0] * N_OPS
        launched[AR], completed[AR] = self.launched[i], self.completed[i]
        return ProcessData(
            comms=(
                CommRecord(
                    comm_hash=0xABC,
                    size=N,
                    rank_map=((0, N, 1),),
                    ranks=(RankRecord(comm_rank=i, launched=tuple(launched), completed=tuple(completed)),),
                ),
            )
        )


@pytest.mark.slow
def test_a_stalled_rank_is_named_behind_everywhere_and_the_verdict_clears():
    c = Counters()
    sim = Simulation(N, seed=11, timers=TIMERS, local_data=c.data)
    sim.start()
    sim.run_until(3 * TIMERS.stuck)
    assert sim.events(Kind.COMM_STUCK) == []  # a healthy job is never stuck
    # Rank 5 sleeps before operation 11; everybody else is inside it.
    for i in range(N):
        if i != 5:
            c.launched[i] = 11
    t0 = sim.now
    assert sim.run_while(lambda: len(sim.events(Kind.COMM_STUCK)) < N, TIMERS.stuck + 4 * TIMERS.sweep)
    verdicts = sim.events(Kind.COMM_STUCK)
    assert {i for i, _, _ in verdicts} == set(range(N))
    assert max(t for _, t, _ in verdicts) - t0 <= TIMERS.stuck + 3 * TIMERS.sweep
    e = verdicts[0][2]
    assert e.comm_hash == 0xABC
    assert "AllReduce operation 11 stuck; rank 5 behind (not launched)" in e.details
    assert e.ranks[0] == 5 and len(e.ranks) == N
    # It moves again: the verdict clears on every node.
    c.launched[5] = 11
    c.completed = [11] * N
    assert sim.run_while(lambda: len(sim.events(Kind.COMM_RECOVERED)) < N, 4 * TIMERS.sweep)
    sim.run_until(sim.now + 3 * TIMERS.stuck)
    assert len(sim.events(Kind.COMM_STUCK)) == N  # no second verdict


def test_a_gather_right_after_a_hang_ends_when_the_silent_leg_is_purged_not_at_the_timeout():
    """Bootstrap introductions leave connections that are nobody's link. A gather must not wait on one of them to
    a silent process until its hard limit: a leg silent past the unresponsive limit counts as a timeout at once."""
    t = Timers()
    for victim in range(1, 8):
        sim = Simulation(8, seed=victim, timers=t)
        sim.start("seed")
        sim.run_until(3.0)  # the introduction connections are fresh: under the unresponsive limit
        seeds = {(victim + 1) // 2 - 1, victim - 1} - {victim}
        root = min(seeds)
        sim.pause(victim)
        started = sim.now
        sim.gather(root, 1)
        assert sim.run_while(
            lambda sim=sim, key=(root, 1): key not in sim.gathers_done, t.leg_timeout + t.gather_extra + 1
        )
        done_at, done = sim.gathers_done[(root, 1)]
        assert done.snapshot.timeouts >= 1
        assert set(done.snapshot.responses) == {sim.addr(i) for i in range(8) if i != victim}
        assert done_at - started <= t.unresponsive + t.tick, f"victim {victim}: waited {done_at - started:.2f}s"


@pytest.mark.slow
def test_a_rank_behind_that_works_is_slow_everywhere_never_stuck_until_it_stops_working():
    """Issue 39 on the simulated mesh: rank 5 writes a checkpoint (its CPU grows with the clock) while the others
    wait inside the next all-reduce. Every node hears COMM_SLOW, none COMM_STUCK, for many idle limits; once rank 5
    stops working (wedged idle), COMM_STUCK names it within the idle limit and a few sweeps."""
    c = Counters()
    sim = Simulation(N, seed=12, timers=TIMERS, local_data=c.data)
    working = [True]
    cpu = [0.0]
    last = [0.0]

    def counters() -> WorkSample:
        if working[0]:
            cpu[0] += sim.now - last[0]  # one core, all the time
        last[0] = sim.now
        return WorkSample(cpu_s=cpu[0], io_bytes=0)

    sim.nodes[5].node.work_sample = counters
    sim.start()
    sim.run_until(3 * TIMERS.stuck)
    for i in range(N):
        if i != 5:
            c.launched[i] = 11
    assert sim.run_while(lambda: len(sim.events(Kind.COMM_SLOW)) < N, TIMERS.stuck + 4 * TIMERS.sweep)
    slow = sim.events(Kind.COMM_SLOW)[0][2]
    assert "AllReduce operation 11 slow; rank 5 behind (not launched)" in slow.details
    assert "rank 5 working" in slow.details
    sim.run_until(sim.now + 10 * TIMERS.stuck)  # ten idle limits: still only SLOW
    assert sim.events(Kind.COMM_STUCK) == []
    working[0] = False
    t0 = sim.now
    assert sim.run_while(lambda: len(sim.events(Kind.COMM_STUCK)) < N, TIMERS.stuck + 5 * TIMERS.sweep)
    assert max(t for _, t, _ in sim.events(Kind.COMM_STUCK)) - t0 <= TIMERS.stuck + 4 * TIMERS.sweep
    assert "rank 5 behind (not launched)" in sim.events(Kind.COMM_STUCK)[0][2].details
