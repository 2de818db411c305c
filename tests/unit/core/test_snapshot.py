"""One merge of a job snapshot: the sweeper and the report see the same communicators, ranks and processes."""

import ast
from pathlib import Path

import rasd.core
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


def test_an_address_both_dead_and_departed_is_departed_and_the_report_reads_the_sets_as_they_are():
    """The gather never gives one process both verdicts; a snapshot built by hand may, and the snapshot resolves it
    once (it said goodbye first), so the report lists each process once, under LEFT, and counts it there."""
    a, b, c = Addr("10.0.0.1", 1), Addr("10.0.0.1", 2), Addr("10.0.0.1", 3)
    peers = (PeerInfo(a, 1, "h", 1), PeerInfo(b, 2, "h", 1), PeerInfo(c, 3, "h", 1))
    snap = JobSnapshot(peers=peers, dead=frozenset({a, b}), left=frozenset({b}), responses={c: ProcessData()})
    assert snap.dead == {a} and snap.left == {b} and snap.missing() == []
    report = build_report(snap)
    assert [p.addr for p in report.dead_processes] == [a] and [p.addr for p in report.left_processes] == [b]
    assert (report.dead_count, report.left_count) == (1, 1) and report.summary.process_count == 2
    untouched = frozenset({a})
    assert JobSnapshot(peers=peers, dead=untouched, left=frozenset({b})).dead is untouched


def _core_imports() -> dict[str, set[str]]:
    """Module -> the modules of rasd.core it imports, under TYPE_CHECKING and inside functions included."""
    folder = Path(rasd.core.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported |= {node.module} if node.module else {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rasd.core."):
                imported.add(node.module.removeprefix("rasd.core.").split(".")[0])
            elif isinstance(node, ast.Import):
                imported |= {a.name.removeprefix("rasd.core.") for a in node.names if a.name.startswith("rasd.core.")}
        graph[path.stem] = imported
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return False


def test_the_snapshot_and_the_stuck_detector_import_each_other_one_way_only():
    """stuck -> snapshot -> stuck_verdict: the verdict a snapshot carries is a value of its own module."""
    graph = _core_imports()
    assert "snapshot" in graph["stuck"] and "stuck_verdict" in graph["snapshot"]
    assert not _reaches(graph, "snapshot", "stuck") and not _reaches(graph, "stuck_verdict", "snapshot")
