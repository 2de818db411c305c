"""Stuck-collective attribution: who is behind, who is inside, and when a verdict starts and clears."""

from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.core.stuck import StuckDetector, attribute

AR = OP_TYPES.index("AllReduce")
BC = OP_TYPES.index("Broadcast")


def counts(**by_op: int) -> tuple[int, ...]:
    out = [0] * N_OPS
    for name, n in by_op.items():
        out[OP_TYPES.index(name)] = n
    return tuple(out)


def snapshot(
    per_rank: dict[int, tuple[tuple[int, ...], tuple[int, ...]]],
    size: int = 4,
    rank_map=((100, 4, 2),),
    idle_ms: int = 0,
) -> JobSnapshot:
    responses = {}
    peers = []
    for rank, (launched, completed) in per_rank.items():
        addr = Addr("10.0.0.1", 1000 + rank)
        peers.append(PeerInfo(addr, pid=rank, hostname="h", incarnation=rank))
        responses[addr] = ProcessData(
            comms=(
                CommRecord(
                    comm_hash=77,
                    size=size,
                    rank_map=rank_map,
                    ranks=(RankRecord(comm_rank=rank, launched=launched, completed=completed, idle_ms=idle_ms),),
                ),
            )
        )
    return JobSnapshot(peers=tuple(peers), responses=responses)


def merged(snap):
    from rasd.core.snapshot import merge_communicators

    (comm,) = merge_communicators(snap)
    assert comm.comm_hash == 77
    return comm


def test_a_rank_that_never_launched_is_behind_and_the_others_are_inside():
    snap = snapshot(
        {
            0: (counts(AllReduce=57), counts(AllReduce=56)),
            1: (counts(AllReduce=57), counts(AllReduce=56)),
            2: (counts(AllReduce=56), counts(AllReduce=56)),
            3: (counts(AllReduce=57), counts(AllReduce=56)),
        }
    )
    v = attribute(merged(snap))
    assert (v.op, v.seq, v.behind, v.inside) == (AR, 57, (2,), (0, 1, 3))
    # rank_map (100, 4, 2): comm rank r is global rank 100 + 2r
    assert v.global_behind == (104,) and v.global_inside == (100, 102, 106)
    assert v.describe() == (
        "AllReduce operation 57 stuck; rank 2 behind (not launched); ranks 0,1,3 inside it (launched, not completed)"
    )


def test_the_first_disagreeing_op_type_in_nccl_order_is_named():
    snap = snapshot(
        {
            0: (counts(Broadcast=3, AllReduce=9), counts(Broadcast=3, AllReduce=9)),
            1: (counts(Broadcast=2, AllReduce=8), counts(Broadcast=2, AllReduce=8)),
        },
        size=2,
    )
    v = attribute(merged(snap))
    assert (v.op, v.seq, v.behind, v.inside) == (BC, 3, (1,), ())


def test_agreeing_counters_are_not_stuck():
    same = (counts(AllReduce=5), counts(AllReduce=5))
    assert attribute(merged(snapshot({0: same, 1: same}, size=2))) is None


def test_a_verdict_needs_the_counters_frozen_for_the_limit_and_clears_when_they_move():
    d = StuckDetector(limit=20.0)
    stuck = snapshot(
        {0: (counts(AllReduce=2), counts(AllReduce=1)), 1: (counts(AllReduce=1), counts(AllReduce=1))}, size=2
    )
    assert d.observe(stuck, 0.0) == ([], [])
    assert d.observe(stuck, 19.0) == ([], [])
    new, cleared = d.observe(stuck, 20.0)
    assert len(new) == 1 and not cleared and new[0].behind == (1,) and new[0].inside == (0,)
    assert d.observe(stuck, 25.0) == ([], [])  # reported once; it stays active
    assert d.active() == new
    moved = snapshot(
        {0: (counts(AllReduce=2), counts(AllReduce=2)), 1: (counts(AllReduce=2), counts(AllReduce=2))}, size=2
    )
    new2, cleared2 = d.observe(moved, 26.0)
    assert not new2 and cleared2 == new and d.active() == []


def test_moving_but_disagreeing_counters_are_not_stuck():
    d = StuckDetector(limit=10.0)
    for step in range(10):
        snap = snapshot(
            {
                0: (counts(AllReduce=step + 1), counts(AllReduce=step)),
                1: (counts(AllReduce=step), counts(AllReduce=step)),
            },
            size=2,
        )
        assert d.observe(snap, step * 5.0) == ([], [])


def test_a_communicator_that_disappears_clears_its_verdict():
    d = StuckDetector(limit=1.0)
    stuck = snapshot({0: (counts(AllReduce=2), counts(AllReduce=1))}, size=2)
    d.observe(stuck, 0.0)
    (v,), _ = d.observe(stuck, 1.0)
    empty = JobSnapshot(peers=(), responses={})
    assert d.observe(empty, 2.0) == ([], [v])


def test_a_split_by_type_that_differs_while_totals_agree_is_no_verdict():
    """Collectives beneath the hooks are typed from the Flight Recorder, which may estimate differently on two ranks
    (an entry lost from one ring): the totals are exact, and only they judge (rasd.torch.records)."""
    done = counts(AllReduce=40, Broadcast=3)
    snap = snapshot(
        {
            0: (done, done),
            1: (counts(AllReduce=41, Broadcast=2), counts(AllReduce=41, Broadcast=2)),
            2: (done, done),
            3: (done, done),
        }
    )
    assert attribute(merged(snap)) is None


def test_behind_in_total_names_the_rank_and_the_op_where_the_split_differs():
    snap = snapshot(
        {
            0: (counts(AllReduce=41, Broadcast=3), counts(AllReduce=40, Broadcast=3)),
            1: (counts(AllReduce=41, Broadcast=3), counts(AllReduce=40, Broadcast=3)),
            2: (counts(AllReduce=40, Broadcast=3), counts(AllReduce=40, Broadcast=3)),
            3: (counts(AllReduce=41, Broadcast=3), counts(AllReduce=40, Broadcast=3)),
        }
    )
    v = attribute(merged(snap))
    assert (v.op, v.seq, v.behind, v.inside) == (AR, 41, (2,), (0, 1, 3))


STALLED = {
    0: (counts(AllReduce=57), counts(AllReduce=56)),
    1: (counts(AllReduce=57), counts(AllReduce=56)),
    2: (counts(AllReduce=56), counts(AllReduce=56)),
    3: (counts(AllReduce=57), counts(AllReduce=56)),
}


def test_the_ranks_idle_time_dates_the_stall_and_the_verdict_falls_due_at_the_limit():
    """First seen 15 s after the counters stopped (the ranks' idle time says so): due 5 s later, not 20."""
    d = StuckDetector(limit=20.0)
    new, _ = d.observe(snapshot(STALLED, idle_ms=15_000), now=100.0)
    assert new == [] and d.due() == 105.0
    new, _ = d.observe(snapshot(STALLED, idle_ms=19_900), now=104.9)
    assert new == []
    new, _ = d.observe(snapshot(STALLED, idle_ms=20_000), now=105.0)
    assert [v.behind for v in new] == [(2,)]
    assert d.due() is None  # the verdict stands: nothing more falls due


def test_nothing_falls_due_while_the_ranks_agree():
    d = StuckDetector(limit=20.0)
    done = counts(AllReduce=5)
    d.observe(snapshot({r: (done, done) for r in range(4)}, idle_ms=60_000), now=100.0)
    assert d.due() is None
