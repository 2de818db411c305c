"""A Hugging Face accelerate script as its users write it: ``Accelerator()`` on the CPU (gloo, from torchrun's
variables), ``accelerator.prepare`` of the model, optimizer and data loader (torch's DDP inside), and
``accelerator.save_state`` every few steps with ``load_state`` at start when a saved state exists, so that a
restarted group resumes. No import of torchras: under ``rasd launch`` (or torchrun) accelerate initializes
torch.distributed from env:// as it does under torchrun.

    rasd launch --nproc-per-node 2 --max-restarts 2 accelerate_job.py --out DIR [--steps N] [--kill R:S] [--stall R:S]

Test devices, in the group's first start only (``TORCHELASTIC_RESTART_COUNT`` 0): ``--kill R:S`` (rank R kills
itself before step S), ``--stall R:S`` (it blocks in ``time.sleep``). JSON lines in ``DIR/<pid>.jsonl``: ``start``,
``synced`` (the step it resumed from), ``step``, ``done``, ``killing``, ``stalling``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--kill", default="")
    ap.add_argument("--stall", default="")
    args = ap.parse_args()
    out = Path(args.out)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def record(event: str, **fields: object) -> None:
        line = json.dumps(dict(fields, event=event, time=time.time(), pid=os.getpid(), attempt=attempt))
        with open(out / f"{os.getpid()}.jsonl", "a") as file:
            file.write(line + "\n")

    started = time.time()
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    record("start", started=started)

    def fault(option: str, rank: int, step: int) -> bool:
        who, _, at = option.partition(":")
        return bool(who) and attempt == 0 and int(who) == rank and int(at) == step

    class Progress:
        """The step, saved and loaded with the state (``register_for_checkpointing``), as accelerate's docs show."""

        def __init__(self) -> None:
            self.step = 0

        def state_dict(self) -> dict[str, int]:
            return {"step": self.step}

        def load_state_dict(self, state: dict[str, int]) -> None:
            self.step = int(state["step"])

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(100000, 32)), batch_size=16)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    saved = out / "state"
    if (saved / "model.safetensors").exists() or any(saved.glob("pytorch_model*")):
        accelerator.load_state(str(saved))
    rank = accelerator.process_index
    record("synced", rank=rank, world=accelerator.num_processes, step=progress.step)
    batches = iter(loader)
    while progress.step < args.steps:
        if fault(args.kill, rank, progress.step):
            record("killing", step=progress.step, rank=rank)
            os.kill(os.getpid(), signal.SIGKILL)
        if fault(args.stall, rank, progress.step):
            record("stalling", step=progress.step, rank=rank)
            time.sleep(3600)
        (x,) = next(batches)
        loss = model(x).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        progress.step += 1
        record("step", step=progress.step, rank=rank, world=accelerator.num_processes)
        if progress.step % args.save_every == 0:
            accelerator.save_state(str(saved))  # every rank calls it; rank 0 writes, with a barrier inside
        time.sleep(args.step_time)
    accelerator.wait_for_everyone()
    record("done", step=progress.step, rank=rank)
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
