"""The wake signal: how a restart reaches a main thread blocked in a C call.

Everything about the signal lives here: which one (``TORCHRAS_WAKE_SIGNAL``), installing its handler when a
wrapper call starts, restoring the previous one when the last call ends, and sending it.

Why: the monitor thread leaves the wrapped function by raising ``RankShouldRestart`` in the main thread with
``PyThreadState_SetAsyncExc``. That only marks the exception pending: the interpreter raises it at the thread's
next bytecode. A main thread blocked in ``time.sleep``, ``queue.Queue.get``, a socket read, a lock or a
subprocess wait runs no bytecode until the call returns, perhaps never; without help only the hard timeout
(the monitor process kills the rank) ends it, and under torchrun the whole job goes with it.

How: right after scheduling the exception, under the atomic lock, the monitor thread sends this signal to the
main thread (``signal.pthread_kill``)::

    monitor thread                                main thread, blocked in time.sleep(300)
    SetAsyncExc(main, RankShouldRestart)
    pthread_kill(main, SIGURG)  ---------------->  nanosleep fails with EINTR (Python handlers: no SA_RESTART)
                                                   PEP 475: the call runs the Python signal handlers first
                                                   _handle(): the pending exception is raised at its first
                                                   bytecode, and propagates out of time.sleep

The handler itself raises nothing. Whether the call is left is decided, as before, by the asynchronous exception
alone, which ``MonitorThread.leave_function`` cancels under the atomic lock once the main thread is out of the
function: a wake that arrives when no exception is pending (none scheduled, one already delivered, or one
cancelled) runs an empty handler, and PEP 475 resumes the interrupted call where it was. So a stray wake can
never raise the restart exception outside the wrapped function. Measured on CPython 3.11 (and, for the
stdlib calls, the same on 3.10, 3.12 and 3.13): the wake leaves ``time.sleep``, ``queue.Queue.get`` (with and
without a timeout), ``multiprocessing.Queue.get`` (a DataLoader's main process waits there), ``socket.recv``
(blocking and with a timeout), ``threading.Lock.acquire``, ``Event.wait``, ``Thread.join``, ``select.select``,
``subprocess.Popen.wait`` and ``os.waitpid`` at once, the exception raised on the handler's entry; a wake with
nothing pending leaves each of them running to its normal end.

What it cannot reach: a thread that holds the GIL in C (a long C loop; the monitor thread cannot even run, so
only the hard timeout ends it), and C code that retries on EINTR without running Python's handlers (torch's C++
collectives and stores: the abort unblocks those).

Which signal: SIGURG by default, whose default action is "ignore", so a wake that arrives when no handler of
ours is installed (before the first call, after the last) does nothing; the Go runtime preempts goroutines with
it for the same reason. ``TORCHRAS_WAKE_SIGNAL`` names another (``SIGUSR2``, ``USR2`` or a number), or turns the
wake off (``0``, ``none``). A handler the user installed on that signal before the call keeps working: the
signals that are not wakes are passed on to it (a signal of the user's that arrives within a second of a wake is
taken for the wake). SIGTERM, SIGINT and every other signal are never touched.

Nothing here raises into training: a failure of the mechanism is logged once and the rank falls back on the
hard timeout.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from . import logs

log = logs.get_logger(__name__)

ENVIRONMENT = "TORCHRAS_WAKE_SIGNAL"
DEFAULT = signal.SIGURG
_OFF = ("0", "none", "off")
#: A signal that arrives this soon after a wake is the wake (signals of one kind do not queue: two coalesce).
_WAKE_WINDOW = 1.0


class _State:
    """The one piece of module-level state: the handler is a property of the process, not of a wrapper call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0  # wrapper calls that hold the handler
        self.signum: int | None = None  # the installed signal, None while no handler of ours is installed
        self.previous: Any = None  # the handler we replaced: restored by the last release, called for the rest
        self.sent_at = float("-inf")  # monotonic time of the last wake
        self.logged: set[str] = set()


_STATE = _State()


def _log_once(key: str, level: int, message: str, *args: object, exc_info: bool = False) -> None:
    """Log ``message`` the first time ``key`` comes up in this process (each kind of failure says so once)."""
    if key in _STATE.logged:
        return
    _STATE.logged.add(key)
    log.log(level, message, *args, exc_info=exc_info)


def _name(signum: int) -> str:
    """``SIGURG``; a real-time signal, which has no name of its own, by its number."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def configured_signal() -> int | None:
    """The wake signal from ``TORCHRAS_WAKE_SIGNAL``: SIGURG when unset; None when ``0``/``none``/``off``.

    A name (``SIGUSR2``, ``usr2``) or a number (a real-time signal too). A value that names no signal this
    system has, or one that cannot carry a handler (SIGKILL, SIGSTOP), is logged once and SIGURG is used.
    """
    value = os.environ.get(ENVIRONMENT, "").strip()
    if not value:
        return DEFAULT
    if value.lower() in _OFF:
        return None
    name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
    try:
        signum = int(value) if value.isdigit() else int(signal.Signals[name])
    except KeyError:
        signum = -1
    if signum not in signal.valid_signals() or signum in (signal.SIGKILL, signal.SIGSTOP):
        _log_once(
            f"bad:{value}",
            logging.WARNING,
            "%s=%r names no signal that can wake a blocked rank; using %s (a name such as SIGUSR2, a number, "
            "or 0/none to turn the wake off)",
            ENVIRONMENT,
            value,
            DEFAULT.name,
        )
        return DEFAULT
    return signum


def install() -> bool:
    """A wrapper call starts: make sure our handler is on the wake signal. True: give it back with ``release``.

    Only the main thread may install a signal handler (and only the main thread runs them); from another thread
    this does nothing (logged once at debug level). A handler installed outside Python (``getsignal`` returns
    None) can be neither called nor restored: it is left alone, and blocked ranks wait for the hard timeout.
    """
    try:
        if threading.current_thread() is not threading.main_thread():
            _log_once("thread", logging.DEBUG, "the wrapper runs outside the main thread: no wake signal")
            return False
        with _STATE.lock:
            if _STATE.depth > 0:
                _STATE.depth += 1
                return True
            signum = configured_signal()
            if signum is None:
                _log_once("off", logging.INFO, "%s turns the wake signal off", ENVIRONMENT)
                return False
            previous = signal.getsignal(signum)
            if previous is None:
                _log_once(
                    f"foreign:{signum}",
                    logging.INFO,
                    "%s has a handler installed outside Python: no wake signal (set %s to another signal)",
                    _name(signum),
                    ENVIRONMENT,
                )
                return False
            signal.signal(signum, _handle)
            _STATE.previous = signal.SIG_DFL if previous is _handle else previous
            _STATE.signum = signum
            _STATE.depth = 1
            log.debug("wake signal %s installed", _name(signum))
            return True
    except Exception:  # noqa: BLE001 - nothing of torchras raises into training: the hard timeout remains
        _log_once("install", logging.WARNING, "could not install the wake signal", exc_info=True)
        return False


def release() -> None:
    """A wrapper call that ``install`` returned True for ends; the last one restores the previous handler.

    A handler that the user put on the signal during the call is theirs: it stays.
    """
    try:
        with _STATE.lock:
            if _STATE.depth == 0:
                return
            _STATE.depth -= 1
            if _STATE.depth > 0:
                return
            signum, previous = _STATE.signum, _STATE.previous
            _STATE.signum, _STATE.previous = None, None
            if signum is None:
                return
            if signal.getsignal(signum) is not _handle:
                log.debug("the handler of %s was replaced during the call: left as it is", _name(signum))
                return
            signal.signal(signum, previous)
            log.debug("wake signal %s restored", _name(signum))
    except Exception:  # noqa: BLE001 - nothing of torchras raises into training
        _log_once("release", logging.WARNING, "could not restore the handler of the wake signal", exc_info=True)


def wake(thread_id: int) -> None:
    """Interrupt the blocking system call of ``thread_id`` (the main thread) so that it runs Python again.

    Call it right after scheduling an asynchronous exception in that thread; it only ever makes a pending
    exception arrive sooner. Any thread may call it; it never raises.
    """
    try:
        signum = _STATE.signum
        if signum is None or sys.is_finalizing():
            return
        if thread_id != threading.main_thread().ident:
            _log_once(
                "target", logging.DEBUG, "no wake signal for thread %s: handlers run in the main thread", thread_id
            )
            return
        if signal.getsignal(signum) is not _handle:
            _log_once(
                f"replaced:{signum}",
                logging.WARNING,
                "the handler of %s (the wake signal) was replaced: a rank blocked in a C call waits for the hard "
                "timeout (set %s to a signal the application does not use)",
                _name(signum),
                ENVIRONMENT,
            )
            return
        _STATE.sent_at = time.monotonic()
        signal.pthread_kill(thread_id, signum)
    except Exception:  # noqa: BLE001 - nothing of torchras raises into training: the hard timeout remains
        _log_once("send", logging.WARNING, "could not send the wake signal", exc_info=True)


def _handle(signum: int, frame: FrameType | None) -> None:
    """The handler of the wake signal. A pending restart exception is raised on entry, before the first line
    (CPython checks for asynchronous exceptions when a Python function starts, and at the latest at a call).

    Reached here, nothing was pending: a wake is done (the interrupted call resumes); any other signal goes to the
    handler the user had installed.
    """
    if time.monotonic() - _STATE.sent_at < _WAKE_WINDOW:
        _STATE.sent_at = float("-inf")
        return
    previous = _STATE.previous
    if callable(previous):
        previous(signum, frame)
