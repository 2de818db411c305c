"""Which client port each torchras job on this host serves, so that two jobs never share one.

Every process that serves a client port writes ``<port>-<pid>.json`` into the run directory
(``$TORCHRAS_RUN_DIR``, default ``/tmp/torchras-<uid>/endpoints``)::

    {"host": "localhost", "port": 28028, "job_id": "3f9a...", "pid": 1234, "started": 1763722000.5,
     "hostname": "node17"}

``rascli --list`` reads the same files. A job's id is a hash of its secret, so the processes of one job agree on
it without talking, and it reveals nothing about the secret. Choosing a port happens under a file lock, so two
jobs that start at the same moment still end up on different ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .runtime import pid_running


def run_dir() -> Path:
    explicit = os.environ.get("TORCHRAS_RUN_DIR")
    return Path(explicit) if explicit else Path(f"/tmp/torchras-{os.getuid()}") / "endpoints"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    job_id: str
    pid: int
    started: float
    hostname: str


class EndpointRegistry:
    def __init__(self, directory: Path | None = None) -> None:
        self.dir = directory or run_dir()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def live(self) -> list[Endpoint]:
        """Registered endpoints whose process is still running (stale files are removed)."""
        out = []
        if not self.dir.is_dir():
            return out
        for path in self.dir.glob("*-*.json"):
            try:
                rec = json.loads(path.read_text())
                ep = Endpoint(str(rec["host"]), int(rec["port"]), str(rec["job_id"]), int(rec["pid"]),
                              float(rec["started"]), str(rec.get("hostname", "")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if pid_running(ep.pid):
                out.append(ep)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return out

    def register(self, host: str, port: int, job_id: str) -> Path:
        path = self.dir / f"{port}-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"host": host, "port": port, "job_id": job_id, "pid": os.getpid(),
                                   "started": time.time(), "hostname": socket.gethostname()}))
        os.replace(tmp, path)
        return path

    @staticmethod
    def unregister(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
