"""Waiting in tests: ask again until a condition holds, or fail once a deadline passes, saying what was awaited and
what was seen last.

Every test that waits for something to happen (a process to start, a report to say something, a file to appear)
waits through here, never through a bare ``time.sleep``: a sleep long enough on a loaded machine is too long
everywhere else, and one that is too short fails at random. A sleep is right only where time itself must pass (to
prove that nothing happens meanwhile, or to age a timer); such a sleep says so in a comment.

Standard library only. ``tests/`` is on ``sys.path`` in every test (pytest puts the folder of the root
``conftest.py`` there), so any test module imports it as ``from polling import wait_until``; a helper script that
runs as its own process puts ``tests/`` on its path first.

    wait_until(lambda: path.exists(), 30, what="the member's file")            # a condition
    report = wait_for(lambda: status(port), lambda r: "DEAD" in r, 10, what="a DEAD verdict")  # a value that passes
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar, cast

T = TypeVar("T")

#: How much of the last value an error message shows (a report can be long; its end is what differs).
SHOWN = 6000


def wait_for(
    fetch: Callable[[], T],
    accept: Callable[[T], object],
    timeout: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "the condition",
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """``fetch()`` again every ``interval`` seconds until ``accept(value)`` holds; returns that value.

    Fails with an ``AssertionError`` naming ``what`` and the last value fetched once ``timeout`` seconds have passed
    (``fetch`` is called once more at the deadline itself); ``what`` may be a function, called only then (a job's
    logs as they are at the deadline). An exception of ``retry_on`` raised by ``fetch`` counts as "not yet" (a
    connection refused while a server starts) and is the last value; any other exception, including an
    ``AssertionError`` raised by ``fetch`` or ``accept`` (a process that died while it was awaited), ends the wait
    at once.
    """
    accepted, last = _poll(fetch, accept, timeout, interval, retry_on)
    if accepted:
        return cast(T, last)  # an accepted value is a fetched one
    awaited = what if isinstance(what, str) else what()
    raise AssertionError(f"timed out after {timeout:g} s waiting for {awaited}; last: {_shown(last)}")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "the condition",
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """``predicate()`` again every ``interval`` seconds until it returns a truthy value; returns that value.

    On timeout, an ``AssertionError`` naming ``what`` and the last (falsy) value; ``retry_on`` as for
    :func:`wait_for`."""
    return wait_for(predicate, bool, timeout, interval=interval, what=what, retry_on=retry_on)


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.1) -> T:
    """As :func:`wait_until`, but a timeout is no error: the last (falsy) value comes back. For a process of a test
    job that writes down what it saw for the test to assert on, rather than failing itself."""
    _, last = _poll(predicate, bool, timeout, interval, ())
    return cast(T, last)  # no retry_on: every value is a fetched one


def _poll(
    fetch: Callable[[], T],
    accept: Callable[[T], object],
    timeout: float,
    interval: float,
    retry_on: tuple[type[BaseException], ...],
) -> tuple[bool, object]:
    """(True, the accepted value), or (False, the last value or ``retry_on`` exception) at the deadline."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fetch()
        except retry_on as error:
            last = error
        else:
            if accept(value):
                return True, value
            last = value
        left = deadline - time.monotonic()
        if left <= 0:
            return False, last
        time.sleep(min(interval, left))


def _shown(value: object) -> str:
    if isinstance(value, BaseException):
        text = f"{type(value).__name__}: {value}"
    elif isinstance(value, str):
        text = "\n" + value if "\n" in value else repr(value)
    else:
        text = repr(value)
    return text if len(text) <= SHOWN else f"...{text[-SHOWN:]}"
