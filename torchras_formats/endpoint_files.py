"""The endpoint files: how a process that serves a client port records it, so that other torchras processes on the
host (choosing their port) and ``rascli --list`` find it. The one implementation of the format: rasd's registry
(``rasd.net.endpoints``: the lock, the port choice, removing stale files) writes and reads the files through this
module, and ``rascli --list`` (``rascli/listing.py``) reads them through it. Standard library only: whether a file's
process still runs (psutil) is the caller's ``alive``, ``rascli.processes.process_alive`` for both.

Every serving process writes ``<port>-<pid>.json`` into the run directory (``$TORCHRAS_RUN_DIR``, default
``/tmp/torchras-<uid>/endpoints``), first as ``<port>-<pid>.tmp`` and then renamed, so a reader never sees half a
file::

    {"host": "localhost", "port": 28028, "job_id": "3f2a...", "pid": 1234, "started": 1763722800.5,
     "hostname": "node7", "explicit": false}

``explicit``: the port is the process's own ``TORCHRAS_ADDR``, not its job's choice from the default; the other
processes of its job do not follow it there (absent in older files: false).

A job's id is a hash of its secret, so the processes of one job agree on it without talking, and it reveals nothing
about the secret. A file that is not an endpoint (not JSON, a field missing or of the wrong type) is skipped, never
judged. An endpoint is *stale* when its process no longer runs (``alive`` says no): killed with -9, a zombie, or its
pid now held by a newer process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RUN_DIR_ENV = "TORCHRAS_RUN_DIR"
#: The endpoint files, and the same files while they are being written.
FILES = "*-*.json"
TEMPORARY_FILES = "*-*.tmp"


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
    #: When the process registered, wall clock (``time.time()``).
    started: float
    hostname: str
    #: The process's own ``TORCHRAS_ADDR``, not the port its job chose from the default.
    explicit: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "job_id": self.job_id,
            "pid": self.pid,
            "started": self.started,
            "hostname": self.hostname,
            "explicit": self.explicit,
        }


def parse_endpoint(text: str) -> Endpoint:
    """The endpoint an endpoint file holds; ValueError when it holds none."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    missing = [name for name in ("host", "port", "job_id", "pid", "started") if name not in data]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    host, port, job_id, pid, started = data["host"], data["port"], data["job_id"], data["pid"], data["started"]
    hostname = data.get("hostname", "")
    explicit = data.get("explicit", False)
    if not (isinstance(host, str) and isinstance(job_id, str) and isinstance(hostname, str)):
        raise ValueError("host, job_id and hostname must be strings")
    if not isinstance(explicit, bool):
        raise ValueError("explicit must be true or false")
    if not (_integer(port) and 0 < port < 65536 and _integer(pid) and pid > 0):
        raise ValueError("port must be a port number and pid a positive integer")
    if not (isinstance(started, (int, float)) and not isinstance(started, bool) and math.isfinite(started)):
        raise ValueError("started must be a finite number")
    return Endpoint(host, port, job_id, pid, float(started), hostname, explicit)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def scan(directory: Path, alive: Callable[[int, float], bool]) -> tuple[list[Endpoint], list[Path]]:
    """The endpoints registered in ``directory`` whose process still runs (``alive(pid, started)``), in file-name
    order, and the files of the stale ones. A file that cannot be read or holds no endpoint is in neither list.
    Never raises."""
    try:
        paths = sorted(directory.glob(FILES))
    except OSError as err:
        log.debug("cannot list %s: %s", directory, err)
        return [], []
    live: list[Endpoint] = []
    stale: list[Path] = []
    for path in paths:
        try:
            endpoint = parse_endpoint(path.read_text())
        except (OSError, ValueError) as err:  # removed meanwhile, unreadable, or not an endpoint
            log.debug("ignoring %s: %s", path, err)
            continue
        if alive(endpoint.pid, endpoint.started):
            live.append(endpoint)
        else:
            log.debug("%s is stale: process %d is gone", path, endpoint.pid)
            stale.append(path)
    return live, stale


def read_endpoints(directory: Path, alive: Callable[[int, float], bool]) -> list[Endpoint]:
    """The endpoints registered in ``directory`` whose process still runs (the stale files are left as they are)."""
    return scan(directory, alive)[0]


def write_endpoint(directory: Path, host: str, port: int, job_id: str, explicit: bool = False) -> Path:
    """Register this process's client port: write its endpoint file (through a temporary file, so that no reader
    sees half of it) and return its path. Raises OSError when the directory cannot take it."""
    endpoint = Endpoint(host, port, job_id, os.getpid(), time.time(), socket.gethostname(), explicit)
    path = directory / f"{port}-{endpoint.pid}.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(endpoint.as_json()))
    os.replace(temporary, path)
    return path
