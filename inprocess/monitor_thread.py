"""The monitor thread: the trainer's listener for faults anywhere in the job, one per iteration.

It blocks on the iteration's ``iteration_end`` key over its own store connection (the server wakes it the
moment anyone records a fault). On a fault it waits ``last_call_wait`` for concurrent faults, freezes and reads
the interruption records, and then, holding the *atomic lock* (so that ``CallWrapper.atomic()`` sections are
never cut): calls ``abort`` to unblock the main thread from collectives, and, if the main thread is still inside
the wrapped function, raises ``RankShouldRestart`` in it asynchronously (``PyThreadState_SetAsyncExc``).

Hand-shake with the main thread: ``leave_function()`` (called by the main thread, under the same lock) marks the
main thread as out of the function and cancels an asynchronous exception that was raised but not yet delivered,
so the exception can never land in the wrapper's own bookkeeping. While the main thread does not acknowledge,
the exception is raised again every ``soft_timeout`` (it may have been swallowed by user code).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any, Callable, Optional

from .attribution import format_interruption_records

log = logging.getLogger(__name__)


class RankShouldRestart(BaseException):
    """Raised in the main thread to leave the wrapped function for a restart. Do not swallow BaseException."""

    message = "restart requested"

    def __str__(self) -> str:
        return self.args[0] if self.args else self.message


def async_raise(thread_id: int, exc_type: Optional[type]) -> int:
    """Schedule ``exc_type`` in the thread; ``None`` cancels a scheduled exception. Returns threads affected."""
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type is not None else ctypes.c_void_p(0)
    )


def restart_exception_type(message: str) -> type:
    """``SetAsyncExc`` takes a class, so the message travels as a class attribute of a fresh subclass."""
    return type("RankShouldRestart", (RankShouldRestart,), {"message": message, "__module__": __name__})


class MonitorThread(threading.Thread):
    def __init__(
        self,
        *,
        state_fn: Callable[[], Any],
        store: Any,
        abort: Optional[Callable[[Any], Any]],
        last_call_wait: float,
        soft_timeout: float,
        atomic_lock: threading.RLock,
        main_thread_id: int,
        rank: Optional[int],
    ) -> None:
        super().__init__(name=f"MonitorThread-{rank}", daemon=True)
        self.state_fn = state_fn
        self.store = store
        self.abort = abort
        self.last_call_wait = last_call_wait
        self.soft_timeout = soft_timeout
        self.atomic_lock = atomic_lock
        self.main_thread_id = main_thread_id
        self.interrupted = threading.Event()  # a fault was recorded in this iteration
        self.aborted = threading.Event()  # the abort ran (or was not needed)
        self.finished = threading.Event()
        self.message = ""
        self._main_out = False
        self._raised = False
        self._acknowledged = threading.Event()
        self._swallowed = threading.Event()

    # ---- main thread side -----------------------------------------------------------------------------------

    def leave_function(self) -> None:
        """Main thread: from now on never raise into me; cancel an exception raised but not yet delivered."""
        with self.atomic_lock:
            self._main_out = True
            if self._raised:
                async_raise(self.main_thread_id, None)
        self._acknowledged.set()

    def notify_swallowed(self) -> None:
        """The restart exception ended up "unraisable" (delivered inside a __del__ or a callback): raise again."""
        self._swallowed.set()

    def wait_aborted(self, timeout: float) -> bool:
        return self.aborted.wait(timeout)

    # ---- thread ---------------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self.store.wait_for_iteration_end(None)
            if self.store.iteration_outcome() != "interrupted":
                return  # every rank completed
            self.interrupted.set()
            log.debug("interruption seen")
            if self.last_call_wait > 0:
                time.sleep(self.last_call_wait)
            self.store.lock_interruption_records()
            records = self.store.get_interruption_records()
            self.message = format_interruption_records(records) or "an interruption without records"
            log.info("restart: %s", self.message)
            self._terminate_main()
        except Exception:  # noqa: BLE001 - a broken store ends this thread; the main thread notices
            log.warning("monitor thread failed", exc_info=True)
        finally:
            self.aborted.set()
            self.finished.set()

    def _terminate_main(self) -> None:
        exc_type = restart_exception_type(self.message)
        with self.atomic_lock:
            log.debug("aborting")
            self._call_abort()
            log.debug("aborted")
            if not self._main_out:
                self._raised = True
                async_raise(self.main_thread_id, exc_type)
        self.aborted.set()
        last_raise = time.monotonic()
        while not self._acknowledged.wait(0.05):
            if not self._swallowed.is_set() and time.monotonic() - last_raise < self.soft_timeout:
                continue
            with self.atomic_lock:
                if self._main_out:
                    break
                log.warning("the main thread did not leave the function; raising again")
                self._swallowed.clear()
                async_raise(self.main_thread_id, exc_type)
                last_raise = time.monotonic()

    def _call_abort(self) -> None:
        if self.abort is None:
            return
        try:
            self.abort(self.state_fn())
        except Exception:  # noqa: BLE001 - documented: abort errors are logged and swallowed
            log.warning("abort failed", exc_info=True)

    def shutdown(self, timeout: float) -> bool:
        self._acknowledged.set()
        self.join(timeout)
        return not self.is_alive()
