"""The ``Job summary`` section of the text report, in NCCL's three layouts (docs/protocol.md §3.2)."""

from __future__ import annotations

from .outliers import is_outlier
from .summary import JobSummary, SummaryLayout
from .text_lines import plural_es, plural_s

_UNIFORM_HEADER = (
    "  Nodes  Processes         GPUs  Processes     GPUs\n(total)   per node  per process    (total)  (total)\n"
)
_NODES_HEADER = "  Nodes  Processes         GPUs\n          per node  per process\n"
_NODES_ONLY_HEADER = "  Nodes  Processes\n          per node\n"
_DEVICES_HEADER = "\n         Processes         GPUs\n                    per process\n"
_TOTALS_HEADER = "\n  Nodes  Processes         GPUs\n(total)    (total)      (total)\n"


def render_job_summary(summary: JobSummary, verbose: bool) -> str:
    out = ["Job summary\n===========\n\n"]
    layout = summary.layout
    if layout is SummaryLayout.UNIFORM:
        out.append(_UNIFORM_HEADER)
        out.append(
            "%7d  %9d  %11d  %9d  %7d\n"
            % (
                summary.node_count,
                summary.processes_per_node,
                summary.devices_per_process,
                summary.process_count,
                summary.device_count,
            )
        )
        return "".join(out)

    if layout is SummaryLayout.UNEVEN_NODES:
        out.append(_NODES_HEADER)
        for row in summary.node_rows:
            out.append("%7d  %9d  %11d\n" % (row.node_count, row.processes_per_node, summary.devices_per_process))
    else:
        out.append(_NODES_ONLY_HEADER)
        for row in summary.node_rows:
            out.append("%7d  %9d\n" % (row.node_count, row.processes_per_node))
        out.append(_DEVICES_HEADER)
        for device_row in summary.device_rows:
            out.append("         %9d  %11d\n" % (device_row.process_count, device_row.devices_per_process))

    out.append(_TOTALS_HEADER)
    out.append("%7d  %9d  %11d\n" % (summary.node_count, summary.process_count, summary.device_count))

    if layout is SummaryLayout.UNEVEN_NODES:
        # The most common row is taken to be the norm; the others are listed node by node if they are outliers.
        for row in summary.node_rows[1:]:
            if not is_outlier(row.node_count, verbose, summary.node_count):
                continue
            out.append(f"\nThe outlier node{plural_s(row.node_count)}:\n")
            for node in row.nodes:
                pids = ",".join(str(pid) for pid in node.pids)
                out.append(f"  Node {node.host} running process{plural_es(row.processes_per_node)} {pids}\n")
    return "".join(out)
