"""The Errors section (docs/protocol.md §3.2-3.3): missing processes, dead ones, missing ranks, rank errors."""

from rasd.core.comms import CommRecord, ProcessData, RankRecord
from rasd.core.snapshot import JobSnapshot
from rasd.report import CommErrors, build_report, render_text
from report_builders import RUNTIME_LINE, VERSION_LINE, comm_records, make_peers, make_snapshot, section


def errors(snapshot, verbose=False):
    out = render_text(build_report(snapshot), version_line=VERSION_LINE, runtime_line=RUNTIME_LINE, verbose=verbose)
    return section(out, "Errors")


def test_one_silent_process():
    peers = make_peers([8])
    snapshot = make_snapshot(peers, comm_records(peers, 0xA), silent=[5])
    assert errors(snapshot) == (
        "INCOMPLETE\n"
        "  Missing communicator data from 1 job process\n"
        "  Process 1005 on node 10.0.0.1 managing GPU 5\n"
        "\n"
        "#0-0 (000000000000000a) INCOMPLETE\n"
        "  Missing communicator data from 1 rank\n"
        "  Rank 5 -- GPU 5 managed by process 1005 on node 10.0.0.1\n"
        "\n"
    )
    assert build_report(snapshot).communicators[0].errors == CommErrors.INCOMPLETE


def test_missing_processes_sorted_by_host_then_pid_and_cpu_wording():
    peers = make_peers([2, 2], gpus=0)
    snapshot = make_snapshot(peers, silent=[3, 0, 2])
    assert errors(snapshot) == (
        "INCOMPLETE\n"
        "  Missing communicator data from 3 job processes\n"
        "  Process 1000 on node 10.0.0.1 managing CPU\n"
        "  Process 1002 on node 10.0.0.2 managing CPU\n"
        "  Process 1003 on node 10.0.0.2 managing CPU\n"
        "\n"
    )


def test_more_than_ten_missing_are_counted_not_listed_unless_verbose():
    # Node 2 (8 processes) and half of node 3 are silent: 12 processes, 12 ranks of the world communicator.
    peers = make_peers([8, 8, 8, 8])
    silent = list(range(8, 20))
    snapshot = make_snapshot(peers, comm_records(peers, 0xB), silent=silent)
    assert errors(snapshot) == (
        "INCOMPLETE\n"
        "  Missing communicator data from 12 job processes\n"
        "\n"
        "#0-0 (000000000000000b) INCOMPLETE\n"
        "  Missing communicator data from 12 ranks\n"
        "\n"
    )
    verbose = errors(snapshot, verbose=True)
    process_lines = [f"  Process {1000 + i} on node 10.0.0.{i // 8 + 1} managing GPU {i % 8}\n" for i in silent]
    rank_lines = [
        f"  Rank {i} -- GPU {i % 8} managed by process {1000 + i} on node 10.0.0.{i // 8 + 1}\n" for i in silent
    ]
    assert verbose == (
        "INCOMPLETE\n"
        "  Missing communicator data from 12 job processes\n" + "".join(process_lines) + "\n"
        "#0-0 (000000000000000b) INCOMPLETE\n"
        "  Missing communicator data from 12 ranks\n" + "".join(rank_lines) + "\n"
    )


def test_missing_rank_whose_process_is_not_known():
    # No rank map: the report cannot tell which process holds rank 2.
    peers = make_peers([3])

    def held(r: int) -> ProcessData:
        return ProcessData((CommRecord(0xC, 3, (RankRecord(r, device=r),)),))

    snapshot = JobSnapshot(peers=peers, responses={peers[0].addr: held(0), peers[1].addr: held(1)})
    assert errors(snapshot) == (
        "INCOMPLETE\n"
        "  Missing communicator data from 1 job process\n"
        "  Process 1002 on node 10.0.0.1 managing GPU 2\n"
        "\n"
        "#0-0 (000000000000000c) INCOMPLETE\n"
        "  Missing communicator data from 1 rank\n"
        "  Rank 2 -- [process information not found]\n"
        "\n"
    )


def test_one_dead_process():
    peers = make_peers([4])
    snapshot = make_snapshot(peers, comm_records(peers, 0xD), dead=[3])
    assert errors(snapshot) == (
        "DEAD\n"
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        "  Process 1003 on node 10.0.0.1 managing GPU 3\n"
        "\n"
        "#0-0 (000000000000000d) INCOMPLETE\n"
        "  Missing communicator data from 1 rank\n"
        "  Rank 3 -- GPU 3 managed by process 1003 on node 10.0.0.1\n"
        "\n"
    )


def test_several_dead_processes_and_a_silent_one():
    peers = make_peers([4, 4])
    snapshot = make_snapshot(peers, dead=[6, 1, 2], silent=[4])
    assert errors(snapshot) == (
        "INCOMPLETE\n"
        "  Missing communicator data from 1 job process\n"
        "  Process 1004 on node 10.0.0.2 managing GPU 0\n"
        "\n"
        "DEAD\n"
        "  3 job processes are considered dead (unreachable via the RAS network)\n"
        "  Process 1001 on node 10.0.0.1 managing GPU 1\n"
        "  Process 1002 on node 10.0.0.1 managing GPU 2\n"
        "  Process 1006 on node 10.0.0.2 managing GPU 2\n"
        "\n"
    )


def test_dead_address_missing_from_the_table():
    peers = make_peers([3])
    snapshot = make_snapshot(peers, dead=[2])
    snapshot = JobSnapshot(peers=peers[:2], dead=snapshot.dead, responses=snapshot.responses)
    assert errors(snapshot) == (
        "DEAD\n"
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        "  [could not find information on 1 process]\n"
        "\n"
    )


def test_init_and_async_errors_broken_down():
    peers = make_peers([8])
    snapshot = make_snapshot(
        peers,
        comm_records(
            peers,
            0xE,
            per_rank={
                2: {"init_state": 3},
                4: {"async_error": 2},
                5: {"async_error": 2},
                6: {"async_error": 6},
                7: {"async_error": 7},  # in progress: not an error
            },
        ),
    )
    assert errors(snapshot) == (
        "#0-0 (000000000000000e) ERROR\n"
        "  Initialization error on 1 rank\n"
        "  Rank 2 reported Internal error -- GPU 2 managed by process 1002 on node 10.0.0.1\n"
        "  Asynchronous errors on 3 ranks\n"
        "  2 ranks reported System error\n"
        "  Rank 4 -- GPU 4 managed by process 1004 on node 10.0.0.1\n"
        "  Rank 5 -- GPU 5 managed by process 1005 on node 10.0.0.1\n"
        "  Rank 6 reported Remote process error -- GPU 6 managed by process 1006 on node 10.0.0.1\n"
        "\n"
    )


def test_many_ranks_with_one_error_are_counted_and_ties_go_to_the_lower_code():
    peers = make_peers([8, 8])
    per_rank = {r: {"async_error": 5} for r in range(12)}
    per_rank.update({12: {"async_error": 4}, 13: {"async_error": 1}, 14: {"async_error": 99}})
    snapshot = make_snapshot(peers, comm_records(peers, 0xF, per_rank=per_rank))
    assert errors(snapshot) == (
        "#0-0 (000000000000000f) ERROR\n"
        "  Asynchronous errors on 15 ranks\n"
        "  12 ranks reported Invalid usage\n"
        "  Rank 13 reported Unhandled CUDA error -- GPU 5 managed by process 1013 on node 10.0.0.2\n"
        "  Rank 12 reported Invalid argument -- GPU 4 managed by process 1012 on node 10.0.0.2\n"
        "  Rank 14 reported Unexpected error -- GPU 6 managed by process 1014 on node 10.0.0.2\n"
        "\n"
    )


def test_timeout_code_is_broken_down_too():
    peers = make_peers([2])
    snapshot = make_snapshot(peers, comm_records(peers, 0x1, per_rank={1: {"async_error": 8}}))
    assert errors(snapshot) == (
        "#0-0 (0000000000000001) ERROR\n"
        "  Asynchronous error on 1 rank\n"
        "  Rank 1 reported Timeout -- GPU 1 managed by process 1001 on node 10.0.0.1\n"
        "\n"
    )


def test_error_on_a_cpu_rank():
    peers = make_peers([2], gpus=0)
    snapshot = make_snapshot(peers, comm_records(peers, 0x1, per_rank={0: {"async_error": 2}}))
    assert "  Rank 0 reported System error -- CPU managed by process 1000 on node 10.0.0.1\n" in errors(snapshot)


def test_order_is_incomplete_dead_then_communicators_in_table_order():
    peers = make_peers([4])
    snapshot = make_snapshot(
        peers,
        comm_records(peers, 0x2, members=[0, 1], per_rank={0: {"async_error": 3}}),
        comm_records(peers, 0x1, members=[0, 1, 2, 3]),
        dead=[3],
        silent=[2],
    )
    out = errors(snapshot)
    titles = [line for line in out.splitlines() if line and not line.startswith("  ")]
    assert titles == ["INCOMPLETE", "DEAD", "#0-0 (0000000000000001) INCOMPLETE", "#1-0 (0000000000000002) ERROR"]
