"""The job summary (docs/protocol.md §3.2): its three layouts, outlier nodes, CPU processes, dead and departed ones."""

from rasd.core.peers import Addr, PeerInfo
from rasd.report import SummaryLayout, build_job_summary, build_report, render_head
from report_builders import RUNTIME_LINE, VERSION_LINE, make_peers, make_snapshot


def head(peers, verbose=False, left=frozenset()):
    summary = build_job_summary(peers, left)
    return render_head(summary, version_line=VERSION_LINE, runtime_line=RUNTIME_LINE, verbose=verbose)


def summary_block(peers, verbose=False, left=frozenset()):
    text = head(peers, verbose, left)
    return text.split("Job summary\n===========\n\n", 1)[1].rsplit("\nCommunicators...", 1)[0]


def test_head_is_versions_summary_and_communicators_prompt():
    assert head(make_peers([2])) == (
        "torchras version 0.1.0 with torch 2.13.0+cpu\n"
        "gloo backend, no CUDA\n"
        "\n"
        "Job summary\n"
        "===========\n"
        "\n"
        "  Nodes  Processes         GPUs  Processes     GPUs\n"
        "(total)   per node  per process    (total)  (total)\n"
        "      1          2            1          2        2\n"
        "\n"
        "Communicators..."
    )


def test_uniform_four_nodes_of_eight():
    assert summary_block(make_peers([8, 8, 8, 8])) == (
        "  Nodes  Processes         GPUs  Processes     GPUs\n"
        "(total)   per node  per process    (total)  (total)\n"
        "      4          8            1         32       32\n"
    )


def test_cpu_processes_have_zero_gpus():
    peers = make_peers([4, 4], gpus=0)
    assert build_job_summary(peers).layout is SummaryLayout.UNIFORM
    assert summary_block(peers) == (
        "  Nodes  Processes         GPUs  Processes     GPUs\n"
        "(total)   per node  per process    (total)  (total)\n"
        "      2          4            0          8        0\n"
    )


def test_uneven_processes_per_node_lists_the_outlier_node_with_its_own_pids():
    # Five nodes of 8 and one of 7: the 7-process node (10.0.0.6, pids 1040..1046) is the outlier.
    peers = make_peers([8, 8, 8, 8, 8, 7])
    assert build_job_summary(peers).layout is SummaryLayout.UNEVEN_NODES
    assert summary_block(peers) == (
        "  Nodes  Processes         GPUs\n"
        "          per node  per process\n"
        "      5          8            1\n"
        "      1          7            1\n"
        "\n"
        "  Nodes  Processes         GPUs\n"
        "(total)    (total)      (total)\n"
        "      6         47           47\n"
        "\n"
        "The outlier node:\n"
        "  Node 10.0.0.6 running processes 1040,1041,1042,1043,1044,1045,1046\n"
    )


def test_uneven_rows_tie_on_count_put_the_larger_value_first_and_list_plural_outlier_nodes():
    # 2 nodes of 4, 2 nodes of 2, 4 nodes of 3: rows 4x3, then the tie 2x4 before 2x2.
    peers = make_peers([4, 2, 3, 3, 4, 2, 3, 3])
    block = summary_block(peers)
    assert block == (
        "  Nodes  Processes         GPUs\n"
        "          per node  per process\n"
        "      4          3            1\n"
        "      2          4            1\n"
        "      2          2            1\n"
        "\n"
        "  Nodes  Processes         GPUs\n"
        "(total)    (total)      (total)\n"
        "      8         24           24\n"
        "\n"
        "The outlier nodes:\n"
        "  Node 10.0.0.1 running processes 1000,1001,1002,1003\n"
        "  Node 10.0.0.5 running processes 1012,1013,1014,1015\n"
        "\n"
        "The outlier nodes:\n"
        "  Node 10.0.0.2 running processes 1004,1005\n"
        "  Node 10.0.0.6 running processes 1016,1017\n"
    )


def test_outlier_nodes_follow_the_outlier_rule_and_verbose():
    # 3 nodes of 2 and 2 nodes of 1: 2 > 5 * 0.25, so not listed; verbose lists them (2 < 2.5).
    peers = make_peers([2, 2, 1, 2, 1])
    assert "outlier" not in summary_block(peers)
    assert summary_block(peers, verbose=True).endswith(
        "\nThe outlier nodes:\n  Node 10.0.0.3 running process 1004\n  Node 10.0.0.5 running process 1007\n"
    )


def test_uneven_gpus_per_process():
    # One node with 2 processes of 2 GPUs, one with 2 processes of 1 GPU: B fails (and A holds).
    peers = make_peers([2, 2], gpus=[2, 2, 1, 1])
    assert build_job_summary(peers).layout is SummaryLayout.UNEVEN_DEVICES
    assert summary_block(peers) == (
        "  Nodes  Processes\n"
        "          per node\n"
        "      2          2\n"
        "\n"
        "         Processes         GPUs\n"
        "                    per process\n"
        "                 2            2\n"
        "                 2            1\n"
        "\n"
        "  Nodes  Processes         GPUs\n"
        "(total)    (total)      (total)\n"
        "      2          4            6\n"
    )


def test_uneven_gpus_within_a_node_and_uneven_nodes_show_no_outliers():
    # A fails (node 1 mixes 1 and 0 devices) and C fails: the devices layout, without an outlier listing.
    peers = make_peers([3, 3, 1], gpus=[1, 0, 1, 1, 1, 1, 1])
    summary = build_job_summary(peers)
    assert not summary.devices_even_within_nodes
    assert summary_block(peers) == (
        "  Nodes  Processes\n"
        "          per node\n"
        "      2          3\n"
        "      1          1\n"
        "\n"
        "         Processes         GPUs\n"
        "                    per process\n"
        "                 6            1\n"
        "                 1            0\n"
        "\n"
        "  Nodes  Processes         GPUs\n"
        "(total)    (total)      (total)\n"
        "      3          7            6\n"
    )


def test_dead_processes_count_and_departed_ones_do_not():
    peers = make_peers([4, 4])
    snapshot = make_snapshot(peers, dead=[1], left=[6, 7])
    summary = build_report(snapshot).summary
    assert (summary.node_count, summary.process_count, summary.device_count) == (2, 6, 6)
    # The node that lost two processes now looks uneven.
    assert summary.layout is SummaryLayout.UNEVEN_NODES


def test_a_node_is_a_host_ip_whatever_the_port_and_ipv4_sorts_before_ipv6():
    peers = (
        PeerInfo(Addr("::1", 5), 7, "h", 1, (0,), 0),
        PeerInfo(Addr("10.0.0.2", 9), 5, "h", 2, (0,), 1),
        PeerInfo(Addr("10.0.0.2", 3), 6, "h", 3, (1,), 2),
        PeerInfo(Addr("::1", 4), 8, "h", 4, (1,), 3),
    )
    summary = build_job_summary(peers)
    assert (summary.node_count, summary.processes_per_node) == (2, 2)
    assert [n.host for row in summary.node_rows for n in row.nodes] == ["10.0.0.2", "::1"]


def test_empty_table_prints_zeros():
    assert summary_block(()) == (
        "  Nodes  Processes         GPUs  Processes     GPUs\n"
        "(total)   per node  per process    (total)  (total)\n"
        "      0          0            0          0        0\n"
    )
