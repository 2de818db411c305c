"""witness.py: the samples of this process's communicators and what they prove about a silent peer's training."""

from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.witness import MARGIN_S, SAMPLE_S, Witness


def counts(**by_op: int) -> tuple[int, ...]:
    values = [0] * N_OPS
    for name, n in by_op.items():
        values[OP_TYPES.index(name)] = n
    return tuple(values)


class Job:
    """This process's communicators as a test sets them, and the table's live processes."""

    def __init__(self) -> None:
        self.comms: dict[int, CommRecord] = {}
        self.live = 4
        self.fail = False

    def set(self, comm_hash: int, size: int, **completed: int) -> None:
        rank = RankRecord(0, launched=counts(**completed), completed=counts(**completed))
        self.comms[comm_hash] = CommRecord(comm_hash, size, (rank,))

    def data(self) -> ProcessData:
        if self.fail:
            raise RuntimeError("the counters cannot be read")
        return ProcessData(comms=tuple(self.comms.values()))


def witness(job: Job) -> Witness:
    return Witness(job.data, lambda: job.live)


def test_collectives_that_need_every_process_completed_after_the_silence_began_vouch_for_it():
    job = Job()
    w = witness(job)
    job.set(0xA, 4, AllReduce=10)
    for t in range(0, 6):  # a sample a second
        w.tick(float(t))
        job.set(0xA, 4, AllReduce=10 + 3 * (t + 1), Barrier=t)
    # silent since 1.0: compared with the sample at 2.0 (16 all-reduces and 1 barrier), the counters now (28 and 5)
    assert w.moved(1.0, 6.0) == (16, 0xA)


def test_nothing_completed_since_proves_nothing():
    job = Job()
    w = witness(job)
    job.set(0xA, 4, AllReduce=10)
    for t in range(6):
        w.tick(float(t))
    assert w.moved(1.0, 6.0) == (0, None)


def test_point_to_point_and_rooted_collectives_do_not_count():
    """A send, a receive or a broadcast can complete here without every member (the silent peer) taking part."""
    job = Job()
    w = witness(job)
    job.set(0xA, 4)
    for t in range(6):
        w.tick(float(t))
        job.set(0xA, 4, Send=t, Recv=t, Broadcast=t, Reduce=t, Gather=t, Scatter=t, Other=t)
    assert w.moved(1.0, 6.0) == (0, None)


def test_only_a_communicator_of_every_live_process_speaks_for_a_peer():
    """Its members are known only by count: after a restart left a process out (3 ranks, 4 live processes), or in a
    sub-group, the silent peer may not be a member."""
    job = Job()
    w = witness(job)
    job.set(0xA, 3, AllReduce=0)
    job.set(0xB, 2, AllReduce=0)
    for t in range(6):
        w.tick(float(t))
        job.set(0xA, 3, AllReduce=t + 1)
        job.set(0xB, 2, AllReduce=t + 1)
    assert w.moved(1.0, 6.0) == (0, None)
    job.live = 3  # the left-out process declared dead: the world of 3 holds every live process
    assert w.moved(1.0, 6.0)[1] == 0xA


def test_the_margin_and_the_sample_history_bound_what_is_compared():
    job = Job()
    w = witness(job)
    job.set(0xA, 4, AllReduce=0)
    w.tick(0.0)
    w.tick(0.5)  # not a second later: no sample
    assert len(w.samples) == 1
    job.set(0xA, 4, AllReduce=5)
    # no sample at or after silent_since + MARGIN_S: nothing to compare with
    assert w.moved(0.0, 0.9) == (0, None)
    w.tick(SAMPLE_S)
    job.set(0xA, 4, AllReduce=9)
    assert w.moved(SAMPLE_S - MARGIN_S, 2.0) == (4, 0xA)


def test_counters_that_cannot_be_read_prove_nothing_and_raise_nothing():
    job = Job()
    w = witness(job)
    job.set(0xA, 4, AllReduce=0)
    w.tick(0.0)
    w.tick(1.0)
    job.set(0xA, 4, AllReduce=9)
    job.fail = True
    w.tick(2.0)
    assert w.moved(-1.0, 3.0) == (0, None)


def test_with_the_timers_scaled_down_a_late_sample_still_leaves_a_base_before_the_verdict():
    """Hang limit 2 s (a timeout factor of 0.2). The RAS thread's ticks come late on a loaded machine, here at 0,
    0.95 and 2.0 s: with the one-second margin no sample falls between it and the verdict (2 s), and the training
    the witness saw proves nothing; with the margin and the sampling fitted to the hang limit, it vouches."""
    results = []
    for make in (witness, lambda job: Witness.for_hang(job.data, lambda: job.live, hang=2.0)):
        job = Job()
        w = make(job)
        for t in (0.0, 0.95, 2.0):
            job.set(0xA, 4, AllReduce=int(t * 10))  # the job trains: ten all-reduces a second
            w.tick(t)
        results.append(w.moved(0.0, 2.0))
    assert results[0] == (0, None)
    assert results[1] == (11, 0xA)  # the all-reduces from 0.95 s (9) to 2.0 s (20)
    assert Witness.for_hang(Job().data, lambda: 4, hang=10.0).every == SAMPLE_S  # the default timers: unchanged
