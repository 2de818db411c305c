"""Progress watchdog: proves, every ``interval``, that the main thread still executes Python bytecode.

Automatic stamps: a helper thread schedules ``sem_post`` on a private semaphore with ``Py_AddPendingCall``.
CPython runs pending calls only in the main thread, at its eval-loop checks, i.e. only while the main thread
executes bytecode. When the helper sees the semaphore count move, the main thread ran bytecode after the call was
scheduled, and ``Timestamp.auto`` becomes the time it was scheduled: the latest moment the main thread is proven
alive (never later than it really was). A main thread blocked in a C call (with or without the GIL) stops the
stamps; a ``while True`` livelock does not, which is what the manual stamp (``ping()``) is for.

Timing, as the reference's: one turn every ``interval`` (look, schedule, send the stamp), so automatic stamps are
at least ``interval`` apart; ``pause_and_synchronize`` stops the turns (no stamp is sent after it returns, but the
one of its ``reset``) until ``resume``; ``shutdown`` pauses, sends that one stamp, and stops the thread, and a
second ``shutdown`` does nothing.

The pending call is a C function on purpose: a Python callback would be a place where the restart exception,
raised asynchronously into the main thread, could be delivered and swallowed ("Exception ignored on calling
ctypes callback"). The semaphore is allocated with ``malloc`` and never freed (64 bytes per call of the wrapped
function), so a call still pending when the watchdog goes away can never touch freed memory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import threading
import time
from typing import Any

from . import busy, exception, logs  # noqa: F401 - names of the reference's module
from .param_utils import as_seconds

log = logs.get_logger(__name__)

_SEMAPHORE_BYTES = 64  # sizeof(sem_t) is 32 on x86_64/aarch64 glibc; room to spare
#: Automatic-stamp calls scheduled at once. One is enough to know the main thread ran (the reference keeps up to
#: 1024 in flight and counts them modulo this number).
MAX_PENDING = 1


class _Semaphore:
    """A POSIX semaphore in never-freed memory, and the address of ``sem_post`` to schedule on it."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        malloc = libc.malloc
        malloc.restype = ctypes.c_void_p
        malloc.argtypes = [ctypes.c_size_t]
        self.address = malloc(_SEMAPHORE_BYTES)
        if not self.address:
            raise MemoryError("cannot allocate the progress semaphore")
        ctypes.memset(self.address, 0, _SEMAPHORE_BYTES)
        if libc.sem_init(ctypes.c_void_p(self.address), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")
        self._getvalue = libc.sem_getvalue
        self._getvalue.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        self.post_function = ctypes.cast(libc.sem_post, ctypes.c_void_p)

    def value(self) -> int:
        value = ctypes.c_int(0)
        self._getvalue(ctypes.c_void_p(self.address), ctypes.byref(value))
        return value.value

    def schedule_post(self) -> bool:
        """Ask the main thread to run ``sem_post`` at its next bytecode boundary."""
        return ctypes.pythonapi.Py_AddPendingCall(self.post_function, ctypes.c_void_p(self.address)) == 0


@dataclasses.dataclass
class Timestamp:
    """Latest evidence of progress (``time.monotonic()``, a clock shared by all processes of a host).

    Ours beside the reference's two stamps: ``until``, the deadline of this process's evidence that it is busy,
    not hung (``inprocess.busy``: it works, or waits in a collective for a peer that works), with ``why`` and the
    ``busy_limit`` that bounds it; None while there is none. The monitor process postpones the soft and hard
    timeouts while ``until`` is ahead (``inprocess.monitor_process``)."""

    auto: float | None = None
    manual: float | None = None
    until: float | None = None
    why: str = ""
    busy_limit: float = 0.0


class ProgressWatchdog(threading.Thread):
    """Per call of the wrapped function: automatic stamps every ``interval``, manual ones on ``ping()``.

    ``monitor_process`` is anything with ``send_timestamp(Timestamp)``; ``interval`` a ``datetime.timedelta``
    (as in the reference) or seconds.
    """

    def __init__(self, rank: int | None, monitor_process: Any, interval: datetime.timedelta | float) -> None:
        super().__init__(name=f"ProgressWatchdog-{rank}", daemon=True)
        self.rank = rank
        self.monitor_process = monitor_process
        self.interval = as_seconds("interval", interval)
        self.timestamp = Timestamp(auto=time.monotonic())
        self._semaphore = _Semaphore()
        self._seen_value = 0
        self._pending = 0  # scheduled calls not seen run (at most MAX_PENDING)
        self._scheduled_at = 0.0  # when the pending call was scheduled
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._paused = threading.Event()
        self._turn = threading.RLock()  # held for one turn of the loop (observe + send)
        self._judged = float("-inf")  # when the busy evidence was last read (``inprocess.busy``)
        self._sent: Timestamp | None = None  # the stamps last sent

    def _observe(self) -> None:
        """Stamp if the main thread ran the pending call since the last look; keep one call pending."""
        value = self._semaphore.value()
        if value != self._seen_value:
            self._seen_value = value
            self._pending = 0
            with self._lock:  # proven alive when the call was scheduled; a later reset stands
                self.timestamp.auto = max(self.timestamp.auto or 0.0, self._scheduled_at)
        if self._pending < MAX_PENDING:
            scheduled_at = time.monotonic()
            if self._semaphore.schedule_post():
                self._pending += 1
                self._scheduled_at = scheduled_at

    def _judge(self) -> None:
        """Renew the busy evidence (at most every ``busy.EVERY``): it holds until two turns from now, with slack."""
        now = time.monotonic()
        if now - self._judged < busy.EVERY:
            return
        self._judged = now
        excuse = busy.current()
        with self._lock:
            if excuse is None:
                self.timestamp.until, self.timestamp.why = None, ""
            else:
                self.timestamp.until = now + 2 * max(self.interval, busy.EVERY) + busy.SLACK
                self.timestamp.why, self.timestamp.busy_limit = excuse.why, excuse.busy_limit

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            with self._turn:
                if self._paused.is_set() or self._stop_event.is_set():
                    continue
                try:
                    self._observe()
                    self._judge()
                    self.send(changed_only=True)
                except Exception:  # the watchdog must not die of a transient error
                    log.warning("progress watchdog error", exc_info=True)

    def send(self, changed_only: bool = False) -> None:
        """Send the stamps to the monitor process; a turn of the loop sends them only when they changed. A main
        thread blocked in a call changes nothing, and a watchdog of 1 ms that sent anyway would keep the monitor
        process busy, which the RAS node would count as this process's work (``inprocess.busy``)."""
        with self._lock:
            timestamp = dataclasses.replace(self.timestamp)
            if changed_only and timestamp == self._sent:
                return
            self._sent = timestamp
        self.monitor_process.send_timestamp(timestamp)

    def ping(self) -> None:
        with self._lock:
            self.timestamp.manual = time.monotonic()
        self.send()

    def reset(self) -> None:
        """Fresh start of an iteration: auto stamp now, no manual stamp until the first ``ping()``."""
        with self._lock:
            self.timestamp = Timestamp(auto=time.monotonic())
            self._judged = float("-inf")  # the busy evidence is read again at the next turn
        self.send()

    def pause(self) -> None:
        self._paused.set()

    def pause_and_synchronize(self) -> None:
        """Pause, wait for a turn of the loop under way to finish (no stamp is sent after this returns), reset."""
        self._paused.set()
        with self._turn:
            pass
        self.reset()

    def resume(self) -> None:
        if not self.is_alive():
            raise RuntimeError("the progress watchdog thread is not running")
        self._paused.clear()

    def shutdown(self, timeout: float | None = None) -> None:
        """Pause (one last stamp: ``pause_and_synchronize``'s reset), stop and join the thread. Does nothing once
        the thread has ended (a second shutdown sends no stamp); never raises (a thread still alive after
        ``timeout`` is logged: it is a daemon thread and sends nothing any more)."""
        if not self.is_alive() or self._stop_event.is_set():
            return
        self.pause_and_synchronize()
        self._stop_event.set()
        if threading.current_thread() is not self:
            self.join(timeout)
        if self.is_alive():
            log.warning("the progress watchdog of rank %s did not stop within %s s", self.rank, timeout)
