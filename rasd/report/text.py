"""The text report: NCCL's layout byte for byte (docs/protocol.md §3), with our version lines.

The server sends it in two parts, as NCCL does. The head (version lines, job summary and ``\\nCommunicators...``)
needs only the peer table and goes out as soon as the query arrives; the tail (the collection time, the
communicator table, Errors and Warnings) follows when the gather ends::

    render_head(summary, ...)  ->  "torchras version ...\\n...\\n\\nJob summary\\n...\\nCommunicators..."
    render_tail(report, ...)   ->  " (0.123s)\\n=============\\n\\nGroup     Comms ...\\nErrors\\n...Warnings\\n..."

Between the communicator table and ``Errors`` comes our ``Restarts`` section, once the job has restarted in place
(text_restarts.py); without a restart the layout is NCCL's.
"""

from __future__ import annotations

from .model import ERRORS_TEXT, Report
from .summary import JobSummary
from .text_errors import render_errors
from .text_restarts import render_restarts
from .text_summary import render_job_summary
from .text_warnings import render_warnings

_TABLE_HEADER = (
    "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
    "    #  in group  per comm  per node  per comm  in group\n"
)
NO_COMMUNICATORS = "No communicator data collected!\n"


def render_head(summary: JobSummary, *, version_line: str, runtime_line: str, verbose: bool = False) -> str:
    """Everything before the collection time. The lines are passed without their newline, e.g.
    ``torchras version 0.1.0 with torch 2.13.0+cpu`` and ``gloo backend, no CUDA``."""
    versions = f"{version_line.rstrip()}\n{runtime_line.rstrip()}\n\n"
    return f"{versions}{render_job_summary(summary, verbose)}\nCommunicators..."


def render_tail(report: Report, *, verbose: bool = False) -> str:
    """Everything from the collection time on."""
    return (
        f" ({report.collection_seconds:.3f}s)\n=============\n\n"
        f"{render_table(report)}"
        f"{render_restarts(report.restarts, verbose)}"
        f"\nErrors\n======\n\n{render_errors(report, verbose)}"
        f"Warnings\n========\n\n{render_warnings(report, verbose)}"
    )


def render_text(report: Report, *, version_line: str, runtime_line: str, verbose: bool = False) -> str:
    """The whole report, as a client receives it."""
    head = render_head(report.summary, version_line=version_line, runtime_line=runtime_line, verbose=verbose)
    return head + render_tail(report, verbose=verbose)


def render_table(report: Report) -> str:
    """The communicator table, one row per group."""
    if not report.groups:
        return NO_COMMUNICATORS
    rows = [_TABLE_HEADER]
    for group in report.groups:
        per_node = (
            str(group.ranks_per_node_min)
            if group.ranks_per_node_min == group.ranks_per_node_max
            else f"{group.ranks_per_node_min}-{group.ranks_per_node_max}"
        )
        rows.append(
            "%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n"
            % (
                group.number,
                len(group.communicators),
                group.node_count,
                per_node,
                group.size,
                group.ranks_in_group,
                group.status.name,
                ERRORS_TEXT[int(group.errors)],
            )
        )
    return "".join(rows)
