"""Busy is not stuck (issue 39): the work meter's rule, and the stuck detector's verdicts with what processes send of
their work (rasd/core/work.py, rasd/core/stuck.py)."""

from rasd.core import wire
from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord, Work
from rasd.core.frames import Frame
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.core.stuck import CADENCE_FACTOR, StuckDetector, StuckVerdict
from rasd.core.work import WORK_CPU_SHARE, WORK_IO_RATE, DeclaredPhase, WorkMeter, WorkSample, working

LIMIT, CEILING, BUSY = 5.0, 60.0, 300.0
AR = 4  # AllReduce in OP_TYPES


def ops(n: int) -> tuple[int, ...]:
    return (0,) * AR + (n,) + (0,) * (N_OPS - AR - 1)


def addr(rank: int) -> Addr:
    return Addr("10.0.0.1", 1000 + rank)


def snap(
    behind_work: Work | None,
    *,
    at: float = 0.0,
    extra: dict[int, tuple[CommRecord, ...]] | None = None,
    rank0_launched: int = 9,
    others: Work | None = None,
    silent: frozenset[int] = frozenset(),
    dead: frozenset[int] = frozenset(),
    others_launched: int = 10,
    others_idle_ms: int | None = None,
) -> JobSnapshot:
    """At ``at``: rank 0 behind (launched 9) with ``behind_work``; ranks 1-3 inside operation 10 of communicator 77;
    the counters still since time 0."""
    responses = {}
    idle_ms = int(at * 1000)
    for rank in range(4):
        launched = rank0_launched if rank == 0 else others_launched
        idle = idle_ms if rank == 0 or others_idle_ms is None else others_idle_ms
        comm = CommRecord(
            77, 4, (RankRecord(rank, launched=ops(launched), completed=ops(9), idle_ms=idle),), ((0, 4, 1),)
        )
        comms = (comm,) + (extra or {}).get(rank, ())
        if rank not in silent:
            responses[addr(rank)] = ProcessData(comms=comms, work=behind_work if rank == 0 else (others or Work()))
    peers = tuple(PeerInfo(addr(r), pid=r, hostname="h", incarnation=r, rank=r) for r in range(4))
    return JobSnapshot(peers=peers, responses=responses, dead=frozenset(addr(r) for r in dead))


def detector() -> StuckDetector:
    return StuckDetector(LIMIT, CEILING, BUSY)


def run(d: StuckDetector, make, times) -> list[tuple[float, list[StuckVerdict], list[StuckVerdict]]]:
    out = []
    for t in times:
        new, cleared = d.observe(make(t), t)
        out.append((t, new, cleared))
    return out


# --- the meter --------------------------------------------------------------------------------------------------


def test_a_window_is_work_when_its_cpu_or_its_bytes_pass_the_thresholds():
    base = WorkSample(cpu_s=10.0, io_bytes=1000)
    assert not working(base, base, 1.0)
    assert working(base, WorkSample(10.0 + 2 * WORK_CPU_SHARE, 1000), 1.0)
    assert not working(base, WorkSample(10.0 + WORK_CPU_SHARE / 2, 1000), 1.0)
    assert working(base, WorkSample(10.0, 1000 + WORK_IO_RATE * 2), 2.0)
    assert not working(base, WorkSample(10.0, 1000 + 500), 1.0)  # a store poll's few hundred bytes
    assert not working(base, WorkSample(99.0, 1000), 0.0)


def test_time_ready_to_run_on_a_starved_host_is_work_like_cpu():
    """A rank computing on a host at several times its cores gets a few percent of a core; the time its main thread
    waited on a run queue, ready to run, is work too. An idle wedge never waits on a run queue."""
    base = WorkSample(cpu_s=10.0, io_bytes=0, runnable_s=5.0)
    starved = WorkSample(cpu_s=10.0 + WORK_CPU_SHARE / 4, io_bytes=0, runnable_s=5.0 + WORK_CPU_SHARE)
    assert working(base, starved, 1.0)
    idle = WorkSample(cpu_s=10.0 + WORK_CPU_SHARE / 4, io_bytes=0, runnable_s=5.0 + 0.001)
    assert not working(base, idle, 1.0)


def test_a_main_thread_waiting_on_the_disk_is_working_whatever_its_counters():
    """A ``torch.save`` held up by a busy disk sits in uninterruptible sleep: no CPU, no bytes, no new position. It
    is work while it waits; a wait that ended before the window's end says nothing by itself."""
    base = WorkSample(cpu_s=10.0, io_bytes=1000)
    assert working(base, WorkSample(10.0, 1000, disk_wait=True), 1.0)
    assert not working(WorkSample(10.0, 1000, disk_wait=True), base, 1.0)


class Counters:
    def __init__(self) -> None:
        self.sample: WorkSample | None = WorkSample(0.0, 0)
        self.position = (Frame("train.py", 1, "step"),)
        self.phase: DeclaredPhase | None = None


def meter(c: Counters) -> WorkMeter:
    return WorkMeter(lambda: c.sample, lambda: c.position, lambda: c.phase, interval=1.0)


def test_the_meter_dates_the_last_window_of_work_and_reports_its_age():
    c = Counters()
    m = meter(c)
    assert m.report(0.0) is None  # nothing measured yet
    m.tick(0.0)
    assert m.report(0.5) == Work(idle_ms=500)  # the first sample counts as work
    c.sample = WorkSample(0.9, 0)  # 90 % of a core in the next second
    m.tick(1.0)
    m.tick(1.5)  # within the interval: not sampled
    assert m.worked_at == 1.0
    m.tick(2.0)  # no CPU, no bytes, the same frames: idle
    m.tick(3.0)
    assert m.report(7.25) == Work(idle_ms=6250)
    c.position = (Frame("train.py", 2, "step"),)  # Python ran, however little CPU it took
    m.tick(8.0)
    assert m.report(8.0) == Work(idle_ms=0)


def test_an_unreadable_sample_says_nothing_and_a_phase_travels_with_its_age():
    c = Counters()
    m = meter(c)
    m.tick(0.0)
    c.sample = None
    m.tick(5.0)
    assert m.worked_at == 0.0  # the window could not be read: what was known stands
    c.phase = DeclaredPhase("checkpoint", 600.0, started=2.0)
    assert m.report(12.0) == Work(idle_ms=12_000, phase="checkpoint", phase_limit_ms=600_000, phase_ms=10_000)


def test_work_and_the_new_verdict_fields_cross_the_wire():
    for data in (
        ProcessData(where=(Frame("a.py", 3, "f"),), work=Work(1234, "eval", 60_000, 5_000), waiting=True),
        ProcessData(work=Work(7)),
        ProcessData(waiting=True),
    ):
        (entry,) = wire.decode_body(wire.encode(wire.collresp(addr(0), 1, 0, ((addr(0), data),)))[4:]).entries
        assert entry == (addr(0), data)
    v = StuckVerdict(77, AR, 10, (0,), (1, 2, 3), slow=True, busy=(0,), phase="eval", stood_ms=9000, limit_ms=5000)
    verdict = wire.CommVerdict(addr(1), 5, True, v)
    assert wire.decode_body(wire.encode(verdict)[4:]) == verdict


# --- the detector -----------------------------------------------------------------------------------------------


def test_an_idle_rank_behind_is_stuck_at_the_limit():
    d = detector()
    (_, new0, _), (_, new1, _), (_, new2, _) = run(
        d, lambda t: snap(Work(idle_ms=int(t * 1000)), at=t), [1.0, 4.0, 5.5]
    )
    assert new0 == new1 == []
    (v,) = new2
    assert not v.slow and v.behind == (0,) and v.busy == () and v.limit_ms == 5000


def test_a_rank_behind_that_works_is_slow_never_stuck_until_the_busy_limit():
    d = detector()
    steps = run(d, lambda t: snap(Work(idle_ms=300), at=t), [1.0, 6.0, 11.0, 60.0, 299.0])
    (v,) = steps[1][1]
    assert v.slow and v.busy == (0,)
    assert "slow" in v.describe() and "rank 0 working" in v.describe()
    assert all(new == [] for _, new, _ in steps[2:])  # SLOW stands; no new verdict, no restart
    assert d.active()[0].slow and d.active()[0].stood_ms == 299_000
    (_, (stuck,), _) = run(d, lambda t: snap(Work(idle_ms=300), at=t), [300.5])[0]
    assert not stuck.slow  # past the busy limit: COMM_STUCK, a restart
    assert run(d, lambda t: snap(Work(idle_ms=300), at=t), [310.0])[0][1] == []  # announced once


def test_a_rank_that_worked_then_went_idle_is_stuck_once_idle_for_the_limit():
    d = detector()
    run(d, lambda t: snap(Work(idle_ms=100), at=t), [1.0, 30.0])  # working behind for 30 s: SLOW
    worked_until = 31.0
    late = run(d, lambda t: snap(Work(idle_ms=int((t - worked_until) * 1000)), at=t), [34.0, 36.5])
    assert late[0][1] == []  # idle 3 s: not yet
    (v,) = late[1][1]
    assert not v.slow  # idle 5.5 s, behind 36 s: stuck


def test_a_declared_phase_holds_off_until_its_own_limit_working_or_not():
    d = detector()

    def phase(t: float) -> JobSnapshot:
        work = Work(idle_ms=int(t * 1000), phase="checkpoint", phase_limit_ms=40_000, phase_ms=int(t * 1000))
        return snap(work, at=t)

    steps = run(d, phase, [1.0, 6.0, 39.0])
    (v,) = steps[1][1]
    assert v.slow and v.phase == "checkpoint" and "in phase 'checkpoint'" in v.describe()
    assert steps[2][1] == []
    (_, (stuck,), _) = run(d, phase, [41.0])[0]
    assert not stuck.slow and stuck.phase == "checkpoint"


def pair(rank: int, launched: int, completed: int) -> CommRecord:
    """Rank ``rank`` of communicator 88, a pair of global ranks 0 and 1."""
    return CommRecord(88, 2, (RankRecord(rank, launched=ops(launched), completed=ops(completed)),), ((0, 2, 1),))


def test_a_rank_behind_that_waits_inside_another_communicators_operation_is_judged_there():
    d = detector()
    # Rank 0 waits inside an operation of communicator 88 whose counters keep moving (its partner streams).
    steps = run(d, lambda t: snap(Work(idle_ms=int(t * 1000)), at=t, extra={0: (pair(0, int(t), int(t) - 1),)}), [1, 6])
    (v,) = [x for x in steps[1][1] if x.comm_hash == 77]
    assert v.slow and v.busy == ()


def test_a_deadlock_across_two_communicators_is_stuck_in_both():
    # Rank 0 waits inside the pair's operation 3; its partner, rank 1, waits inside the world's operation 10, which
    # rank 0 never launched (a gradient step skipped on one rank): neither will ever move.
    d = detector()
    extra = {0: (pair(0, 3, 2),), 1: (pair(1, 2, 2),)}
    idle = Work(idle_ms=60_000)
    steps = run(d, lambda t: snap(idle, at=t, extra=extra, others=idle), [1.0, 6.0])
    assert {v.comm_hash: v.slow for v in steps[1][1]} == {77: False, 88: False}


def test_a_rank_that_sends_no_work_is_judged_idle_as_before():
    d = detector()
    steps = run(d, lambda t: snap(None, at=t), [1.0, 6.0])
    (v,) = steps[1][1]
    assert not v.slow


def test_the_idle_limit_learns_from_idle_stands_the_communicator_ended_by_itself():
    d = detector()
    key = (77, 4)
    assert d.idle_limit(key) == LIMIT
    # A stand of 4 s with rank 0 idle that moved again on its own (counters of rank 0 then agree).
    run(d, lambda t: snap(Work(idle_ms=int(t * 1000)), at=t), [1.0, 4.0])
    d.observe(snap(Work(), rank0_launched=10), 5.0)  # rank 0 launched it: the counters moved by themselves
    assert d.idle_limit(key) == CADENCE_FACTOR * 4.0
    # Never past the ceiling; a working stand teaches nothing past what its ranks were idle.
    d._cadences[key].stands.append(100.0)
    assert d.idle_limit(key) == CEILING


def test_a_verdict_falls_due_when_the_rank_behind_has_been_idle_for_the_limit():
    d = detector()
    # Rank 0 worked until 0.5 s after the others entered the collective (counters still since 0).
    run(d, lambda t: snap(Work(idle_ms=int((t - 0.5) * 1000)), at=t), [1.0, 5.0])
    assert d.due() == 5.5  # idle 4.5 s at the sweep at 5 s: due half a second later, not a whole sweep later
    (v,) = run(d, lambda t: snap(Work(idle_ms=int((t - 0.5) * 1000)), at=t), [5.5])[0][1]
    assert not v.slow


def test_a_communicator_with_a_rank_whose_process_did_not_answer_is_left_to_the_liveness_verdicts():
    """Rank 3's process is stopped (it answers no sweep): ranks 0-2 wait inside the operation, and nothing in the
    counters says where rank 3 is. No COMM_STUCK (which would restart every rank, the stopped one too): the hang
    limit makes the PEER_HUNG that names it. Once it is known dead, the communicator is judged again."""

    def stopped(t: float, dead: frozenset[int] = frozenset()) -> JobSnapshot:
        return snap(Work(idle_ms=int(t * 1000)), at=t, rank0_launched=10, silent=frozenset({3}), dead=dead)

    d = detector()
    assert run(d, stopped, [1.0, 6.0, 30.0]) == [(1.0, [], []), (6.0, [], []), (30.0, [], [])]
    (_, new, _) = run(d, lambda t: stopped(t, frozenset({3})), [31.0])[0]
    assert [v.inside for v in new] == [(0, 1, 2)] and not new[0].slow


def test_a_rank_idle_for_the_limit_is_stuck_once_the_others_have_waited_half_of_it():
    """Rank 0 wedged at time 0 (its process idle since); the others finished their step and entered the
    collective 1.5 s later (the counters stand from 1.5 s). Named at 4 s after the wedge, not 4 s after the others
    arrived; a rank that works is never named early."""
    d = StuckDetector(4.0, CEILING, BUSY)

    def wedged(t: float) -> JobSnapshot:
        return snap(Work(idle_ms=int(t * 1000)), at=t - 1.5)

    assert run(d, wedged, [2.0, 3.4]) == [(2.0, [], []), (3.4, [], [])]  # the others waited 1.9 s: not yet
    (v,) = run(d, wedged, [4.1])[0][1]
    assert not v.slow and v.behind == (0,)
    d = StuckDetector(4.0, CEILING, BUSY)
    assert all(not new for _, new, _ in run(d, lambda t: snap(Work(idle_ms=200), at=t - 1.5), [2.0, 4.1, 5.0]))


def test_a_stand_first_seen_after_its_limit_is_judged_by_that_sweep():
    """The sweep that first sees these counters comes 6 s after they stopped (the ranks' idle time says so) and
    rank 0 has been idle all along: that sweep names it, not the sweep after."""
    d = detector()
    (_, new, _) = run(d, lambda t: snap(Work(idle_ms=int(t * 1000)), at=t), [6.0])[0]
    assert [v.behind for v in new] == [(0,)] and not new[0].slow
    # A rank that worked until a moment ago is not named at first sight: due once idle for the limit.
    d = detector()
    assert run(d, lambda t: snap(Work(idle_ms=int((t - 2.0) * 1000)), at=t), [3.0]) == [(3.0, [], [])]
    assert d.due() == 7.0


def test_a_silent_ranks_communicator_brings_no_sweep_forward():
    """A stopped rank's communicator is judged at the regular sweeps only (its due time would always be past, and
    the sweeper would sweep at its floor for as long as the hang limit takes)."""
    d = detector()
    run(d, lambda t: snap(Work(idle_ms=int(t * 1000)), at=t, rank0_launched=10, silent=frozenset({3})), [1.0, 6.0])
    assert d.due() is None


def test_others_launching_more_while_the_rank_behind_stays_idle_teaches_the_cadence_nothing():
    """DDP's other ranks launch the next bucket's all-reduce while rank 0 stays wedged: their counters move, the
    stand goes on. Only rank 0 launching ends it, and then the whole stand is learned."""
    d = detector()
    key = (77, 4)

    def wedged(t: float, others: int) -> JobSnapshot:
        moved = None if others == 10 else int((t - 2.5) * 1000)  # the others launched one more at 2.5 s
        return snap(Work(idle_ms=int(t * 1000)), at=t, others_launched=others, others_idle_ms=moved)

    assert run(d, lambda t: wedged(t, 10), [2.0]) == [(2.0, [], [])]
    (_, new, _) = run(d, lambda t: wedged(t, 11), [3.0])[0]  # the others moved: a new stand, not an ended one
    assert new == [] and d.idle_limit(key) == LIMIT
    (_, new, _) = run(d, lambda t: wedged(t, 11), [5.5])[0]
    assert [v.behind for v in new] == [(0,)] and not new[0].slow  # named at rank 0's limit, the floor
    # A stand that rank 0 ends by itself (launching) is learned, with what it was idle through every sweep.
    d = detector()
    run(d, lambda t: wedged(t, 10), [1.0])
    run(d, lambda t: wedged(t, 11), [3.0])
    d.observe(snap(Work(), rank0_launched=11, at=0.0), 3.5)
    assert d.idle_limit(key) == CADENCE_FACTOR * 3.0
    # A verdict stands while only the others move, and clears when rank 0 launches.
    d = detector()
    (_, new, _) = run(d, lambda t: wedged(t, 10), [6.0])[0]
    assert len(new) == 1
    assert run(d, lambda t: wedged(t, 11), [7.0]) == [(7.0, [], [])] and d.active() == new
    assert d.observe(snap(Work(), rank0_launched=11, at=0.0), 8.0) == ([], new)
