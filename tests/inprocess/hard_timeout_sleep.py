"""The body of nvidia-resiliency-ext's ``TestHard.test_sleep``, run as a process of its own by
tests/inprocess/test_hard_timeout.py: soft timeout 0.5 s, hard timeout 1 s, a function that sleeps 10 s (here
``argv[2]`` seconds) in every iteration. Each iteration's start is appended to ``argv[1]`` (a JSON line: the
iteration and the monotonic time); the monitor process's pid goes to ``argv[1] + ".monitor.pid"``.

Not a test module: the test starts it with RANK=0, WORLD_SIZE=1, MASTER_ADDR=localhost, as the reference's test
patches its environment, and the store port in ``argv[3]``.
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import inprocess

OUT, SLEEP, PORT = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
MILLISECOND = datetime.timedelta(seconds=1e-3)


@inprocess.Wrapper(
    store_kwargs={"port": PORT},
    progress_watchdog_interval=MILLISECOND,  # the reference's kwargs(): every interval 1 ms
    monitor_process_interval=MILLISECOND,
    monitor_thread_interval=MILLISECOND,
    last_call_wait=MILLISECOND,
    soft_timeout=datetime.timedelta(seconds=0.5),
    hard_timeout=datetime.timedelta(seconds=1),
    termination_grace_time=MILLISECOND,
    monitor_process_pidfile=OUT + ".monitor.pid",
)
def fn(call_wrapper: inprocess.CallWrapper) -> None:
    with open(OUT, "a") as out:
        out.write(json.dumps({"iteration": call_wrapper.iteration, "time": time.monotonic()}) + "\n")
    time.sleep(SLEEP)


fn()
