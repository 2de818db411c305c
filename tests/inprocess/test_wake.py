"""The wake signal (``inprocess.wake``): a restart reaches a main thread blocked in a C call, and nothing else.

Each test runs in pytest's main thread, which plays the trainer's main thread: a real ``MonitorThread`` (on a
store that reports one interruption when told to) raises ``RankShouldRestart`` into it and sends the wake while it
sits in one blocking call. Every blocking call is bounded by a fail-safe that ends it normally after
``FAIL_SAFE`` seconds, so a broken wake fails the test (the call returns instead of raising) rather than hanging
it. Nothing here asserts speed: left before the fail-safe is the criterion.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from inprocess import wake
from inprocess.monitor_thread import MonitorThread, RankShouldRestart, _set_async_exc
from polling import wait_until

FAIL_SAFE = 30.0  # seconds after which a blocking call ends by itself (the wake never needs more than a moment)
MAIN = threading.main_thread()


class OneInterruption:
    """The monitor thread's store: the iteration ends "interrupted" once ``interrupt()`` is called."""

    def __init__(self) -> None:
        self.ended = threading.Event()

    def interrupt(self) -> None:
        self.ended.set()

    def wait_for_iteration_end(self, timeout: float | None) -> None:
        self.ended.wait(timeout)

    def iteration_outcome(self) -> str:
        return "interrupted"

    def lock_interruption_records(self) -> None:
        pass

    def get_interruption_records(self) -> list:
        return []


def monitor_thread(store: OneInterruption, soft_timeout: float = 60.0) -> MonitorThread:
    assert MAIN.ident is not None
    monitor = MonitorThread(
        state_fn=lambda: None,
        store=store,
        abort=None,
        last_call_wait=0,
        soft_timeout=soft_timeout,
        atomic_lock=threading.RLock(),
        main_thread_id=MAIN.ident,
        rank=0,
    )
    monitor.start()
    return monitor


@pytest.fixture
def fresh(monkeypatch) -> Iterator[None]:
    """The default wake signal, no handler of ours installed before or after, every "log once" fresh."""
    monkeypatch.delenv(wake.ENVIRONMENT, raising=False)
    monkeypatch.setattr(wake._STATE, "logged", set())
    before = signal.getsignal(signal.SIGURG)
    assert wake._STATE.depth == 0
    yield
    while wake._STATE.depth:
        wake.release()
    signal.signal(signal.SIGURG, before)


@pytest.fixture
def installed(fresh) -> Iterator[None]:
    assert wake.install()
    yield
    wake.release()


# ---- the blocking calls, each ended normally by its fail-safe ------------------------------------------------------


def fail_safe(function: Callable[..., object], *args: object) -> threading.Timer:
    """Call ``function(*args)`` in ``FAIL_SAFE`` seconds (a daemon timer: never keeps pytest from exiting)."""
    timer = threading.Timer(FAIL_SAFE, function, args)
    timer.daemon = True
    timer.start()
    return timer


def _sleep() -> None:
    time.sleep(FAIL_SAFE)


def _queue_get() -> None:
    items: queue.Queue[int] = queue.Queue()
    timer = fail_safe(items.put, 1)
    try:
        items.get()
    finally:
        timer.cancel()


def _socket_recv() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        timer = fail_safe(theirs.send, b"x")
        try:
            ours.recv(1)
        finally:
            timer.cancel()


def _lock_acquire() -> None:
    lock = threading.Lock()
    lock.acquire()
    timer = fail_safe(lock.release)
    try:
        lock.acquire()
    finally:
        timer.cancel()


def _event_wait() -> None:
    event = threading.Event()
    timer = fail_safe(event.set)
    try:
        event.wait()
    finally:
        timer.cancel()


def _select() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        select.select([ours], [], [], FAIL_SAFE)


def _subprocess_wait() -> None:
    child = subprocess.Popen(["sleep", str(int(FAIL_SAFE))])
    try:
        child.wait()
    finally:
        child.kill()
        child.wait()


def _os_waitpid() -> None:
    child = subprocess.Popen(["sleep", str(int(FAIL_SAFE))])
    try:
        os.waitpid(child.pid, 0)
    finally:
        child.kill()
        child.wait()


BLOCKING_CALLS: dict[str, Callable[[], None]] = {
    "time.sleep": _sleep,
    "queue.Queue.get": _queue_get,
    "socket.recv": _socket_recv,
    "threading.Lock.acquire": _lock_acquire,
    "threading.Event.wait": _event_wait,
    "select.select": _select,
    "subprocess.Popen.wait": _subprocess_wait,
    "os.waitpid": _os_waitpid,
}


def restart_while_blocked(block: Callable[[], None], soft_timeout: float = 60.0) -> float:
    """Block in ``block`` while a monitor thread raises the restart 0.3 s in; the seconds until it arrived."""
    store = OneInterruption()
    monitor = monitor_thread(store, soft_timeout)
    trigger = threading.Timer(0.3, store.interrupt)
    trigger.daemon = True
    trigger.start()
    started = time.monotonic()
    try:
        with pytest.raises(RankShouldRestart):
            block()
        return time.monotonic() - started
    finally:
        monitor.leave_function()
        assert monitor.shutdown(10)


@pytest.mark.parametrize("call", list(BLOCKING_CALLS))
def test_a_restart_reaches_a_main_thread_blocked_in_a_c_call(installed, call):
    assert restart_while_blocked(BLOCKING_CALLS[call]) < FAIL_SAFE


def test_another_wake_signal_by_name_works_as_well(fresh, monkeypatch):
    monkeypatch.setenv(wake.ENVIRONMENT, "usr2")
    previous = signal.getsignal(signal.SIGUSR2)
    assert wake.install()
    try:
        assert signal.getsignal(signal.SIGURG) is not wake._handle
        assert restart_while_blocked(_sleep) < FAIL_SAFE
    finally:
        wake.release()
    assert signal.getsignal(signal.SIGUSR2) is previous


def test_without_the_wake_a_blocked_call_runs_to_its_end_first(fresh, monkeypatch):
    """The control: with the wake off the exception waits for the call to return (here a 1.5 s sleep)."""
    monkeypatch.setenv(wake.ENVIRONMENT, "none")
    assert not wake.install()
    assert signal.getsignal(signal.SIGURG) is not wake._handle

    def sleep_then_run_bytecode() -> None:
        time.sleep(1.5)
        for _ in range(10**8):  # bytecode: where the pending exception is delivered at the latest
            pass

    # Raised 0.3 s in, but arrived only once the sleep was over.
    assert restart_while_blocked(sleep_then_run_bytecode) >= 1.5


def test_the_wake_is_sent_again_with_every_raise(installed):
    """A blocked call that swallows the first restart (``except BaseException: block again``) is reached again at
    the next raise of the monitor thread's loop (every ``soft_timeout``, 0.5 s here)."""
    swallowed = []

    def swallow_once() -> None:
        try:
            _sleep()
        except RankShouldRestart as restart:
            swallowed.append(restart)
        _queue_get()

    assert restart_while_blocked(swallow_once, soft_timeout=0.5) < FAIL_SAFE
    assert len(swallowed) == 1


# ---- a wake with nothing pending does nothing ---------------------------------------------------------------------


def _wake_main_thread(times: int, gap: float) -> threading.Thread:
    def send() -> None:
        for _ in range(times):
            time.sleep(gap)
            assert MAIN.ident is not None
            wake.wake(MAIN.ident)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def test_a_wake_with_no_restart_pending_does_nothing(installed):
    sender = _wake_main_thread(times=3, gap=0.2)
    started = time.monotonic()
    time.sleep(1.0)  # interrupted three times, resumed three times (PEP 475)
    assert time.monotonic() - started >= 1.0
    sender.join()
    items: queue.Queue[str] = queue.Queue()
    producer = threading.Timer(1.0, items.put, ("item",))
    producer.start()
    sender = _wake_main_thread(times=3, gap=0.2)
    assert items.get() == "item"
    sender.join()
    producer.join()


def test_a_wake_after_the_main_thread_left_the_function_does_nothing(installed):
    # The monitor thread raises only into a main thread inside the function: after leave_function, no
    # exception and no wake (the restart that follows finds the main thread out).
    store = OneInterruption()
    monitor = monitor_thread(store)
    monitor.leave_function()
    store.interrupt()
    assert monitor.shutdown(10) and not monitor.raised_restart
    # An exception scheduled and then cancelled, as leave_function cancels one raised but not yet delivered,
    # followed by a wake: the wake finds nothing pending.
    assert MAIN.ident is not None

    def schedule_cancel_wake() -> None:
        time.sleep(0.2)
        _set_async_exc(MAIN.ident, RankShouldRestart)
        _set_async_exc(MAIN.ident, None)
        wake.wake(MAIN.ident)

    threading.Thread(target=schedule_cancel_wake, daemon=True).start()
    started = time.monotonic()
    time.sleep(1.0)
    assert time.monotonic() - started >= 1.0


# ---- the user's handlers -------------------------------------------------------------------------------------------


def test_a_users_handler_on_the_wake_signal_still_gets_its_own_signals(fresh):
    seen: list[int] = []

    def users(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGURG, users)
    assert MAIN.ident is not None
    assert wake.install()
    try:
        signal.pthread_kill(MAIN.ident, signal.SIGURG)  # the user's own: passed on
        wait_until(lambda: seen == [signal.SIGURG], 10, 0.01, what="the user's handler to get SIGURG")
        wake.wake(MAIN.ident)  # ours, with nothing pending: not passed on
        time.sleep(0.2)  # time for a wrongly passed-on signal to arrive
        assert seen == [signal.SIGURG]
        signal.pthread_kill(MAIN.ident, signal.SIGURG)  # the user's again, right after a wake
        wait_until(lambda: seen == [signal.SIGURG] * 2, 10, 0.01, what="the user's handler to get SIGURG again")
        assert restart_while_blocked(_sleep) < FAIL_SAFE
    finally:
        wake.release()
    assert signal.getsignal(signal.SIGURG) is users


def test_sigterm_and_sigint_handlers_are_untouched_and_run_during_and_after_a_restart(fresh):
    seen: list[int] = []

    def users(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = {sig: signal.signal(sig, users) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert wake.install()
        try:
            assert signal.getsignal(signal.SIGTERM) is users and signal.getsignal(signal.SIGINT) is users
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: seen == [signal.SIGTERM], 10, 0.01, what="the user's SIGTERM handler")
            os.kill(os.getpid(), signal.SIGINT)
            wait_until(lambda: seen == [signal.SIGTERM, signal.SIGINT], 10, 0.01, what="the user's SIGINT handler")
            assert restart_while_blocked(_sleep) < FAIL_SAFE
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: len(seen) == 3, 10, 0.01, what="a third signal to the user's handlers")
        finally:
            wake.release()
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: len(seen) == 4, 10, 0.01, what="a fourth signal to the user's handlers")
        assert seen == [signal.SIGTERM, signal.SIGINT, signal.SIGTERM, signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is users and signal.getsignal(signal.SIGINT) is users
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---- install and release -------------------------------------------------------------------------------------------


def test_the_last_release_restores_the_previous_handler(fresh):
    previous = signal.getsignal(signal.SIGURG)
    assert wake.install() and wake.install()  # nested calls
    wake.release()
    assert signal.getsignal(signal.SIGURG) is wake._handle
    wake.release()
    assert signal.getsignal(signal.SIGURG) is previous
    wake.release()  # one too many: nothing happens
    assert signal.getsignal(signal.SIGURG) is previous


def test_a_handler_the_user_installs_during_the_call_stays_and_gets_no_wake(fresh, caplog):
    def users(signum: int, frame: object) -> None:
        raise AssertionError("a wake reached the user's handler")

    assert wake.install()
    signal.signal(signal.SIGURG, users)
    assert MAIN.ident is not None
    with caplog.at_level(logging.WARNING, logger="inprocess.wake"):
        wake.wake(MAIN.ident)
        wake.wake(MAIN.ident)
    assert caplog.text.count("was replaced") == 1
    wake.release()
    assert signal.getsignal(signal.SIGURG) is users


def test_outside_the_main_thread_nothing_is_installed(fresh, caplog):
    results: list[bool] = []
    with caplog.at_level(logging.DEBUG, logger="inprocess.wake"):
        for _ in range(2):
            thread = threading.Thread(target=lambda: results.append(wake.install()))
            thread.start()
            thread.join()
    assert results == [False, False]
    assert signal.getsignal(signal.SIGURG) is not wake._handle
    assert caplog.text.count("outside the main thread") == 1


def test_a_failure_of_the_mechanism_is_logged_once_and_never_raised(installed, monkeypatch, caplog):
    def broken(thread_id: int, signum: int) -> None:
        raise OSError("no such thread")

    monkeypatch.setattr(signal, "pthread_kill", broken)
    assert MAIN.ident is not None
    with caplog.at_level(logging.WARNING, logger="inprocess.wake"):
        wake.wake(MAIN.ident)
        wake.wake(MAIN.ident)
    assert caplog.text.count("could not send the wake signal") == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", signal.SIGURG),
        ("SIGUSR2", signal.SIGUSR2),
        ("usr2", signal.SIGUSR2),
        (" SIGWINCH ", signal.SIGWINCH),
        (str(int(signal.SIGUSR1)), signal.SIGUSR1),
        (str(int(signal.SIGRTMIN) + 1), int(signal.SIGRTMIN) + 1),  # a real-time signal: a number, no name
        ("0", None),
        ("none", None),
        ("None", None),
    ],
)
def test_the_wake_signal_is_configured_by_the_environment(fresh, monkeypatch, value, expected):
    monkeypatch.setenv(wake.ENVIRONMENT, value)
    assert wake.configured_signal() == expected


@pytest.mark.parametrize("value", ["SIGBOGUS", "-3", "999", "9", "SIGSTOP", "1.5"])
def test_a_bad_wake_signal_is_logged_once_and_the_default_used(fresh, monkeypatch, caplog, value):
    monkeypatch.setenv(wake.ENVIRONMENT, value)
    with caplog.at_level(logging.WARNING, logger="inprocess.wake"):
        assert wake.configured_signal() == signal.SIGURG
        assert wake.configured_signal() == signal.SIGURG
    assert caplog.text.count(f"TORCHRAS_WAKE_SIGNAL={value!r} names no signal") == 1
