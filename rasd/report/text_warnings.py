"""The ``Warnings`` section of the text report (docs/protocol.md §3.2: NCCL's items plus our LEFT, WAITING, STUCK).

Items, each ending with a blank line: TIMEOUT (legs of the gather that went quiet), LEFT (processes that finished
and left the job cleanly: not a fault, but the job is smaller than it was), WAITING (processes that joined the
running job and wait to be admitted at its next rendezvous round), then for every communicator in table
order its STUCK item (a standing COMM_STUCK verdict: ours) or SLOW item (ranks behind that work: ours), then its
MISMATCH item: a status part (ranks disagree on their status) and, per op type, a count part (ranks launched
different numbers of operations).
"""

from __future__ import annotations

from rasd.core.comms import OP_TYPES

from .breakdown import launch_count_groups, status_groups
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


def render_warnings(report: Report, verbose: bool) -> str:
    """The body of the section (the caller prints the ``Warnings`` header)."""
    out: list[str] = []
    if report.timeouts > 0:
        out.append(
            f"TIMEOUT\n  Encountered {report.timeouts} communication timeout{plural_s(report.timeouts)} "
            "while gathering communicator data\n\n"
        )
    out += _left_processes(report, verbose)
    out += _waiting_processes(report)
    for comm in report.communicators:
        verdict = report.stuck.get(comm.comm_hash)
        if verdict is not None:
            # torchras: a COMM_STUCK verdict, with who is behind and who is inside the stuck operation; SLOW where
            # the ranks behind are working or in a declared phase (no restart; rasd/core/stuck.py).
            out.append(f"{comm.label} {'SLOW' if verdict.slow else 'STUCK'}\n  {verdict.describe()}\n\n")
    for comm in report.communicators:
        if comm.errors & CommErrors.MISMATCH:
            out += _mismatch(comm, verbose)
    return "".join(out)


def _left_processes(report: Report, verbose: bool) -> list[str]:
    count = report.left_count
    if count == 0:
        return []
    out = [f"LEFT\n  {count} job process{plural_es(count)} left the job cleanly\n"]
    if is_outlier(count, verbose):
        out += [process_line(p) for p in report.left_processes]
        unknown = count - len(report.left_processes)
        if unknown > 0:
            out.append(unknown_processes_line(unknown))
    out.append("\n")
    return out


def _waiting_processes(report: Report) -> list[str]:
    """torchras: processes that joined the running job and wait for its next rendezvous round (always listed:
    there are few, and an operator starting replacements wants to see each one arrive)."""
    count = len(report.waiting_processes)
    if count == 0:
        return []
    verb = "waits" if count == 1 else "wait"
    out = [
        f"WAITING\n  {count} job process{plural_es(count)} joined the job and {verb} to be admitted at its next round\n"
    ]
    out += [process_line(p) for p in report.waiting_processes]
    out.append("\n")
    return out


def _mismatch(comm: Communicator, verbose: bool) -> list[str]:
    out = [f"{comm.label} MISMATCH\n"]
    if comm.status_mismatch:
        out += _status_part(comm, verbose)
        if not comm.mismatched_ops:
            # NCCL ends the status part without a blank line, gluing the next item to it; every item here ends
            # with one.
            out.append("\n")
    for op in comm.mismatched_ops:
        out += _count_part(comm, op, verbose)
    return out


def _status_part(comm: Communicator, verbose: bool) -> list[str]:
    out = ["  Communicator ranks have different status\n"]
    for group in status_groups(comm):
        name = group.status.name
        if group.count > 1:
            out.append(f"  {group.count} ranks have status {name}\n")
        if is_outlier(group.count, verbose, comm.size):
            verdict = None if group.count > 1 else f"has status {name}"
            out += [rank_line(r.comm_rank, present_rank_location(r), verdict) for r in group.ranks]
            out += [rank_line(m.comm_rank, missing_rank_location(m), verdict) for m in group.nocomm]
    return out


def _count_part(comm: Communicator, op: int, verbose: bool) -> list[str]:
    out = [f"  Communicator ranks have different {OP_TYPES[op]} operation counts\n"]
    for group in launch_count_groups(comm, op):
        launched = f"launched up to operation {group.value}" if group.value > 0 else "not launched any operations"
        if group.count > 1:
            out.append(f"  {group.count} ranks have {launched}\n")
        if is_outlier(group.count, verbose, comm.size):
            verdict = None if group.count > 1 else f"has {launched}"
            out += [rank_line(r.comm_rank, present_rank_location(r), verdict) for r in group.ranks]
    out.append("\n")
    return out
