"""A PyTorch Lightning script as its users write it: ``Trainer(strategy="ddp")`` on the CPU (gloo), a checkpoint
every few steps (``ModelCheckpoint(save_last=True)``), ``trainer.fit(model, ckpt_path="last")`` so that a restarted
group resumes. No import of torchras: under ``rasd launch`` (or torchrun) Lightning sees torchrun's variables
(``TorchElasticEnvironment``) and starts no process of its own.

    rasd launch --nproc-per-node 2 --max-restarts 2 lightning_job.py --out DIR [--steps N] [--kill R:S] [--stall R:S]

Test and benchmark devices, in the group's first start only (``TORCHELASTIC_RESTART_COUNT`` 0): ``--kill R:S``
(rank R kills itself before global step S), ``--stall R:S`` (it blocks in ``time.sleep``). JSON lines in
``DIR/<pid>.jsonl``: ``start``, ``synced`` (the global step it resumed from), ``step``, ``done``, ``killing``.
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
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    record("start", started=started)

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.net(x).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fault(option: str, rank: int, step: int) -> bool:
        who, _, at = option.partition(":")
        return bool(who) and attempt == 0 and int(who) == rank and int(at) == step

    class Faults(pl.Callback):
        def on_train_start(self, trainer, module) -> None:
            record("synced", rank=trainer.global_rank, world=trainer.world_size, step=trainer.global_step)

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            rank, step = trainer.global_rank, trainer.global_step
            if fault(args.kill, rank, step):
                record("killing", step=step, rank=rank)
                os.kill(os.getpid(), signal.SIGKILL)
            if fault(args.stall, rank, step):
                record("stalling", step=step, rank=rank)
                time.sleep(3600)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            record("step", step=trainer.global_step, rank=trainer.global_rank, world=trainer.world_size)
            time.sleep(args.step_time)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(100000, 32))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        callbacks=[ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=5, save_last=True), Faults()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=16), ckpt_path="last")
    record("done", step=trainer.global_step, rank=trainer.global_rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
