"""One rank of tests/inprocess/test_busy_timeouts.py: a wrapped function that pings once, then works, sleeps or
waits in a barrier, past the Wrapper's (small) soft and hard timeouts.

Not a test module. Configured by the JSON in ``BUSY_SCENARIO``: ``out`` (events, JSON lines, ``{rank}`` = initial
rank), ``port`` (the Wrapper's store), ``soft``/``hard`` (seconds), and per initial rank a list of steps for
iteration 0 (later iterations return at once, unless ``repeat``): ``["save", s]`` (a ``torch.save`` loop for s
seconds), ``["cpu", s]`` (a CPU loop), ``["sleep", s]``, ``["ping"]``, ``["barrier"]`` (``dist.barrier()`` of the
job's gloo group).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import inprocess

SCENARIO = json.loads(os.environ["BUSY_SCENARIO"])
INITIAL_RANK = int(os.environ["RANK"])
WORLD_SIZE = int(os.environ["WORLD_SIZE"])
OUT = open(SCENARIO["out"].format(rank=INITIAL_RANK), "a", buffering=1)  # noqa: SIM115 - one line per event
SECONDS = datetime.timedelta(seconds=1)


def emit(event: str, **fields: object) -> None:
    OUT.write(json.dumps(dict(event=event, time=time.monotonic(), **fields)) + "\n")


def save_loop(seconds: float, directory: str) -> None:
    tensor = torch.randn(1 << 20)  # 4 MiB a save
    path = os.path.join(directory, f"checkpoint{INITIAL_RANK}.pt")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.save(tensor, path)


def cpu_loop(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(10_000))


@inprocess.Wrapper(
    store_kwargs={"port": SCENARIO["port"], "timeout": 60 * SECONDS},
    monitor_thread_interval=0.1 * SECONDS,
    monitor_process_interval=0.1 * SECONDS,
    progress_watchdog_interval=0.1 * SECONDS,
    heartbeat_interval=0.5 * SECONDS,
    heartbeat_timeout=30 * SECONDS,
    soft_timeout=SCENARIO["soft"] * SECONDS,
    hard_timeout=SCENARIO["hard"] * SECONDS,
    barrier_timeout=60 * SECONDS,
    completion_timeout=60 * SECONDS,
    last_call_wait=0.1 * SECONDS,
    termination_grace_time=0.5 * SECONDS,
    monitor_process_pidfile=SCENARIO["pidfile"],
    monitor_process_logfile=SCENARIO["logfile"],
    repeated_faults=None,
)
def train(call_wrapper: inprocess.CallWrapper) -> None:
    iteration = call_wrapper.iteration
    emit("start", iteration=iteration)
    if iteration > 0 and not SCENARIO.get("repeat"):
        return
    if WORLD_SIZE > 1:
        dist.init_process_group(
            "gloo", store=call_wrapper.store, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
        )
    call_wrapper.ping()  # arms the soft timeout on manual stamps, as a script that pings every step has
    try:
        for step in SCENARIO["steps"][str(INITIAL_RANK)]:
            kind, seconds = step[0], float(step[1]) if len(step) > 1 else 0.0
            emit("begin", iteration=iteration, step=kind)
            if kind == "save":
                save_loop(seconds, os.path.dirname(SCENARIO["out"]))
            elif kind == "cpu":
                cpu_loop(seconds)
            elif kind == "sleep":
                time.sleep(seconds)
            elif kind == "ping":
                call_wrapper.ping()
            elif kind == "barrier":
                dist.barrier()
            emit("end", iteration=iteration, step=kind)
    except BaseException as error:
        emit("left", iteration=iteration, error=type(error).__name__)
        raise
    if WORLD_SIZE > 1:
        dist.destroy_process_group()


train()
emit("done")
sys.exit(0)
