"""Run a call that may hang (a CUDA synchronise, a user's finalize) on a daemon thread, for at most a timeout."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

from . import exception


def run_bounded(fn: Callable[[], object], timeout: datetime.timedelta, name: str, what: str) -> None:
    """Call ``fn`` on a daemon thread named ``name``; re-raise what it raised, or raise ``TimeoutError`` naming
    ``what`` when it is still running after ``timeout`` (the thread is left behind: a hung call cannot be killed)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors.append(error)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout.total_seconds())
    if thread.is_alive():
        raise exception.TimeoutError(f"{what} after {timeout}")
    if errors:
        raise errors[0]
