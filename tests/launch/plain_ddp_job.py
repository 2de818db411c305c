"""A plain DDP training script, written for torchrun: no import of torchras, ``init_process_group("gloo")`` from the
environment, a checkpoint every few steps by rank 0 (``torch.save``) that a restarted group loads.

    rasd launch --nproc-per-node 4 --max-restarts 2 plain_ddp_job.py --out DIR --checkpoint DIR/ckpt.pt [--steps N]

Test and benchmark devices, in the group's first start only (``TORCHELASTIC_RESTART_COUNT`` 0), not part of what a
user writes:

* ``--kill R:S``: rank R kills itself (SIGKILL) before step S;
* ``--stall R:S``: rank R blocks in one call (``time.sleep(3600)``) before step S, as a wedged data loader does;
* ``--loader``: the batches come from a ``DataLoader`` with one worker process (a child that must start no node);
* ``--install``: the script calls ``rasd.install()`` itself (it must still get one node);
* ``--step-time S``: a sleep per step (default 0.05 s).

It appends JSON lines to ``DIR/<pid>.jsonl``: ``start``, ``synced`` (attempt, rank, world, step loaded), ``step``
(wall-clock time), ``done`` (step, model hash), ``killing``/``stalling``. It trains until every rank has reached
``--steps`` (steps counted across attempts: a restarted group goes on from the checkpoint).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--kill", default="")
    ap.add_argument("--stall", default="")
    ap.add_argument("--loader", action="store_true")
    ap.add_argument("--install", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    started = time.time()

    def record(event: str, **fields: object) -> None:
        line = json.dumps(dict(fields, event=event, time=time.time(), pid=os.getpid()))
        with open(out / f"{os.getpid()}.jsonl", "a") as file:
            file.write(line + "\n")

    if args.install:
        import rasd

        rasd.install()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    record("start", started=started, attempt=attempt)
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))  # gloo's default: the backend's timeout
    rank, world = dist.get_rank(), dist.get_world_size()

    def fault_step(option: str) -> int | None:
        who, _, step = option.partition(":")
        return int(step) if who and attempt == 0 and int(who) == rank else None

    kill_at, stall_at = fault_step(args.kill), fault_step(args.stall)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    checkpoint = Path(args.checkpoint)
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    ddp = DistributedDataParallel(model)
    record("synced", attempt=attempt, rank=rank, world=world, step=step)
    batches = iter(_loader(rank)) if args.loader else None
    while step < args.steps:
        if kill_at is not None and step == kill_at:
            record("killing", step=step, rank=rank)
            os.kill(os.getpid(), signal.SIGKILL)
        if stall_at is not None and step == stall_at:
            record("stalling", step=step, rank=rank)
            time.sleep(3600)
        if batches is not None:
            batch = next(batches)
        else:
            batch = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 1000 + rank))
        optimizer.zero_grad()
        ddp(batch).square().mean().backward()
        optimizer.step()
        step += 1
        record("step", step=step, attempt=attempt, rank=rank, world=world)
        if step % args.save_every == 0 and rank == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, checkpoint.with_suffix(".tmp"))
            os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
        time.sleep(args.step_time)
    dist.barrier()
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in model.state_dict().values()))
    record("done", step=step, rank=rank, attempt=attempt, hash=digest.hexdigest()[:16])
    dist.destroy_process_group()
    return 0


def _loader(rank: int):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(4096, 32, generator=torch.Generator().manual_seed(rank)))
    while True:
        for (batch,) in DataLoader(data, batch_size=16, num_workers=1, persistent_workers=True):
            yield batch


if __name__ == "__main__":
    sys.exit(main())
