"""Single-rank calls of wrapped functions, run as ``python inprocess_parity_calls.py OUT_DIR`` by the parity test.

A subprocess of its own because a hard timeout kills the trainer (it must not be pytest) and because "nothing
outlives a call" is measured on a process that does nothing else. One JSON line per scenario goes to stdout.
Each scenario is a behaviour the reference pins (docs/inprocess.md, parity table).
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import inprocess
from inprocess.rank_assignment import RankAssignment, RankAssignmentCtx

SECONDS = datetime.timedelta(seconds=1)


class Records(logging.Handler):
    """Keeps every message of the ``inprocess`` loggers (added once, before the first call)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def fast(port: int, **kwargs: Any) -> dict:
    settings: dict[str, Any] = dict(
        store_kwargs={"port": port},
        monitor_thread_interval=0.1 * SECONDS,
        monitor_process_interval=0.1 * SECONDS,
        progress_watchdog_interval=0.1 * SECONDS,
        last_call_wait=0.05 * SECONDS,
        soft_timeout=20 * SECONDS,
        hard_timeout=40 * SECONDS,
        heartbeat_timeout=30 * SECONDS,
        barrier_timeout=60 * SECONDS,
    )
    settings.update(kwargs)
    return settings


def footprint() -> dict:
    gc.collect()
    stores = [obj for obj in gc.get_objects() if isinstance(obj, inprocess.store.TCPStore)]
    handlers = sum(len(logging.getLogger(name).handlers) for name in list(logging.root.manager.loggerDict))
    return dict(
        stores=len(stores),
        threads=sorted(thread.name for thread in threading.enumerate()),
        handlers=handlers + len(logging.root.handlers),
        fds=len(os.listdir("/proc/self/fd")),
    )


def nothing_outlives_a_call(port: int, out: Path) -> dict:
    """Calls that return and calls that raise, many in a row: stores, threads, handlers and fds stay flat."""
    logfile, pidfile = str(out / "monitor{rank}.log"), str(out / "monitor{rank}.pid")

    @inprocess.Wrapper(
        **fast(
            port,
            monitor_process_logfile=logfile,
            monitor_process_pidfile=pidfile,
            initialize=inprocess.initialize.RetryController(max_iterations=2),
        )
    )
    def train(fail: bool, call_wrapper: inprocess.CallWrapper | None = None) -> int:
        if fail:
            raise ValueError("every iteration fails")
        if call_wrapper.iteration == 0:
            raise RuntimeError("the first iteration fails")
        return call_wrapper.iteration

    before = footprint()
    after = []
    kept = []  # the exceptions the calls raised, kept alive: their tracebacks must not hold a store either
    for number in range(3):
        try:
            train(fail=number % 2 == 1)
        except inprocess.exception.RestartAbort as error:
            kept.append(error)
        after.append(footprint())
    pid = Path(pidfile.format(rank=0))
    log_lines = Path(logfile.format(rank=0)).read_text().splitlines()
    return dict(
        before=before,
        after=after,
        raised=len(kept),
        log_lines=log_lines,
        pidfile=pid.read_text() if pid.exists() else None,
    )


class ActivateLate(RankAssignment):
    """Leaves the rank in Mode.INITIALIZED at the first call, activates it afterwards."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        self.calls += 1
        if self.calls > 1:
            ctx = inprocess.rank_assignment.ActivateAllRanks()(ctx)
        return ctx


def initialized_then_rank_should_restart(port: int, records: Records) -> dict:
    """Iteration 0: the assignment left the rank INITIALIZED (a fault, as in the reference). Iteration 1: the
    workload raises RankShouldRestart itself, which must be recorded as an interruption. Iteration 2 returns."""
    seen = []
    assignment = ActivateLate()

    @inprocess.Wrapper(**fast(port, rank_assignment=assignment))
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> str:
        seen.append(call_wrapper.iteration)
        if call_wrapper.iteration == 1:
            raise inprocess.monitor_thread.RankShouldRestart("the workload asks for a restart")
        return "done"

    first = len(records.messages)
    result = train()
    return dict(result=result, iterations=seen, assignment_calls=assignment.calls, messages=records.messages[first:])


def hang_protection_holds_under_tight_timeouts(port: int, records: Records) -> dict:
    """The reference's own tests: soft 1.25 s, hard 1.5 s, default 1 s intervals; a 2 s sleep inside
    ``disable_hang_protection()`` times nothing out, an exception inside it still restarts."""
    tight = dict(
        store_kwargs={"port": port},
        soft_timeout=1.25 * SECONDS,
        hard_timeout=1.5 * SECONDS,
        heartbeat_timeout=1.75 * SECONDS,
        barrier_timeout=3 * SECONDS,
    )
    calls = []

    @inprocess.Wrapper(**tight)
    def sleeper(call_wrapper: inprocess.CallWrapper | None = None) -> str:
        calls.append(call_wrapper.iteration)
        if call_wrapper.iteration == 0:
            with call_wrapper.disable_hang_protection():
                time.sleep(2)
                raise ValueError("inside the disabled region")
        return "restarted"

    first = len(records.messages)
    result = sleeper()
    return dict(result=result, calls=calls, messages=records.messages[first:])


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    ports = [int(port) for port in argv[2].split(",")]
    records = Records()
    logging.getLogger("inprocess").addHandler(records)
    logging.getLogger("inprocess").setLevel(logging.DEBUG)
    scenarios = [
        ("nothing_outlives_a_call", lambda: nothing_outlives_a_call(ports[0], out)),
        ("initialized_then_rank_should_restart", lambda: initialized_then_rank_should_restart(ports[1], records)),
        (
            "hang_protection_holds_under_tight_timeouts",
            lambda: hang_protection_holds_under_tight_timeouts(ports[2], records),
        ),
    ]
    only = set(argv[3].split(",")) if len(argv) > 3 else None
    for name, scenario in scenarios:
        if only is not None and name not in only:
            continue
        try:
            result: dict = dict(scenario=name, **scenario())
        except BaseException as error:  # noqa: BLE001 - reported to the test
            result = dict(scenario=name, error=repr(error))
        print(json.dumps(result, default=repr), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
