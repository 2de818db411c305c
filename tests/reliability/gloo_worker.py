"""One rank of a small real gloo job for the multi-host tests: all_reduce steps until told to stop.

Usage: ``python gloo_worker.py OUT_DIR`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment.
The rank installs rasd (its hooks start the RAS node and the client port), then does one 4-float all_reduce every
``STEP_S`` seconds, and after each step rewrites ``OUT_DIR/rank<R>.json`` with its step count. Every RAS event
goes to ``OUT_DIR/events-<R>.jsonl`` (the swarm's format, so ``Swarm``-style checks apply). It stops after the
step at which ``OUT_DIR/stop`` exists, with a barrier and ``destroy_process_group``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

STEP_S = 0.05


def main() -> int:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    import rasd
    from rasd.swarm import event_record

    rasd.install()
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    events = open(out / f"events-{rank}.jsonl", "a", buffering=1)  # noqa: SIM115 - written until the rank exits
    rasd.on_event(lambda e: events.write(json.dumps(event_record(e)) + "\n"), replay=True)
    t = torch.ones(4)
    steps = 0
    progress = out / f"rank{rank}.json"
    while True:
        dist.all_reduce(t)
        t.fill_(1.0)
        steps += 1
        tmp = progress.with_suffix(".tmp")
        tmp.write_text(json.dumps({"steps": steps, "at": time.time(), "pid": os.getpid()}))
        os.replace(tmp, progress)
        stop = torch.tensor([1.0 if (out / "stop").exists() else 0.0])
        dist.all_reduce(stop)  # every rank stops at the same step
        if stop.item() > 0:
            break
        time.sleep(STEP_S)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
