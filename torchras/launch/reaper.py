"""Nothing of the job outlives it: the launcher adopts what its workers leave behind, and ends it.

Why. A worker is not alone: its ``inprocess.Wrapper`` starts a monitor process (a session of its own) and, on the
host of ``MASTER_ADDR``, a detached store server (double-forked, so that it outlives the worker that started it).
Neither is in the worker's process group, so ``killpg`` of a worker does not reach them; when the worker dies
they are orphans, and once the launcher has exited nobody is left to end them.

How. The launcher makes itself a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): every orphan among
its descendants is reparented to it, not to init. So "what the job left" is exactly "this process's children that
are not workers", which the launcher can list (``/proc``), reap (so none stays a zombie) and end (SIGTERM, then
SIGKILL after a grace) before a group restart and at the job's end. Without ``prctl`` (not Linux) nothing is
adopted and the functions here find nothing: the launcher works as before.

Only ``waitpid`` of a given pid is used, never ``waitpid(-1)``: the workers' own exit statuses belong to their
``Popen`` objects.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphans among this process's descendants become its children; False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def children(exclude: Iterable[int] = ()) -> list[int]:
    """This process's living children but ``exclude`` (the workers); a zombie among them is reaped on the way."""
    me, skip = os.getpid(), set(exclude)
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) != me:
            continue
        if fields[0] == "Z":
            _reap(int(name))
        else:
            found.append(int(name))
    return found


def _reap(pid: int) -> bool:
    """True once ``pid`` (a child) has ended and been reaped, or is not a child any more."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def end(pids: Iterable[int], grace: float, what: str = "left by the job") -> list[int]:
    """SIGTERM to each of ``pids`` (children), SIGKILL to those left after ``grace`` s; wait (bounded) until they
    are reaped. Returns the pids that were still there after the SIGKILL's wait (none, normally)."""
    pending = list(pids)
    if not pending:
        return []
    log.info("ending %s process(es) %s: %s", len(pending), what, ", ".join(map(str, pending)))
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pending:
            for each in (signum, signal.SIGCONT):
                try:
                    os.kill(pid, each)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + (grace if signum == signal.SIGTERM else 5.0)
        while pending and time.monotonic() < deadline:
            pending = [pid for pid in pending if not _reap(pid)]
            if pending:
                time.sleep(0.05)
        if not pending:
            return []
        if signum == signal.SIGTERM:
            log.warning("%s process(es) %s still running %.0f s after SIGTERM: SIGKILL", len(pending), what, grace)
    log.warning("process(es) %s did not end after SIGKILL: %s", what, ", ".join(map(str, pending)))
    return pending
