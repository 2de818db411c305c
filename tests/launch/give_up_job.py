"""A job whose Wrapper gives up: ``RetryController(max_iterations=2)`` around a function that always raises.

    rasd launch --nproc-per-node 2 give_up_job.py [--crash-first]

The function raises on every rank in iterations 0 and 1; iteration 2's ``initialize`` raises ``RestartAbort`` on
every rank, the Wrapper announces ``gave_up`` to the launcher (``inprocess.launch_events``), and the script lets
``RestartAbort`` out, as a script that does not catch it does (exit code 1). No torch.distributed: the Wrapper alone.

``--crash-first``: the first worker of local rank 1 exits (code 3) in iteration 0, so it is respawned; its
replacement is still starting, or waiting to be admitted, when rank 0 gives up.
"""

from __future__ import annotations

import datetime
import os
import sys

import inprocess

SECONDS = datetime.timedelta(seconds=1)


@inprocess.Wrapper(
    store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1},
    initialize=inprocess.initialize.RetryController(max_iterations=2),
    monitor_thread_interval=0.1 * SECONDS,
    monitor_process_interval=0.1 * SECONDS,
    progress_watchdog_interval=0.1 * SECONDS,
    last_call_wait=0.05 * SECONDS,
    soft_timeout=60 * SECONDS,
    hard_timeout=120 * SECONDS,
    heartbeat_timeout=60 * SECONDS,
    barrier_timeout=180 * SECONDS,
)
def train() -> None:
    if "--crash-first" in sys.argv and os.environ["LOCAL_RANK"] == "1" and os.environ.get("INPROCESS_JOIN") != "1":
        os._exit(3)
    raise ValueError("this job always fails")


if __name__ == "__main__":
    train()
