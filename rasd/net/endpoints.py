"""Which client port each torchras job on this host serves, so that two jobs never share one.

Every process that serves a client port registers it as an endpoint file in the run directory. The format (the
file's name and fields, where the directory is) is ``torchras_formats.endpoint_files``, the one module that both this
registry and ``rascli --list`` read it with; when a file is stale is ``rascli.processes.process_alive`` (psutil, which
the standard-library-only formats package does not import). This module adds what only the serving processes do:
choosing a port happens under a file lock, so two jobs that start at the same moment still end up on different ports.

A process removes its own file when its client port closes (``rasd.stop``, exit). A process that cannot (killed
with -9, ended by a signal it does not handle, or killed half way through writing its file) leaves it behind: the
registry removes such stale files whenever it is used (a process opens or closes its client port), so they never
pile up.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

from rascli.processes import process_alive
from torchras_formats.endpoint_files import TEMPORARY_FILES, Endpoint, run_dir, scan, write_endpoint

#: A half-written file (``*.tmp``) older than this belongs to a process that died while writing it.
TMP_STALE_S = 60.0


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
        now = time.time()
        with contextlib.suppress(OSError):
            for path in self.dir.glob(TEMPORARY_FILES):
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > TMP_STALE_S:
                        path.unlink()
        live, stale = scan(self.dir, process_alive)
        for path in stale:
            with contextlib.suppress(OSError):
                path.unlink()
        return live

    def clean(self) -> int:
        """Remove the stale files (under the lock); how many endpoints are left. Never raises."""
        try:
            with self.locked():
                return len(self.live())
        except OSError:
            return 0

    def register(self, host: str, port: int, job_id: str, explicit: bool = False) -> Path:
        return write_endpoint(self.dir, host, port, job_id, explicit)

    def unregister(self, path: Path) -> None:
        """Remove this process's file, and any stale ones beside it. Never raises."""
        with contextlib.suppress(OSError):
            path.unlink()
        self.clean()
