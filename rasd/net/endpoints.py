"""Which client port each torchras job on this host serves, so that two jobs never share one.

Every process that serves a client port writes ``<port>-<pid>.json`` into the run directory
(``$TORCHRAS_RUN_DIR``, default ``/tmp/torchras-<uid>/endpoints``)::

    {"host": "localhost", "port": 28028, "job_id": "3f9a...", "pid": 1234, "started": 1763722000.5,
     "hostname": "node17"}

``rascli --list`` reads the same files. A job's id is a hash of its secret, so the processes of one job agree on
it without talking, and it reveals nothing about the secret. Choosing a port happens under a file lock, so two
jobs that start at the same moment still end up on different ports.

A process removes its own file when its client port closes (``rasd.stop``, exit). A process that cannot (killed
with -9, ended by a signal it does not handle, or killed half way through writing its file) leaves it behind: the
registry removes such stale files whenever it is used (a process opens or closes its client port), so they never
pile up. A file is stale when its process is gone, is a zombie, or is a newer process that reuses the pid (created
after the file's ``started``); rascli --list applies the same rule (rascli/endpoints.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

#: How much later than its endpoint's start a process may have been created and still be the same process.
PID_REUSE_SLACK = 2.0
#: A half-written file (``*.tmp``) older than this belongs to a process that died while writing it.
TMP_STALE_S = 60.0


def run_dir() -> Path:
    explicit = os.environ.get("TORCHRAS_RUN_DIR")
    return Path(explicit) if explicit else Path(f"/tmp/torchras-{os.getuid()}") / "endpoints"


def registered_process_alive(pid: int, started: float) -> bool:
    """Whether ``pid`` still runs the process that registered an endpoint at ``started`` (wall clock). A zombie
    (exited, not yet reaped) does not; a process we may not inspect is taken to."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.create_time() <= started + PID_REUSE_SLACK
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


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
        """Registered endpoints whose process is still running; stale files are removed on the way."""
        out: list[Endpoint] = []
        if not self.dir.is_dir():
            return out
        now = time.time()
        for path in self.dir.glob("*-*.tmp"):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > TMP_STALE_S:
                    path.unlink()
        for path in self.dir.glob("*-*.json"):
            try:
                rec = json.loads(path.read_text())
                ep = Endpoint(
                    str(rec["host"]),
                    int(rec["port"]),
                    str(rec["job_id"]),
                    int(rec["pid"]),
                    float(rec["started"]),
                    str(rec.get("hostname", "")),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # removed meanwhile, or not an endpoint file: not ours to delete
            if registered_process_alive(ep.pid, ep.started):
                out.append(ep)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        return out

    def clean(self) -> int:
        """Remove the stale files (under the lock); how many endpoints are left. Never raises."""
        try:
            with self.locked():
                return len(self.live())
        except OSError:
            return 0

    def register(self, host: str, port: int, job_id: str) -> Path:
        path = self.dir / f"{port}-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "host": host,
                    "port": port,
                    "job_id": job_id,
                    "pid": os.getpid(),
                    "started": time.time(),
                    "hostname": socket.gethostname(),
                }
            )
        )
        os.replace(tmp, path)
        return path

    def unregister(self, path: Path) -> None:
        """Remove this process's file, and any stale ones beside it. Never raises."""
        with contextlib.suppress(OSError):
            path.unlink()
        self.clean()
