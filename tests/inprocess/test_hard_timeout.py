"""nvidia-resiliency-ext's ``TestHard.test_sleep``, ported: the hard timeout bounds a soft timeout that keeps firing.

The reference's test (tests/inprocess/test_timeout.py): soft timeout 0.5 s, hard timeout 1 s, a function that
sleeps 10 s; the process must end with SIGTERM (exit code -15), the hard timeout's signal, before the sleep is
over. There a sleeping rank cannot receive the restart, so the hard timeout kills it. Here the wake signal takes it
out of ``time.sleep`` at the soft timeout (docs/inprocess.md section 2.1), and the function sleeps again in the next
iteration: it restarted for ever (issue 38). The monitor process now counts the time without progress across the
restarts its own soft timeouts caused, so the hard timeout ends it as the reference's does; and nothing of the call
is left: its monitor process exits with it, the store server when its linger is over. The busy rule (on by
default: a rank that works outlives its timeouts, tests/inprocess/test_busy_timeouts.py) shields no idle rank: the
sleeping one restarts at its soft timeout and ends at its hard timeout.

The reference asserts the time too (less than half the sleep); a wall-clock bound on this shared machine would
fail on load, so the sleep here is 300 s: a process that the hard timeout did not end is still asleep at the
test's deadline, and the exit code says which signal ended it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from inprocess import store_server
from inprocess_jobs import free_ports

pytestmark = pytest.mark.slow  # a process of its own, its monitor process and the store server

HERE = Path(__file__).parent
REPOSITORY = HERE.parents[1]
SLEEP_S = 300  # the reference's 10 s, made longer than any deadline below
DEADLINE_S = 120  # start-up on a loaded machine (the store server imports torch) and the timeouts, many times over


def processes_of(port: int, pidfile: Path) -> list[psutil.Process]:
    """The call's monitor process (its pid file) and the store server on ``port``, while they run."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(part.endswith("store_server.py") for part in cmdline) and str(port) in cmdline:
            found.append(process)
    if pidfile.exists():
        try:
            monitor = psutil.Process(int(pidfile.read_text()))
            if monitor.status() != psutil.STATUS_ZOMBIE:
                found.append(monitor)
        except (ValueError, psutil.NoSuchProcess):
            pass
    return found


def test_sleep_ends_at_the_hard_timeout_with_sigterm_and_leaves_nothing(tmp_path: Path) -> None:
    out, port = tmp_path / "iterations.jsonl", free_ports(1)[0]
    pidfile = Path(f"{out}.monitor.pid")
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="localhost",
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        **{store_server.LINGER_ENVIRONMENT: "1"},
    )
    for name in ("TORCHRAS_REPEATED_FAULTS", "TORCHRAS_WAKE_SIGNAL"):
        env.pop(name, None)
    command = [sys.executable, str(HERE / "hard_timeout_sleep.py"), str(out), str(SLEEP_S), str(port)]
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        child.wait(DEADLINE_S)
    except subprocess.TimeoutExpired:
        child.kill()
    output = child.communicate()[0]
    ended = time.monotonic()
    starts = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    report = f"exit code {child.returncode}; iterations {starts}\n{output[-4000:]}"
    try:
        assert child.returncode == -15, report  # SIGTERM, as the reference's test asserts
        # The wake signal restarted it once at the soft timeout (0.5 s); the hard timeout (1 s without progress,
        # the two iterations together) ended it in the second iteration, before a second soft timeout, or, on a
        # loaded machine where the restart itself outlasts the 0.5 s left, during the restart: never later.
        assert [start["iteration"] for start in starts] in ([0, 1], [0]), report
        print(f"from the first iteration's start to the exit: {ended - starts[0]['time']:.2f} s (upper bound)")
        # Nothing left: the monitor process leaves with its trainer, the store server after its linger (1 s here).
        deadline = time.monotonic() + 60
        while processes_of(port, pidfile) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_of(port, pidfile), report
    finally:
        for process in processes_of(port, pidfile):
            process.kill()
