"""The status report: a pure function of what a gather collected (``rasd.core.snapshot.JobSnapshot``).

    build_report(snapshot)              -> Report               (model.py: merge, classify, sort, group)
    build_job_summary(peers, left)      -> JobSummary           (summary.py)
    build_restart_summary(...)          -> RestartSummary       (restarts.py: the job's in-process restarts)
    render_head(summary, ...)           -> str                  (text.py: versions, job summary, "Communicators...")
    render_tail(report, ...)            -> str                  (text.py: time, table, Restarts, Errors, Warnings)
    render_text(report, ...)            -> str                  (head + tail)
    render_json(report, ...)            -> str                  (json_format.py)
    format_event_text / format_event_json                       (events.py: MONITOR mode)
    is_outlier(count, verbose, total)   -> bool                 (outliers.py: who gets detail lines)

Nothing here does I/O or reads a clock: times and versions are passed in.
"""

from .events import format_event_json, format_event_text
from .json_format import render_json
from .model import (
    ERRORS_TEXT,
    CommErrors,
    CommGroup,
    Communicator,
    MissingRank,
    MissingReason,
    PresentRank,
    Report,
    Status,
    build_report,
)
from .outliers import is_outlier
from .summary import JobSummary, SummaryLayout, build_job_summary
from .text import render_head, render_tail, render_text
from .timestamps import format_timestamp

__all__ = [
    "ERRORS_TEXT",
    "CommErrors",
    "CommGroup",
    "Communicator",
    "JobSummary",
    "MissingRank",
    "MissingReason",
    "PresentRank",
    "Report",
    "Status",
    "SummaryLayout",
    "build_job_summary",
    "build_report",
    "format_event_json",
    "format_event_text",
    "format_timestamp",
    "is_outlier",
    "render_head",
    "render_json",
    "render_tail",
    "render_text",
]
