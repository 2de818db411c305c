"""``--list``: the torchras jobs serving on this node, read from the endpoint files their processes register
(``torchras_formats.endpoint_files``: the format; ``processes.py``: which files are stale).

Files of processes that no longer exist are ignored (a process killed with -9 cannot remove its own file), and so is
a file whose pid now belongs to a newer process. What is left is grouped by (port, job id): one row per job.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from rich import box
from rich.table import Table
from rich.text import Text

from torchras_formats.endpoint_files import Endpoint


@dataclass(frozen=True)
class Job:
    host: str
    port: int
    job_id: str
    pids: tuple[int, ...]
    started: float

    def as_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "job_id": self.job_id,
            "processes": len(self.pids),
            "pids": list(self.pids),
            "started": self.started,
        }


def group_jobs(endpoints: Iterable[Endpoint]) -> list[Job]:
    groups: dict[tuple[int, str], list[Endpoint]] = {}
    for endpoint in endpoints:
        groups.setdefault((endpoint.port, endpoint.job_id), []).append(endpoint)
    jobs = [
        Job(members[0].host, port, job_id, tuple(sorted(e.pid for e in members)), min(e.started for e in members))
        for (port, job_id), members in groups.items()
    ]
    return sorted(jobs, key=lambda job: (job.port, job.started))


def _started(when: float, now: float) -> str:
    age = max(0, int(now - when))
    ago = (
        f"{age // 86400}d {age % 86400 // 3600}h"
        if age >= 86400
        else f"{age // 3600}h {age % 3600 // 60}m"
        if age >= 3600
        else f"{age // 60}m {age % 60}s"
        if age >= 60
        else f"{age}s"
    )
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))} ({ago} ago)"


HEADER = ("PORT", "JOB ID", "PROCESSES", "STARTED")


def rows(jobs: list[Job], now: float) -> list[tuple[str, ...]]:
    return [(str(job.port), job.job_id, str(len(job.pids)), _started(job.started, now)) for job in jobs]


def plain_table(jobs: list[Job], now: float) -> str:
    lines = [HEADER, *rows(jobs, now)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER) - 1)]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "  " + line[-1] + "\n"
        for line in lines
    )


def rich_table(jobs: list[Job], now: float) -> Table:
    table = Table(
        box=box.SIMPLE_HEAD, title="torchras jobs serving on this node", title_justify="left", title_style="bold"
    )
    for name in HEADER:
        table.add_column(name, justify="right" if name in ("PORT", "PROCESSES") else "left")
    for row in rows(jobs, now):
        table.add_row(*(Text(cell) for cell in row))
    return table
