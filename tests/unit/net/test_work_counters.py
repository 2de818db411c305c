"""The work counters the RAS thread reads from ``/proc`` (rasd/net/work.py), read on this machine's kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from rasd.core.work import WorkSample
from rasd.net.work import WorkCounters, _runnable_seconds, _stat

SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n"


def sample_from_another_thread(counters: WorkCounters) -> WorkSample | None:
    """A sample as the RAS thread takes it: from a thread of its own, which the sample leaves out."""
    out: list[WorkSample | None] = []
    reader = threading.Thread(target=lambda: out.append(counters()))
    reader.start()
    reader.join()
    return out[0]


def test_a_sample_reads_the_cpu_of_the_other_threads_and_the_main_threads_run_queue_wait() -> None:
    counters = WorkCounters()
    if not counters.available:
        pytest.skip("no /proc")
    first = sample_from_another_thread(counters)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # the main thread works
        pass
    second = sample_from_another_thread(counters)
    assert first is not None and second is not None
    # The loop's 0.3 s were spent on a core or waiting for one (on a loaded machine, mostly waiting: 0.03 s of CPU
    # and 0.31 s on the run queue, seen under the full suite beside other jobs): both count as work.
    worked = (second.cpu_s - first.cpu_s) + (second.runnable_s - first.runnable_s)
    assert worked >= 0.1, (first, second)
    assert second.runnable_s >= first.runnable_s >= 0.0
    assert _runnable_seconds("/proc/no-such-process/schedstat") == 0.0


@pytest.mark.slow  # two processes, a second and a half
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_two_loops_sharing_one_core_each_wait_on_the_run_queue_for_about_half_the_time() -> None:
    """What the field means: a process ready to run but kept off the core by another is counted there."""
    if not os.path.exists(f"/proc/{os.getpid()}/schedstat"):
        pytest.skip("the kernel keeps no scheduler statistics")
    core = min(os.sched_getaffinity(0))
    loops = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        for loop in loops:
            os.sched_setaffinity(loop.pid, {core})
        time.sleep(0.3)
        before = [_runnable_seconds(f"/proc/{loop.pid}/schedstat") for loop in loops]
        time.sleep(1.0)
        after = [_runnable_seconds(f"/proc/{loop.pid}/schedstat") for loop in loops]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    waited = [a - b for a, b in zip(after, before, strict=True)]
    assert all(w >= 0.2 for w in waited), waited  # about 0.5 s each; other work on the core only adds to it
    assert all(loop.poll() is not None for loop in loops)


def test_a_stat_line_gives_cpu_session_and_whether_the_task_waits_on_the_disk(tmp_path) -> None:
    """``stat``'s fields as the kernel writes them (proc(5)); the command name may hold spaces and parentheses."""
    ticks = os.sysconf("SC_CLK_TCK")
    rest = f"1 2 4242 0 -1 4194304 10 0 0 0 {3 * ticks} {ticks} 0 0 20 0 3 0 100 0 0"
    for state, waits in (("D", True), ("S", False), ("R", False)):
        path = tmp_path / f"stat-{state}"
        path.write_bytes(f"4321 (python (a b)) {state} {rest}\n".encode())
        assert _stat(str(path)) == (4.0, 4242, waits)
    own = _stat(f"/proc/{os.getpid()}/stat")
    assert own[2] is False  # this process runs the test: R, never D
