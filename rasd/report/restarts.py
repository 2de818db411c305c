"""The job's in-process restarts, from what each process contributed to the gather (docs/protocol.md 3.5).

Each process's node holds its own restart record (``rasd.record_restart``, called by inprocess.Wrapper after every
restart). Every rank of a job restarts together, so once a restart is over every process reports the same
iteration. The report takes::

    the job's iteration       the highest iteration any process reports
    its restart count         the most restarts any process has been through
    the last restart          the record of the first process (in process order) at that iteration
    processes behind          processes that report an older iteration: they did not (yet) take part in the
                              latest restart, e.g. a terminated process that is still alive

Processes that report no record (never restarted, or run without the Wrapper) are left out; when none reports
one, the report has no restart summary at all (and the text report no Restarts section).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rasd.core.comms import ProcessData, RestartRecord
from rasd.core.peers import Addr, PeerInfo

from .ordering import by_process


@dataclass(frozen=True)
class RestartSummary:
    iteration: int
    restarts: int
    last: RestartRecord
    #: How many processes reported a restart record (the total the outlier rule compares ``behind`` with).
    reporting: int
    #: Known processes at an older iteration, with that iteration, in (host, pid) order.
    behind: tuple[tuple[PeerInfo, int], ...]
    #: Processes at an older iteration, including any the peer table does not know.
    behind_count: int


def build_restart_summary(
    responses: Mapping[Addr, ProcessData], table: Mapping[Addr, PeerInfo], order: Callable[[Addr], tuple]
) -> RestartSummary | None:
    """The summary of a gather's restart records; None when no process reported one."""
    records = sorted(
        ((addr, data.restart) for addr, data in responses.items() if data.restart is not None),
        key=lambda item: order(item[0]),
    )
    if not records:
        return None
    iteration = max(record.iteration for _, record in records)
    last = next(record for _, record in records if record.iteration == iteration)
    older = [(addr, record.iteration) for addr, record in records if record.iteration < iteration]
    behind = by_process(((table[addr], it) for addr, it in older if addr in table), _peer)
    return RestartSummary(
        iteration=iteration,
        restarts=max(record.restarts for _, record in records),
        last=last,
        reporting=len(records),
        behind=tuple(behind),
        behind_count=len(older),
    )


def _peer(item: tuple[PeerInfo, int]) -> PeerInfo:
    return item[0]
