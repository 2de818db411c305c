"""One merge of a job snapshot: the sweeper and the report see the same communicators, ranks and processes."""

from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot, ReportedRank, merge_communicators, process_order
from rasd.core.stuck import StuckDetector
from rasd.report.model import build_report

AR = OP_TYPES.index("AllReduce")


def counts(n: int) -> tuple[int, ...]:
    out = [0] * N_OPS
    out[AR] = n
    return tuple(out)


def rank(r: int, launched: int, completed: int | None = None) -> RankRecord:
    return RankRecord(
        comm_rank=r, launched=counts(launched), completed=counts(launched if completed is None else completed)
    )


def test_process_order_is_table_order_then_unknown_addresses():
    a, b, stranger = Addr("10.0.0.2", 1), Addr("10.0.0.1", 9), Addr("9.0.0.1", 1)
    snap = JobSnapshot(peers=(PeerInfo(a, 1, "h", 1), PeerInfo(b, 2, "h", 1)))
    assert sorted([stranger, a, b], key=process_order(snap)) == [b, a, stranger]
    odd = Addr("not-an-ip", 1)  # a malformed address sorts last and never raises
    assert sorted([odd, stranger], key=process_order(snap)) == [stranger, odd]


def test_the_merge_keys_by_hash_and_size_keeps_the_first_report_in_process_order_and_drops_malformed_records():
    first, second = Addr("10.0.0.1", 1), Addr("10.0.0.1", 2)
    peers = (PeerInfo(first, 1, "h", 1), PeerInfo(second, 2, "h", 1))
    responses = {  # arrival order: the second process answered first
        second: ProcessData(
            comms=(
                CommRecord(0xAB, 2, (rank(0, 9), rank(1, 5)), ((0, 2, 1),)),
                CommRecord(0xAB, 3, (rank(0, 1),)),  # same hash, other size: a collision
                CommRecord(0xCD, 0, (rank(0, 1),)),  # size 0: malformed
                CommRecord(0xEF, 2, (rank(7, 1),)),
            )
        ),  # rank out of range
        first: ProcessData(comms=(CommRecord(0xAB, 2, (rank(0, 4),)),)),
    }
    merged = merge_communicators(JobSnapshot(peers=peers, responses=responses))
    assert [(m.comm_hash, m.size) for m in merged] == [(0xAB, 2), (0xAB, 3)]
    two = merged[0]
    assert two.ranks[0] == ReportedRank(first, rank(0, 4))  # the table's first process wins, not the first arrival
    assert two.ranks[1] == ReportedRank(second, rank(1, 5))
    assert two.global_rank(1) == 1 and merged[1].global_rank(0) is None


def test_the_sweeper_and_the_report_judge_the_same_ranks():
    """A rank reported twice (a restarted process and a late answer from its predecessor's data): the sweeper's
    attribution and the report's MISMATCH read the same record of it."""
    a, b = Addr("10.0.0.1", 1), Addr("10.0.0.1", 2)
    peers = (PeerInfo(a, 1, "h", 1), PeerInfo(b, 2, "h", 1))
    responses = {
        b: ProcessData(comms=(CommRecord(0xAB, 2, (rank(1, 10), rank(0, 10)), ((0, 2, 1),)),)),
        a: ProcessData(comms=(CommRecord(0xAB, 2, (rank(0, 11, 10),), ((0, 2, 1),)),)),
    }
    snap = JobSnapshot(peers=peers, responses=responses)
    detector = StuckDetector(limit=1.0)
    detector.observe(snap, 0.0)
    (verdict,), _ = detector.observe(snap, 1.0)
    assert (verdict.seq, verdict.behind, verdict.inside) == (11, (1,), (0,))
    (comm,) = build_report(snap).communicators
    assert comm.ranks[0].addr == a and comm.ranks[0].record.launched[AR] == 11 and comm.mismatched_ops == (AR,)
