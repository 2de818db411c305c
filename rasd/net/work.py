"""This process's work counters and declared phase, read for the node's work meter (``rasd.core.work``).

The counters are the kernel's, read from ``/proc`` on the RAS thread twice a second (six small files; tens of
microseconds): the process's CPU time and bytes read and written (``/proc/self/stat``, ``/proc/self/io``), its main
thread's run-queue wait (``/proc/self/schedstat``: ready to run on a starved host, not idle) and whether it waits on
the disk now (its state in ``/proc/self/stat``: a checkpoint's write held up by a busy disk), less the
RAS thread's own (``/proc/self/task/<tid>/...``: its keepalives and gathers must not make an idle rank look busy),
plus its live child processes' in its own session (data-loader workers, asynchronous checkpoint writers; not the
Wrapper's monitor process, which starts a session of its own), found through the kernel's ``children`` lists.
Where ``/proc`` is not there (not Linux) or a file cannot be read, the sample is None and the node sends no work: a
rank behind is then judged idle, as before processes measured their work.

The phase is what the training thread declared with ``rasd.phase(...)`` (``rasd.api``): one slot per process,
written by the training thread and read here; a tuple assignment is atomic under the GIL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

from rasd.core.work import DeclaredPhase, WorkSample

log = logging.getLogger("rasd")

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: How deep the children are followed: a worker's own helpers, not a whole process tree.
_DEPTH = 3
_MAX_CHILDREN = 256


def _stat(stat_path: str) -> tuple[float, int, bool]:
    """utime + stime of a ``stat`` file, in seconds (fields 14 and 15), its session (field 6), and whether the task
    is in uninterruptible sleep (field 3 is ``D``: waiting on the disk, or on a network file system); the command
    name, in parentheses, may hold spaces."""
    with open(stat_path, "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[3]), fields[0] == b"D"


def _cpu_seconds(stat_path: str) -> float:
    return _stat(stat_path)[0]


def _runnable_seconds(schedstat_path: str) -> float:
    """The second field of a ``schedstat`` file: nanoseconds the task waited on a run queue, ready to run; 0 where
    the kernel keeps no scheduler statistics (``CONFIG_SCHED_INFO`` off)."""
    try:
        with open(schedstat_path, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _io_bytes(io_path: str) -> int:
    """rchar + wchar of an ``io`` file; 0 where it cannot be read (another user's process, a hardened kernel)."""
    try:
        with open(io_path, "rb") as f:
            total = 0
            for line in f:
                if line.startswith((b"rchar:", b"wchar:")):
                    total += int(line.split()[1])
            return total
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _descendants(pid: int) -> Iterator[int]:
    level = [pid]
    count = 0
    for _ in range(_DEPTH):
        level = [c for p in level for c in _children(p)]
        for c in level:
            count += 1
            if count > _MAX_CHILDREN:
                return
            yield c


class WorkCounters:
    """Reads a ``WorkSample`` of this process, less the calling thread (the RAS thread calls it)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self.available = os.path.exists(f"/proc/{self._pid}/stat")

    def __call__(self) -> WorkSample | None:
        if not self.available:
            return None
        pid, tid = self._pid, threading.get_native_id()
        try:
            # ``/proc/<pid>/stat``'s state is the thread group leader's: the main thread's.
            own, session, disk_wait = _stat(f"/proc/{pid}/stat")
            cpu = own - _cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
            io = _io_bytes(f"/proc/{pid}/io") - _io_bytes(f"/proc/{pid}/task/{tid}/io")
        except (OSError, ValueError, IndexError):
            return None
        for child in _descendants(pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                child_cpu, child_session, child_disk_wait = _stat(f"/proc/{child}/stat")
                if child_session != session:
                    continue  # a helper detached into a session of its own (the Wrapper's monitor process): not work
                cpu += child_cpu
                disk_wait = disk_wait or child_disk_wait
                io += _io_bytes(f"/proc/{child}/io")
        # The main thread's run-queue wait (``/proc/<pid>/schedstat`` is the thread group leader's: the main
        # thread's): the work a starved host kept it from doing (rasd/core/work.py).
        runnable = _runnable_seconds(f"/proc/{pid}/schedstat")
        return WorkSample(cpu_s=max(cpu, 0.0), io_bytes=max(io, 0), runnable_s=runnable, disk_wait=disk_wait)


#: The phase this process's code declared, or None (``rasd.phase``).
_declared: DeclaredPhase | None = None


def declared_phase() -> DeclaredPhase | None:
    return _declared


@contextlib.contextmanager
def phase(name: str, limit: float | None = None) -> Iterator[None]:
    """See ``rasd.phase``. Nested phases: the inner one holds while it runs, the outer one again after it."""
    global _declared
    outer = _declared
    try:
        seconds = float(limit) if limit is not None else 0.0
        if not seconds >= 0 or seconds == float("inf"):
            raise ValueError
    except (TypeError, ValueError):
        log.warning("rasd.phase(%r, limit=%r): the limit is not a number of seconds; using the busy limit", name, limit)
        seconds = 0.0
    _declared = DeclaredPhase(str(name)[:255], seconds, time.monotonic())
    try:
        yield
    finally:
        _declared = outer
