"""Whether this process is working: the evidence that tells a rank busy in a long phase from a rank wedged idle.

A rank behind in a collective holds every other rank of the communicator. It may be *working* (rank 0 writing a
checkpoint with ``torch.save`` while the others wait in ``dist.barrier()``, an evaluation pass, a slow first step
compiling) or *idle* (blocked in a sleep, a lock, a read that moves no bytes: a wedge). Only the second is stuck
(issue 39; docs/architecture.md §4.2). The evidence is what the process consumes, measured where nothing can fake
it: the CPU time and the bytes read and written of its threads other than the RAS thread, and of its child
processes (data-loader workers, checkpoint writers), as cumulative counters the runtime reads from ``/proc``
(``rasd.net.work``), and the declared phase its code may name (``rasd.phase``).

Belongs here: the rule that turns successive samples into "last worked at" (``WorkMeter``), what a process sends
with a sweep (``comms.Work``: ages, so that clocks of different hosts never meet), and the thresholds. Reading the
counters is the runtime's; judging a communicator with them is ``stuck.py``'s.

The rule, for each window between two samples (half a keepalive interval apart, half a second by default, so that a
rank that stopped working is dated to within that):

    working in the window  <=>  CPU + run-queue wait >= WORK_CPU_SHARE of one core   (a training step: 100-200 %)
                                or bytes >= WORK_IO_RATE per second  (a checkpoint to disk: 100+ MB/s)
                                or its main thread's position moved  (Python code running, however slowly)
                                or it waits on the disk at the window's end   (a write held up by a busy disk)

The run-queue wait is the time the main thread was ready to run but waited for a core (the kernel's
``schedstat``): on a host starved of CPU (load at several times the cores, a CI machine running three test
workers), a rank computing in a loop gets a few percent of a core and would look idle by its CPU alone; the
time it wanted a core and did not get one is work too. A thread blocked in a sleep, a lock or a read never waits
on a run queue, so an idle wedge stays idle.

The disk wait is the main thread's (or a child process's) kernel state at the sample: ``D``, uninterruptible sleep,
is a thread inside a file-system call waiting for the device, as a ``torch.save`` is for seconds when the disk is
busy (measured beside a writer with ``fsync``: a save loop spent two thirds of its samples there, for up to a third
of a second at a time, and moved under 1 MiB/s). It uses no CPU and moves no bytes while it waits, so without this
a checkpoint on a busy disk looked like a wedge. A file system that never answers (a hung NFS mount) holds a thread
there too: such a rank is SLOW, not stuck, until the busy limit, as any working rank is. A sleep, a lock or a
socket read is an interruptible sleep (``S``) and stays idle.

The RAS thread's own CPU and bytes (its keepalives, gathers and reports) are left out, so an idle rank's node never
makes it look busy. A window where the counters could not be read says nothing: the meter keeps what it knew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .comms import Work
from .frames import Position

#: CPU time, as a share of one core over a window, that counts as working: a process waiting in a collective, a
#: sleep or a lock spends well under 1 % (its monitor threads wake once a second); any real work, far more.
WORK_CPU_SHARE = 0.10
#: Bytes read or written per second that count as working: a checkpoint writes megabytes a second at the least;
#: the Wrapper's store polls move a few hundred bytes a second.
WORK_IO_RATE = 1 << 20


@dataclass(frozen=True, slots=True)
class WorkSample:
    """Cumulative counters of this process (its threads but the RAS thread, and its children), read together."""

    cpu_s: float  # CPU seconds, user and system
    io_bytes: int  # bytes read and written through system calls (``rchar + wchar``)
    #: Seconds the main thread waited on a run queue, ready to run (``schedstat``; 0 where the kernel has none).
    runnable_s: float = 0.0
    #: The main thread or a child process was waiting on the disk when read (state ``D``).
    disk_wait: bool = False


@dataclass(frozen=True, slots=True)
class DeclaredPhase:
    """A phase the training code named (``rasd.phase``): its name, its limit in seconds (how long the phase may
    hold a communicator before COMM_STUCK), and when it started on this host's monotonic clock."""

    name: str
    limit: float
    started: float


class WorkMeter:
    """This process's "last worked at", from samples the runtime provides (``sample``: None where it cannot read)."""

    def __init__(
        self,
        sample: Callable[[], WorkSample | None],
        position: Callable[[], Position],
        phase: Callable[[], DeclaredPhase | None],
        interval: float,
    ) -> None:
        self._sample = sample
        self._position = position
        self._phase = phase
        self.interval = interval
        self._last: tuple[float, WorkSample, Position] | None = None
        self._tried = float("-inf")
        #: When this process was last seen working (None: never measured, or no sample could be read).
        self.worked_at: float | None = None

    def tick(self, now: float) -> None:
        if now - self._tried < self.interval:
            return
        self._tried = now
        last = self._last
        try:
            sample = self._sample()
        except Exception:  # noqa: BLE001 - evidence, never a reason to fail a tick
            sample = None
        if sample is None:
            return
        position = self._position()
        self._last = (now, sample, position)
        if last is None:
            self.worked_at = now  # the first sample: a process is taken as working until a window says otherwise
            return
        then, before, where = last
        if working(before, sample, now - then) or (position != where and bool(position)):
            self.worked_at = now

    def report(self, now: float) -> Work | None:
        """What a sweep carries of this process: how long since it last worked, and its declared phase."""
        try:
            phase = self._phase()
        except Exception:  # noqa: BLE001
            phase = None
        if self.worked_at is None and phase is None:
            return None
        idle = now - self.worked_at if self.worked_at is not None else 0.0
        if phase is None:
            return Work(idle_ms=_ms(idle))
        return Work(
            idle_ms=_ms(idle), phase=phase.name, phase_limit_ms=_ms(phase.limit), phase_ms=_ms(now - phase.started)
        )


def working(before: WorkSample, after: WorkSample, seconds: float) -> bool:
    """The rule above, for one window of ``seconds`` between two samples."""
    if seconds <= 0:
        return False
    if after.disk_wait:
        return True
    cpu = (after.cpu_s - before.cpu_s) + (after.runnable_s - before.runnable_s)
    io = after.io_bytes - before.io_bytes
    return cpu >= WORK_CPU_SHARE * seconds or io >= WORK_IO_RATE * seconds


def _ms(seconds: float) -> int:
    return min(max(int(seconds * 1000), 0), 0xFFFFFFFF)
