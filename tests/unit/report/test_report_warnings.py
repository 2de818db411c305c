"""The Warnings section (docs/protocol.md §3.2-3.3): timeouts, departed processes, mismatches."""

from rasd.core.comms import OP_TYPES, CommRecord, ProcessData, RankRecord, runs_of
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.report import CommErrors, MissingReason, Status, build_report, render_text
from report_builders import RUNTIME_LINE, VERSION_LINE, comm_records, launched, make_peers, make_snapshot, section


def warnings(snapshot, verbose=False):
    out = render_text(build_report(snapshot), version_line=VERSION_LINE, runtime_line=RUNTIME_LINE, verbose=verbose)
    return section(out, "Warnings")


def test_timeout_singular_and_plural():
    peers = make_peers([2])
    assert warnings(make_snapshot(peers, timeouts=1)) == (
        "TIMEOUT\n  Encountered 1 communication timeout while gathering communicator data\n\n"
    )
    assert warnings(make_snapshot(peers, timeouts=2)) == (
        "TIMEOUT\n  Encountered 2 communication timeouts while gathering communicator data\n\n"
    )


def test_the_docs_split_of_26_and_6_lists_only_the_6():
    peers = make_peers([8, 8, 8, 8])
    behind = (2, 3, 9, 17, 25, 30)
    per_rank = {r: {"launched": launched(AllReduce=4 if r in behind else 5)} for r in range(32)}
    snapshot = make_snapshot(peers, comm_records(peers, 0xAA, per_rank=per_rank))
    expected = (
        "#0-0 (00000000000000aa) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  26 ranks have launched up to operation 5\n"
        "  6 ranks have launched up to operation 4\n"
        "  Rank 2 -- GPU 2 managed by process 1002 on node 10.0.0.1\n"
        "  Rank 3 -- GPU 3 managed by process 1003 on node 10.0.0.1\n"
        "  Rank 9 -- GPU 1 managed by process 1009 on node 10.0.0.2\n"
        "  Rank 17 -- GPU 1 managed by process 1017 on node 10.0.0.3\n"
        "  Rank 25 -- GPU 1 managed by process 1025 on node 10.0.0.4\n"
        "  Rank 30 -- GPU 6 managed by process 1030 on node 10.0.0.4\n"
        "\n"
    )
    assert warnings(snapshot) == expected
    assert warnings(snapshot, verbose=True) == expected  # 26 is not < 16


def test_two_ranks_both_singles_are_printed():
    peers = make_peers([2])
    snapshot = make_snapshot(peers, comm_records(peers, 0x2, per_rank={0: {"launched": launched(AllReduce=3)}}))
    assert warnings(snapshot) == (
        "#0-0 (0000000000000002) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  Rank 0 has launched up to operation 3 -- GPU 0 managed by process 1000 on node 10.0.0.1\n"
        "  Rank 1 has not launched any operations -- GPU 1 managed by process 1001 on node 10.0.0.1\n"
        "\n"
    )


def test_ranks_that_have_not_launched_anything_and_verbose():
    peers = make_peers([8])
    per_rank = {r: {"launched": launched(Broadcast=1)} for r in range(5)}
    snapshot = make_snapshot(peers, comm_records(peers, 0x3, per_rank=per_rank))
    assert warnings(snapshot) == (
        "#0-0 (0000000000000003) MISMATCH\n"
        "  Communicator ranks have different Broadcast operation counts\n"
        "  5 ranks have launched up to operation 1\n"
        "  3 ranks have not launched any operations\n"
        "\n"
    )
    assert warnings(snapshot, verbose=True) == (
        "#0-0 (0000000000000003) MISMATCH\n"
        "  Communicator ranks have different Broadcast operation counts\n"
        "  5 ranks have launched up to operation 1\n"
        "  3 ranks have not launched any operations\n"
        "  Rank 5 -- GPU 5 managed by process 1005 on node 10.0.0.1\n"
        "  Rank 6 -- GPU 6 managed by process 1006 on node 10.0.0.1\n"
        "  Rank 7 -- GPU 7 managed by process 1007 on node 10.0.0.1\n"
        "\n"
    )


def test_every_op_type_is_compared_in_order_ncclc_five_first():
    peers = make_peers([4], gpus=0)
    per_rank = {3: {"launched": launched(Barrier=2, Reduce=1, Recv=4)}}
    snapshot = make_snapshot(peers, comm_records(peers, 0x4, per_rank=per_rank))
    assert warnings(snapshot) == (
        "#0-0 (0000000000000004) MISMATCH\n"
        "  Communicator ranks have different Reduce operation counts\n"
        "  3 ranks have not launched any operations\n"
        "  Rank 3 has launched up to operation 1 -- CPU managed by process 1003 on node 10.0.0.1\n"
        "\n"
        "  Communicator ranks have different Barrier operation counts\n"
        "  3 ranks have not launched any operations\n"
        "  Rank 3 has launched up to operation 2 -- CPU managed by process 1003 on node 10.0.0.1\n"
        "\n"
        "  Communicator ranks have different Recv operation counts\n"
        "  3 ranks have not launched any operations\n"
        "  Rank 3 has launched up to operation 4 -- CPU managed by process 1003 on node 10.0.0.1\n"
        "\n"
    )


def test_completed_counts_do_not_make_a_mismatch():
    peers = make_peers([2])
    snapshot = make_snapshot(
        peers,
        comm_records(
            peers,
            0x5,
            per_rank={
                0: {"launched": launched(AllReduce=3), "completed": launched(AllReduce=3)},
                1: {"launched": launched(AllReduce=3), "completed": launched(AllReduce=2)},
            },
        ),
    )
    assert warnings(snapshot) == ""


def test_status_part_alone_ends_with_a_blank_line():
    peers = make_peers([8])
    snapshot = make_snapshot(peers, comm_records(peers, 0x6, per_rank={7: {"abort_flag": True}}))
    assert warnings(snapshot) == (
        "#0-0 (0000000000000006) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  7 ranks have status RUNNING\n"
        "  Rank 7 has status ABORT -- GPU 7 managed by process 1007 on node 10.0.0.1\n"
        "\n"
    )
    assert build_report(snapshot).communicators[0].status is Status.ABORT


def test_status_part_then_count_part():
    peers = make_peers([4])
    per_rank = {0: {"init_state": 7}, 1: {"finalize_called": True}, 2: {"launched": launched(AllGather=9)}}
    snapshot = make_snapshot(peers, comm_records(peers, 0x7, per_rank=per_rank))
    # Statuses: INIT 1, FINALIZE 1, RUNNING 2 -> RUNNING first, then the singles, the higher status first.
    assert warnings(snapshot) == (
        "#0-0 (0000000000000007) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  2 ranks have status RUNNING\n"
        "  Rank 1 has status FINALIZE -- GPU 1 managed by process 1001 on node 10.0.0.1\n"
        "  Rank 0 has status INIT -- GPU 0 managed by process 1000 on node 10.0.0.1\n"
        "  Communicator ranks have different AllGather operation counts\n"
        "  3 ranks have not launched any operations\n"
        "  Rank 2 has launched up to operation 9 -- GPU 2 managed by process 1002 on node 10.0.0.1\n"
        "\n"
    )


def test_nocomm_when_every_process_answered():
    peers = make_peers([8])
    snapshot = make_snapshot(peers, comm_records(peers, 0x8, holders=list(range(7))))
    assert warnings(snapshot) == (
        "#0-0 (0000000000000008) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  7 ranks have status RUNNING\n"
        "  Rank 7 has status NOCOMM -- GPU 7 managed by process 1007 on node 10.0.0.1\n"
        "\n"
    )
    comm = build_report(snapshot).communicators[0]
    assert (comm.status, comm.errors, comm.status_bits) == (
        Status.RUNNING,
        CommErrors.MISMATCH,
        Status.RUNNING | Status.NOCOMM,
    )


def test_nocomm_and_incomplete_in_one_communicator():
    # Process 6 answered without the communicator (NOCOMM); process 7 is silent (INCOMPLETE).
    peers = make_peers([8])
    snapshot = make_snapshot(peers, comm_records(peers, 0x9, holders=list(range(6))), silent=[7])
    comm = build_report(snapshot).communicators[0]
    assert comm.errors == CommErrors.MISMATCH | CommErrors.INCOMPLETE
    assert [m.comm_rank for m in comm.nocomm_ranks] == [6]
    assert [m.comm_rank for m in comm.incomplete_ranks] == [7]
    assert warnings(snapshot) == (
        "#0-0 (0000000000000009) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  6 ranks have status RUNNING\n"
        "  Rank 6 has status NOCOMM -- GPU 6 managed by process 1006 on node 10.0.0.1\n"
        "\n"
    )


def test_several_nocomm_ranks_in_a_large_communicator_verbose():
    peers = make_peers([8, 8])
    snapshot = make_snapshot(peers, comm_records(peers, 0xA, holders=list(range(13))))
    assert warnings(snapshot) == (
        "#0-0 (000000000000000a) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  13 ranks have status RUNNING\n"
        "  3 ranks have status NOCOMM\n"
        "  Rank 13 -- GPU 5 managed by process 1013 on node 10.0.0.2\n"
        "  Rank 14 -- GPU 6 managed by process 1014 on node 10.0.0.2\n"
        "  Rank 15 -- GPU 7 managed by process 1015 on node 10.0.0.2\n"
        "\n"
    )


def test_left_processes_are_a_warning_not_an_error():
    peers = make_peers([4])
    snapshot = make_snapshot(peers, comm_records(peers, 0xB), left=[2, 3])
    report = build_report(snapshot)
    assert report.missing_processes == () and report.dead_count == 0 and report.left_count == 2
    out = render_text(report, version_line=VERSION_LINE, runtime_line=RUNTIME_LINE)
    assert section(out, "Errors") == ""
    assert warnings(snapshot) == (
        "LEFT\n"
        "  2 job processes left the job cleanly\n"
        "  Process 1002 on node 10.0.0.1 managing GPU 2\n"
        "  Process 1003 on node 10.0.0.1 managing GPU 3\n"
        "\n"
        "#0-0 (000000000000000b) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  2 ranks have status RUNNING\n"
        "  2 ranks have status NOCOMM\n"
        "\n"
    )  # 2 of 4 ranks: no group is an outlier (2 > 4 * 0.25), so no rank is listed


def test_one_left_process_and_a_silent_one():
    peers = make_peers([4])
    snapshot = make_snapshot(peers, comm_records(peers, 0xC), left=[1], silent=[2])
    out = warnings(snapshot)
    assert out.startswith(
        "LEFT\n  1 job process left the job cleanly\n  Process 1001 on node 10.0.0.1 managing GPU 1\n\n"
    )
    comm = build_report(snapshot).communicators[0]
    assert [m.comm_rank for m in comm.nocomm_ranks] == [1]
    assert [m.comm_rank for m in comm.incomplete_ranks] == [2]


def test_order_timeout_left_then_communicators():
    peers = make_peers([4])
    snapshot = make_snapshot(
        peers,
        comm_records(peers, 0x1, members=[0, 1], per_rank={1: {"launched": launched(Send=1)}}),
        left=[3],
        timeouts=3,
    )
    titles = [line for line in warnings(snapshot).splitlines() if line and not line.startswith("  ")]
    assert titles == ["TIMEOUT", "LEFT", "#0-0 (0000000000000001) MISMATCH"]


def test_nocomm_rank_of_an_unknown_process_when_everyone_answered():
    peers = make_peers([2])
    snapshot = JobSnapshot(
        peers=peers,
        responses={
            peers[0].addr: ProcessData((CommRecord(0xD, 3, (RankRecord(0, device=0),)),)),
            peers[1].addr: ProcessData((CommRecord(0xD, 3, (RankRecord(1, device=1),)),)),
        },
    )
    assert warnings(snapshot) == (
        "#0-0 (000000000000000d) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  2 ranks have status RUNNING\n"
        "  Rank 2 has status NOCOMM -- [process information not found]\n"
        "\n"
    )


def test_a_restarted_process_is_named_rather_than_its_dead_predecessor():
    # Global rank 1 ran as process 1001 (now dead) and runs again as 1002, which answered without the communicator.
    old = PeerInfo(Addr("10.0.0.1", 2), 1001, "n", 1, (1,), 1)
    new = PeerInfo(Addr("10.0.0.1", 3), 1002, "n", 2, (1,), 1)
    first = PeerInfo(Addr("10.0.0.1", 1), 1000, "n", 3, (0,), 0)
    record = CommRecord(0xE, 2, (RankRecord(0, device=0),), rank_map=runs_of([0, 1]))
    snapshot = JobSnapshot(
        peers=(first, old, new),
        dead=frozenset({old.addr}),
        responses={first.addr: ProcessData((record,)), new.addr: ProcessData()},
    )
    comm = build_report(snapshot).communicators[0]
    assert [(m.comm_rank, m.process.pid, m.reason) for m in comm.missing] == [(1, 1002, MissingReason.NOCOMM)]


def test_a_split_by_type_that_differs_while_totals_agree_is_no_mismatch():
    """Collectives beneath the Python hooks are typed from the Flight Recorder, read now and then, so two ranks may
    split the same collectives differently for a while (rasd/torch/records.py); their totals are exact."""
    peers = make_peers([4])
    per_rank = {
        r: {"launched": launched(Broadcast=3, AllReduce=40), "completed": launched(Broadcast=3, AllReduce=40)}
        for r in range(4)
    }
    per_rank[2] = {"launched": launched(Broadcast=3, Other=40), "completed": launched(Broadcast=3, Other=40)}
    report = build_report(make_snapshot(peers, comm_records(peers, 0x5, per_rank=per_rank)))
    assert not report.communicators[0].errors & CommErrors.MISMATCH
    assert warnings(make_snapshot(peers, comm_records(peers, 0x5, per_rank=per_rank))) == ""


def test_totals_that_differ_name_the_op_types_that_differ():
    peers = make_peers([4])
    done = {"launched": launched(AllReduce=41), "completed": launched(AllReduce=41)}
    per_rank = {0: done, 1: done, 3: done, 2: {"launched": launched(AllReduce=40), "completed": launched(AllReduce=40)}}
    report = build_report(make_snapshot(peers, comm_records(peers, 0x6, per_rank=per_rank)))
    comm = report.communicators[0]
    assert comm.errors & CommErrors.MISMATCH
    assert [OP_TYPES[op] for op in comm.mismatched_ops] == ["AllReduce"]
