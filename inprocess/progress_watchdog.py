"""Progress watchdog: proves, every ``interval``, that the main thread still executes Python bytecode.

Automatic stamps: a helper thread schedules ``sem_post`` on a private semaphore with ``Py_AddPendingCall``.
CPython runs pending calls only in the main thread, at its eval-loop checks, i.e. only while the main thread
executes bytecode. When the helper sees the semaphore count move, the main thread was alive since the last
look, and ``Timestamp.auto`` becomes now. A main thread blocked in a C call (with or without the GIL) stops the
stamps; a ``while True`` livelock does not, which is what the manual stamp (``ping()``) is for.

The pending call is a C function on purpose: a Python callback would be a place where the restart exception,
raised asynchronously into the main thread, could be delivered and swallowed ("Exception ignored on calling
ctypes callback"). The semaphore is allocated with ``malloc`` and never freed (64 bytes per call of the wrapped
function), so a call still pending when the watchdog goes away can never touch freed memory.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import logging
import threading
import time
from typing import Any

from .param_utils import as_seconds

log = logging.getLogger(__name__)

_SEMAPHORE_BYTES = 64  # sizeof(sem_t) is 32 on x86_64/aarch64 glibc; room to spare


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
    """Latest evidence of progress (``time.monotonic()``, a clock shared by all processes of a host)."""

    auto: float | None = None
    manual: float | None = None


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
        self._pending = False
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._paused = threading.Event()
        self._turn = threading.Lock()  # held for one turn of the loop (observe + send)

    def _observe(self) -> None:
        """Stamp if the main thread ran the pending call since the last look; keep exactly one call pending."""
        value = self._semaphore.value()
        if value != self._seen_value:
            self._seen_value = value
            self._pending = False
            with self._lock:
                self.timestamp.auto = time.monotonic()
        if not self._pending:
            self._pending = self._semaphore.schedule_post()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            with self._turn:
                if self._paused.is_set():
                    continue
                try:
                    self._observe()
                    self.send()
                except Exception:  # the watchdog must not die of a transient error
                    log.warning("progress watchdog error", exc_info=True)

    def send(self) -> None:
        with self._lock:
            timestamp = dataclasses.replace(self.timestamp)
        self.monitor_process.send_timestamp(timestamp)

    def ping(self) -> None:
        with self._lock:
            self.timestamp.manual = time.monotonic()
        self.send()

    def reset(self) -> None:
        """Fresh start of an iteration: auto stamp now, no manual stamp until the first ``ping()``."""
        with self._lock:
            self.timestamp = Timestamp(auto=time.monotonic())
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
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout)
