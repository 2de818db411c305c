"""The whole text report and the communicator table (docs/protocol.md §3.1-3.2): layout, sorting, grouping, names."""

from pathlib import Path

from rasd.core.comms import CommRecord, ProcessData, RankRecord
from rasd.core.peers import Addr
from rasd.core.snapshot import JobSnapshot
from rasd.report import build_report, render_head, render_tail, render_text
from report_builders import RUNTIME_LINE, VERSION_LINE, comm_records, launched, make_peers, make_snapshot

GOLDEN = Path(__file__).parent / "golden"


def text(snapshot, verbose=False):
    return render_text(build_report(snapshot), version_line=VERSION_LINE, runtime_line=RUNTIME_LINE, verbose=verbose)


def table(snapshot):
    return text(snapshot).split("=============\n\n", 1)[1].split("\nErrors\n", 1)[0]


def test_healthy_job_one_node_eight_processes_byte_for_byte():
    peers = make_peers([8])
    snapshot = make_snapshot(peers, comm_records(peers, 0x27A079B828FF1A75))
    assert text(snapshot) == (GOLDEN / "healthy_1x8.txt").read_text()


def test_head_and_tail_join_into_the_whole_report():
    peers = make_peers([8])
    report = build_report(make_snapshot(peers, comm_records(peers, 0x1), collection_time=2.0456))
    head = render_head(report.summary, version_line=VERSION_LINE, runtime_line=RUNTIME_LINE)
    tail = render_tail(report)
    assert head.endswith("\nCommunicators...")
    assert tail.startswith(" (2.046s)\n=============\n\n")
    assert head + tail == render_text(report, version_line=VERSION_LINE, runtime_line=RUNTIME_LINE)


def test_no_communicators():
    snapshot = make_snapshot(make_peers([2]))
    assert text(snapshot).endswith(
        "Communicators... (0.001s)\n"
        "=============\n"
        "\n"
        "No communicator data collected!\n"
        "\n"
        "Errors\n"
        "======\n"
        "\n"
        "Warnings\n"
        "========\n"
        "\n"
    )


def test_groups_sorted_by_size_nodes_status_errors():
    peers = make_peers([4, 4])
    snapshot = make_snapshot(
        peers,
        comm_records(peers, 0x10),  # 8 ranks on 2 nodes
        comm_records(peers, 0x20, members=[0, 1, 2, 3]),  # 4 ranks on 1 node, RUNNING
        comm_records(peers, 0x21, members=[4, 5, 6, 7]),
        comm_records(
            peers,
            0x22,
            members=[4, 5, 6, 7],  # 4 ranks on 1 node, FINALIZE
            per_rank={r: {"destroy_flag": True} for r in range(4)},
        ),
        comm_records(peers, 0x30, members=[0, 1, 4, 5]),  # 4 ranks on 2 nodes
        comm_records(peers, 0x31, members=[2, 3, 6, 7]),
        comm_records(peers, 0x40, members=[0, 4]),  # 2 ranks, OK
        comm_records(
            peers,
            0x41,
            members=[1, 5],  # 2 ranks, MISMATCH
            per_rank={0: {"launched": launched(AllReduce=2)}},
        ),
    )
    assert table(snapshot) == (
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
        "    #  in group  per comm  per node  per comm  in group\n"
        "    0         1         2         4         8         8   RUNNING      OK\n"
        "    1         2         2         2         4         8   RUNNING      OK\n"
        "    2         1         1         4         4         4  FINALIZE      OK\n"
        "    3         2         1         4         4         8   RUNNING      OK\n"
        "    4         1         2         1         2         2   RUNNING  MISMATCH\n"
        "    5         1         2         1         2         2   RUNNING      OK\n"
    )
    report = build_report(snapshot)
    assert [c.label for c in report.groups[1].communicators] == ["#1-0 (0000000000000030)", "#1-1 (0000000000000031)"]
    assert "#4-0 (0000000000000041) MISMATCH\n" in text(snapshot)


def test_ranks_per_node_range_and_distinct_devices_in_group():
    # Two 3-rank comms on 2 nodes: {0, 1 | 4} and {2 | 5, 6}: 1-2 ranks per node; 6 distinct devices.
    peers = make_peers([4, 4])
    snapshot = make_snapshot(
        peers, comm_records(peers, 0x1, members=[0, 1, 4]), comm_records(peers, 0x2, members=[2, 5, 6])
    )
    assert table(snapshot).endswith("    0         2         2       1-2         3         6   RUNNING      OK\n")


def test_ranks_in_group_counts_a_shared_device_once():
    # Two comms over the same 4 processes: 4 GPUs, not 8.
    peers = make_peers([4])
    snapshot = make_snapshot(peers, comm_records(peers, 0x1), comm_records(peers, 0x2))
    assert table(snapshot).endswith("    0         2         1         4         4         4   RUNNING      OK\n")


def test_within_a_group_the_comm_missing_most_ranks_comes_first():
    peers = make_peers([8])
    snapshot = make_snapshot(
        peers,
        comm_records(peers, 0x1, members=[0, 1, 2, 3], holders=[0, 1, 2]),  # 1 rank NOCOMM
        comm_records(peers, 0x2, members=[4, 5, 6, 7], holders=[4, 5]),  # 2 ranks NOCOMM
    )
    report = build_report(snapshot)
    assert [(c.label, len(c.ranks)) for c in report.communicators] == [
        ("#0-0 (0000000000000002)", 2),
        ("#0-1 (0000000000000001)", 3),
    ]


def test_same_hash_different_sizes_are_kept_apart():
    peers = make_peers([4])
    snapshot = make_snapshot(peers, comm_records(peers, 0x7), comm_records(peers, 0x7, members=[0, 1]))
    report = build_report(snapshot)
    assert [(c.comm_hash, c.size, c.errors) for c in report.communicators] == [(0x7, 4, 0), (0x7, 2, 0)]


def test_cpu_ranks_and_a_process_holding_two_ranks():
    # One process holds ranks 0 and 1 (devices 0 and 1), another rank 2 on the CPU.
    peers = make_peers([2], gpus=[2, 0])
    a, b = peers
    snapshot = JobSnapshot(
        peers=peers,
        responses={
            a.addr: ProcessData((CommRecord(0x9, 3, (RankRecord(0, device=0), RankRecord(1, device=1))),)),
            b.addr: ProcessData((CommRecord(0x9, 3, (RankRecord(2, device=-1),)),)),
        },
    )
    assert table(snapshot).endswith("    0         1         1         3         3         3   RUNNING      OK\n")


def test_collection_time_has_three_decimals():
    snapshot = make_snapshot(make_peers([1]), collection_time=2.05)
    assert "Communicators... (2.050s)\n=============\n" in text(snapshot)


def test_hash_is_sixteen_hex_digits():
    peers = make_peers([2])
    snapshot = make_snapshot(
        peers, comm_records(peers, 0xFFFFFFFFFFFFFFFF, per_rank={1: {"launched": launched(Barrier=1)}})
    )
    assert "#0-0 (ffffffffffffffff) MISMATCH\n" in text(snapshot)


def test_unknown_responder_still_counts():
    # A process the peer table does not know answered: its rank is present; naming it falls back.
    peers = make_peers([2])
    stranger = Addr("10.0.0.9", 1)
    snapshot = JobSnapshot(
        peers=peers,
        responses={
            peers[0].addr: ProcessData((CommRecord(0x5, 2, (RankRecord(0, device=0),)),)),
            peers[1].addr: ProcessData(),
            stranger: ProcessData((CommRecord(0x5, 2, (RankRecord(1, device=0, abort_flag=True),)),)),
        },
    )
    out = text(snapshot)
    assert "  Rank 1 has status ABORT -- [process information not found]\n" in out


def test_faulty_job_byte_for_byte():
    # 2 nodes of 4: process 6 dead, process 3 silent, two legs timed out; in the world communicator rank 1 is an
    # AllReduce behind and rank 5 reported a remote error; one communicator per node besides.
    peers = make_peers([4, 4])
    world = {r: {"launched": launched(AllReduce=11 if r == 1 else 12)} for r in range(8)}
    world[5]["async_error"] = 6
    snapshot = make_snapshot(
        peers,
        comm_records(peers, 0x27A079B828FF1A75, per_rank=world),
        comm_records(peers, 0x1111, members=[0, 1, 2, 3]),
        comm_records(peers, 0x2222, members=[4, 5, 6, 7]),
        dead=[6],
        silent=[3],
        timeouts=2,
        collection_time=2.0512,
    )
    assert text(snapshot) == (GOLDEN / "faulty_2x4.txt").read_text()
