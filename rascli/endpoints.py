"""``--list``: the torchras jobs serving on this node, read from the endpoint files their processes register.

Every serving process writes ``<port>-<pid>.json`` into ``$TORCHRAS_RUN_DIR`` (default
``/tmp/torchras-<uid>/endpoints``)::

    {"host": "localhost", "port": 28028, "job_id": "3f2a...", "pid": 1234, "started": 1763722800.5,
     "hostname": "node7"}

Files of processes that no longer exist are ignored (a process killed with -9 cannot remove its own file), and
so is a file whose pid now belongs to a newer process. What is left is grouped by (port, job id): one row per job.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich import box
from rich.table import Table
from rich.text import Text

log = logging.getLogger(__name__)

RUN_DIR_ENV = "TORCHRAS_RUN_DIR"
#: How much later than its endpoint's start a process may have been created and still be the same process.
PID_REUSE_SLACK = 2.0


def run_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(RUN_DIR_ENV):
        return Path(environ[RUN_DIR_ENV])
    return Path(f"/tmp/torchras-{os.getuid()}") / "endpoints"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    job_id: str
    pid: int
    started: float
    hostname: str


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


def process_alive(pid: int, started: float) -> bool:
    """Whether ``pid`` still runs the process that registered the endpoint at ``started``. A zombie (exited, not
    yet reaped) does not: it serves nothing (the registry in rasd applies the same rule)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = process.create_time()
    except psutil.NoSuchProcess:
        return False
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return True
    except (psutil.Error, OSError, ValueError):
        return False
    return created <= started + PID_REUSE_SLACK


def _endpoint(data: object) -> Endpoint:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    port, pid, started = data["port"], data["pid"], data.get("started", 0.0)
    if not isinstance(port, int) or not isinstance(pid, int) or not isinstance(started, (int, float)):
        raise ValueError("port and pid must be integers, started a number")
    return Endpoint(
        str(data.get("host", "localhost")),
        port,
        str(data["job_id"]),
        pid,
        float(started),
        str(data.get("hostname", "")),
    )


def read_endpoints(directory: Path, alive: Callable[[int, float], bool] = process_alive) -> list[Endpoint]:
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError as err:
        log.debug("cannot list %s: %s", directory, err)
        return []
    endpoints = []
    for path in paths:
        try:
            endpoint = _endpoint(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.debug("ignoring %s: %s", path, err)
            continue
        if alive(endpoint.pid, endpoint.started):
            endpoints.append(endpoint)
        else:
            log.debug("ignoring %s: process %d is gone", path, endpoint.pid)
    return endpoints


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
