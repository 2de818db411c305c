"""The ``Errors`` section of the text report (docs/protocol.md §3.2, the Errors rule; examples in §3.3).

Items, each ending with a blank line, in this order: processes that did not answer (INCOMPLETE), dead processes
(DEAD), then for every communicator in table order its missing ranks (INCOMPLETE) and its rank errors (ERROR).
"""

from __future__ import annotations

from .breakdown import error_groups, error_rank_count
from .model import CommErrors, Communicator, Report
from .outliers import is_outlier
from .text_lines import (
    missing_rank_location,
    plural_es,
    plural_s,
    present_rank_location,
    process_line,
    rank_line,
    unknown_processes_line,
)


def render_errors(report: Report, verbose: bool) -> str:
    """The body of the section (the caller prints the ``Errors`` header)."""
    out: list[str] = []
    out += _missing_processes(report, verbose)
    out += _dead_processes(report, verbose)
    for comm in report.communicators:
        if comm.errors & CommErrors.INCOMPLETE:
            out += _missing_ranks(comm, verbose)
        if comm.errors & CommErrors.ERROR:
            out += _rank_errors(comm, verbose)
    return "".join(out)


def _missing_processes(report: Report, verbose: bool) -> list[str]:
    count = len(report.missing_processes)
    if count == 0:
        return []
    out = [f"INCOMPLETE\n  Missing communicator data from {count} job process{plural_es(count)}\n"]
    if is_outlier(count, verbose):
        out += [process_line(p) for p in report.missing_processes]
    out.append("\n")
    return out


def _dead_processes(report: Report, verbose: bool) -> list[str]:
    count = report.dead_count
    if count == 0:
        return []
    verb = "es are" if count > 1 else " is"
    out = [f"DEAD\n  {count} job process{verb} considered dead (unreachable via the RAS network)\n"]
    if is_outlier(count, verbose):
        out += [process_line(p) for p in report.dead_processes]
        unknown = count - len(report.dead_processes)
        if unknown > 0:
            out.append(unknown_processes_line(unknown))
    out.append("\n")
    return out


def _missing_ranks(comm: Communicator, verbose: bool) -> list[str]:
    incomplete = comm.incomplete_ranks
    count = len(incomplete)
    out = [f"{comm.label} INCOMPLETE\n  Missing communicator data from {count} rank{plural_s(count)}\n"]
    if is_outlier(count, verbose):
        out += [rank_line(m.comm_rank, missing_rank_location(m)) for m in incomplete]
    out.append("\n")
    return out


def _rank_errors(comm: Communicator, verbose: bool) -> list[str]:
    out = [f"{comm.label} ERROR\n"]
    for asynchronous, title in ((False, "Initialization"), (True, "Asynchronous")):
        count = error_rank_count(comm, asynchronous)
        if count == 0:
            continue
        out.append(f"  {title} error{plural_s(count)} on {count} rank{plural_s(count)}\n")
        for group in error_groups(comm, asynchronous):
            if group.count > 1:
                out.append(f"  {group.count} ranks reported {group.name}\n")
            if is_outlier(group.count, verbose):
                verdict = None if group.count > 1 else f"reported {group.name}"
                out += [rank_line(r.comm_rank, present_rank_location(r), verdict) for r in group.ranks]
    out.append("\n")
    return out
