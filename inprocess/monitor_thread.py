"""The monitor thread: the trainer's listener for faults anywhere in the job, one per iteration.

It blocks on the iteration's ``iteration_end`` key over its own store connection (the server wakes it the
moment anyone records a fault). On a fault it waits ``last_call_wait`` for concurrent faults, freezes and reads
the interruption records, lets rasd's verdict journal write the cause (at most 0.2 s, only where one is kept), and
then, holding the *atomic lock* (so that ``CallWrapper.atomic()`` sections are never cut): calls ``abort`` to
unblock the main thread from collectives, and, if the main thread is still inside the wrapped function, raises
``RankShouldRestart`` in it asynchronously (``PyThreadState_SetAsyncExc``).

Hand-shake with the main thread: ``leave_function()`` (called by the main thread, under the same lock) marks the
main thread as out of the function and cancels an asynchronous exception that was raised but not yet delivered,
so the exception can never land in the wrapper's own bookkeeping. While the main thread does not acknowledge,
the exception is raised again every ``soft_timeout`` (it may have been swallowed by user code).

An asynchronous exception waits for the main thread's next bytecode; every time one is scheduled, the wake signal
(``inprocess.wake``) follows it, so that a main thread blocked in a C call (``time.sleep``, ``queue.Queue.get``,
a socket read, a lock, a subprocess wait) leaves the call at once instead of at the hard timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import attribution, exception, logs, wake  # noqa: F401 - names of the reference's module
from .attribution import format_interruption_records
from .utils import log_exc  # noqa: F401 - names of the reference's module

log = logs.get_logger(__name__)


class RankShouldRestart(BaseException):
    """Raised in the main thread to leave the wrapped function for a restart. Do not swallow BaseException."""

    message = "restart requested"

    def __str__(self) -> str:
        return self.args[0] if self.args else self.message


def _where(thread_id: int) -> str:
    """The stack of that thread, innermost call last: where a main thread that does not leave the function is
    (an asynchronous exception waits for the next Python bytecode; a call blocked in C++ never runs one)."""
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(no such thread)"


def _set_async_exc(thread_id: int, exc_type: type | None) -> int:
    """Schedule ``exc_type`` in the thread; ``None`` cancels a scheduled exception. Returns threads affected."""
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type is not None else ctypes.c_void_p(0)
    )


def async_raise(thread_id: int, exc_type: type, event: threading.Event | None = None) -> None:
    """Raise ``exc_type`` asynchronously in the thread ``thread_id`` (delivered at its next bytecode boundary).

    As in the reference: with ``event``, wait for it first; nothing happens while the interpreter shuts down; a
    thread id that matches no thread raises ``RuntimeError`` (and one matching several is undone, then raises).
    """
    if event is not None:
        event.wait()
    if sys.is_finalizing():
        return
    affected = _set_async_exc(thread_id, exc_type)
    if affected == 0:
        raise RuntimeError(f"async_raise: no thread with id {thread_id}")
    if affected > 1:
        _set_async_exc(thread_id, None)
        raise RuntimeError(f"async_raise: {affected} threads with id {thread_id}")


def restart_exception_type(message: str) -> type:
    """``SetAsyncExc`` takes a class, so the message travels as a class attribute of a fresh subclass."""
    return type("RankShouldRestart", (RankShouldRestart,), {"message": message, "__module__": __name__})


def async_abort_main_thread(msg: str | None = None) -> None:
    """Raise ``RankShouldRestart`` (carrying ``msg``) in the main thread, as the monitor thread does (with the wake
    signal, inside a wrapper call: a main thread blocked in a C call leaves it)."""
    main = threading.main_thread().ident
    assert main is not None, "the main thread has always started"
    async_raise(main, restart_exception_type(msg or RankShouldRestart.message))
    wake.wake(main)


def delayed_async_raise(thread_id: int, exc_type: type) -> None:
    """``async_raise`` from a short helper thread, started and released at once: the caller returns before the
    exception is scheduled (the reference's helper, for code that must not be interrupted by its own raise)."""
    released = threading.Event()
    raiser = threading.Thread(
        target=async_raise, args=(thread_id, exc_type, released), name="DelayedAsyncRaise", daemon=True
    )
    raiser.start()
    released.set()


def _raise_after(event: threading.Event, thread_id: int, exc_type: type) -> None:
    event.wait()
    time.sleep(2 * sys.getswitchinterval())  # let the hook return first
    async_raise(thread_id, exc_type)


class reraise_if_unraisable(contextlib.ContextDecorator):  # the reference's name
    """Context manager and decorator: an ``exc_type`` that ends up "unraisable" is raised again in the main thread.

    An asynchronous exception can be delivered inside a ``__del__``, a weakref callback or a ctypes callback, where
    Python only reports it through ``sys.unraisablehook``. Inside this context the hook raises it again into the
    main thread (from a short helper thread, so it is delivered at the main thread's next bytecode boundary); other
    unraisable exceptions go to the previous hook, which is restored on exit.
    """

    def __init__(self, exc_type: type) -> None:
        self.exc_type = exc_type
        self._previous: list[Any] = []

    def __enter__(self) -> reraise_if_unraisable:
        previous = sys.unraisablehook
        self._previous.append(previous)

        def hook(unraisable: Any) -> None:
            if isinstance(unraisable.exc_value, self.exc_type):
                hook_done = threading.Event()
                raiser = threading.Thread(
                    target=_raise_after,
                    args=(hook_done, threading.main_thread().ident, type(unraisable.exc_value)),
                    name="ReraiseUnraisable",
                    daemon=True,
                )
                raiser.start()
                hook_done.set()  # raised only once this hook has returned: never inside it (it would be lost)
            else:
                previous(unraisable)

        sys.unraisablehook = hook
        return self

    def __exit__(self, *exc_info: Any) -> None:
        sys.unraisablehook = self._previous.pop()


def _journal_before_restart(records: list[attribution.InterruptionRecord]) -> None:
    """The restart is about to act: rasd's verdict journal (``TORCHRAS_JOURNAL_DIR``) must hold what caused it
    first. Waits at most rasd's fixed budget (0.2 s), and for a verdict only when an external verdict interrupted
    the iteration; nothing when rasd is not loaded (the Wrapper never imports it for this) or keeps no journal."""
    rasd = sys.modules.get("rasd")
    sync = getattr(rasd, "sync_journal", None) if rasd is not None else None
    if sync is None:
        return
    try:
        sync(verdict=any(r.interruption is attribution.Interruption.EXTERNAL for r in records))
    except Exception:  # never into training
        log.debug("could not wait for the verdict journal", exc_info=True)


def _is_store_loss(error: BaseException) -> bool:
    """A lost connection to the store (torch's DistNetworkError family, etcd's EtcdUnavailable included)."""
    import torch.distributed

    return isinstance(error, torch.distributed.DistNetworkError)


class MonitorThread(threading.Thread):
    def __init__(
        self,
        *,
        state_fn: Callable[[], Any],
        store: Any,
        abort: Callable[[Any], Any] | None,
        last_call_wait: float,
        soft_timeout: float,
        atomic_lock: threading.RLock,
        main_thread_id: int,
        rank: int | None,
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
                _set_async_exc(self.main_thread_id, None)
        self._acknowledged.set()

    def notify_swallowed(self) -> None:
        """The restart exception ended up "unraisable" (delivered inside a __del__ or a callback): raise again."""
        self._swallowed.set()

    @property
    def raised_restart(self) -> bool:
        """Did this thread raise ``RankShouldRestart`` into the main thread? (False: the workload raised it.)"""
        return self._raised

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
            _journal_before_restart(records)
            log.info("restart: %s", self.message)
            self._terminate_main()
        except Exception as error:  # a broken store ends this thread
            if _is_store_loss(error) and not self.interrupted.is_set():
                self._store_lost(error)
            else:
                log.warning("monitor thread failed", exc_info=True)
        finally:
            self.aborted.set()
            self.finished.set()

    def _store_lost(self, error: Exception) -> None:
        """The store is gone (inprocess.store.StoreUnavailable): say so and make the main thread leave the call."""
        from .store import StoreUnavailable

        message = f"the wrapper's store is unreachable ({error}): no fault can be coordinated any more"
        log.error("%s: %s; this rank leaves the call", self.name, message)
        exc_type = type("StoreUnavailable", (StoreUnavailable,), {"message": message, "__module__": "inprocess.store"})
        with self.atomic_lock:
            if not self._main_out:
                self._raised = True  # so that leave_function cancels it if it was not delivered yet
                _set_async_exc(self.main_thread_id, exc_type)
                wake.wake(self.main_thread_id)

    def _terminate_main(self) -> None:
        exc_type = restart_exception_type(self.message)
        with self.atomic_lock:
            log.debug("aborting")
            self._call_abort()
            log.debug("aborted")
            if not self._main_out:
                self._raised = True
                _set_async_exc(self.main_thread_id, exc_type)
                wake.wake(self.main_thread_id)  # under the lock: the main thread is still in the function
        self.aborted.set()
        last_raise = time.monotonic()
        while not self._acknowledged.wait(0.05):
            if not self._swallowed.is_set() and time.monotonic() - last_raise < self.soft_timeout:
                continue
            with self.atomic_lock:
                if self._main_out:
                    break
                log.warning(
                    "the main thread did not leave the function; raising again. It is in:\n%s",
                    _where(self.main_thread_id),
                )
                self._swallowed.clear()
                _set_async_exc(self.main_thread_id, exc_type)
                wake.wake(self.main_thread_id)
                last_raise = time.monotonic()

    def _call_abort(self) -> None:
        if self.abort is None:
            return
        try:
            self.abort(self.state_fn())
        except Exception:  # documented: abort errors are logged and swallowed
            log.warning("abort failed", exc_info=True)

    def shutdown(self, timeout: float) -> bool:
        self._acknowledged.set()
        self.join(timeout)
        return not self.is_alive()
