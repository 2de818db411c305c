"""A user's DDP training script for torchrun, wrapped in ``inprocess.Wrapper`` with ``inprocess.elastic`` state.

Written as a user writes it from docs/elastic.md: the model and optimizer in a ``TorchState`` built outside the
wrapped function, ``init_process_group`` on ``call_wrapper.store``, ``state.sync()`` right after it, a commit every
few steps, torch's own ``DistributedDataParallel``. It says nothing about joining: under ``rasd launch`` the
Wrapper admits replacements by default. The same file runs under torchrun (``--wrapper none``: a plain DDP script
that saves a checkpoint with ``torch.save`` and loads it when started again, what ``torchrun --max-restarts`` needs;
``--wrapper nvrx``: nvidia-resiliency-ext's Wrapper).

    rasd launch --nproc-per-node 4 heal_job.py --out DIR [--kill RANK:STEP] [--die LOCAL_RANK] [--steps N]

Test and benchmark devices, not part of what a user writes:

* ``--kill R:S``: the worker started as rank R kills itself (SIGKILL) before step S; a replacement never does;
* ``--die L``: every replacement of local rank L kills itself as soon as it starts (a worker that keeps dying);
* ``--die-at-start L``: the first worker of local rank L kills itself once torch is imported, before the Wrapper
  starts (a worker lost at start-up); ``--stall-at-start L``: it blocks there instead, idle in one
  ``time.sleep`` (a worker stuck at start-up); ``--die-in-init L``: it kills itself in iteration 0, right before
  ``init_process_group`` (lost during the first rendezvous); ``--stop R:S``: the worker started as rank R stops
  itself (SIGSTOP, a hang) before step S. Only in the group's first start (``TORCHELASTIC_RESTART_COUNT`` 0), never
  in a replacement;
* it trains until ``DIR/finish`` exists and every rank has reached ``--steps`` (agreed by an all-reduce each step);
* it appends JSON lines to ``DIR/<pid>.jsonl``: ``start``, ``synced`` (iteration, rank, world, step, model hash),
  ``step`` (one per step, with its wall-clock time), ``done`` (step, model hash, world), ``killing``.
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
import typing
from pathlib import Path

STARTED = time.time()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--commit-every", type=int, default=5)
    ap.add_argument("--kill", default="", help="RANK:STEP")
    ap.add_argument("--die", type=int, default=None, help="LOCAL_RANK whose replacements die at once")
    ap.add_argument("--die-at-start", type=int, default=None, help="LOCAL_RANK that dies after importing torch")
    ap.add_argument("--stall-at-start", type=int, default=None, help="LOCAL_RANK that blocks after importing torch")
    ap.add_argument("--die-in-init", type=int, default=None, help="LOCAL_RANK that dies before init_process_group")
    ap.add_argument("--stop", default="", help="RANK:STEP")
    ap.add_argument("--wrapper", choices=("torchras", "nvrx", "none"), default="torchras")
    ap.add_argument("--checkpoint", default="", help="--wrapper none: where torch.save keeps the state")
    args = ap.parse_args()
    out = Path(args.out)
    replacement = os.environ.get("INPROCESS_JOIN") == "1"
    record = Recorder(out / f"{os.getpid()}.jsonl")
    if replacement and args.die is not None and int(os.environ["LOCAL_RANK"]) == args.die:
        record("killing", reason="die")
        os.kill(os.getpid(), signal.SIGKILL)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    record("start", started=STARTED, replacement=replacement, env_rank=os.environ.get("RANK"))
    kill_rank, _, kill_step = args.kill.partition(":")
    first = not replacement and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"  # not after a restart
    kill_at = int(kill_step) if kill_rank and first and int(os.environ["RANK"]) == int(kill_rank) else None
    stop_rank, _, stop_step = args.stop.partition(":")
    stop_at = int(stop_step) if stop_rank and first and int(os.environ["RANK"]) == int(stop_rank) else None
    local_rank = int(os.environ["LOCAL_RANK"])
    if first and args.die_at_start == local_rank:
        record("killing", reason="die-at-start")
        os.kill(os.getpid(), signal.SIGKILL)
    if first and args.stall_at_start == local_rank:
        record("stalling", reason="stall-at-start")
        time.sleep(3600)  # blocked idle in one call
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    finish = out / "finish"

    def train_steps(state, world_size: int, rank: int, iteration: int) -> None:
        ddp = DistributedDataParallel(model)
        while True:
            stop = torch.tensor([float(finish.exists() and state.step >= args.steps)])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if stop.item():
                break
            if kill_at is not None and state.step == kill_at:
                record("killing", step=state.step, rank=rank)
                os.kill(os.getpid(), signal.SIGKILL)
            if stop_at is not None and state.step == stop_at and iteration == 0:
                record("stopping", step=state.step, rank=rank)
                os.kill(os.getpid(), signal.SIGSTOP)
            generator = torch.Generator().manual_seed(state.step * 1000 + rank)
            optimizer.zero_grad()
            ddp(torch.randn(16, 32, generator=generator)).square().mean().backward()
            optimizer.step()
            state.step += 1
            record("step", step=state.step, iteration=iteration, rank=rank, world=world_size)
            if state.step % args.commit_every == 0:
                state.commit()
            time.sleep(args.step_time)
        dist.barrier()
        record("done", step=state.step, hash=model_hash(model), world=world_size, rank=rank, iteration=iteration)

    if args.wrapper == "none":  # torchrun's way: a whole-job restart, the state from disk
        checkpointed = Checkpointed(args.checkpoint, model, optimizer)
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        # torchrun's store, one namespace per attempt: torch 2.13's env:// init reads the first attempt's gloo
        # addresses after a restart (the agent's store outlives the attempt).
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False)
        store = dist.PrefixStore(f"attempt{attempt}", base)
        timeout = datetime.timedelta(seconds=120)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        checkpointed.load(record)
        record("synced", iteration=attempt, rank=rank, world=world_size, step=checkpointed.step, hash=model_hash(model))
        train_steps(checkpointed, world_size, rank, attempt)
        dist.destroy_process_group()
        return 0

    if args.wrapper == "nvrx":  # nvidia-resiliency-ext's Wrapper: under torchrun, a kill restarts the whole job
        import nvidia_resiliency_ext.inprocess as nvrx  # type: ignore[import-not-found]

        checkpointed = Checkpointed(args.checkpoint, model, optimizer)

        def train_nvrx(call_wrapper=None) -> None:
            rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
            base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False)
            assert call_wrapper is not None  # the Wrapper passes it
            store = dist.PrefixStore(f"attempt{attempt}/iteration{call_wrapper.iteration}", base)
            dist.init_process_group(
                "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
            )
            checkpointed.load(record)
            record("synced", iteration=attempt, rank=rank, world=world_size, step=checkpointed.step,
                   hash=model_hash(model))  # fmt: skip
            train_steps(checkpointed, world_size, rank, attempt)
            dist.destroy_process_group()

        # nvidia-resiliency-ext finds the parameter by its evaluated annotation (this file's are strings).
        train_nvrx.__annotations__["call_wrapper"] = typing.Optional[nvrx.CallWrapper]  # noqa: UP045
        nvrx.Wrapper(store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})(train_nvrx)()
        return 0

    import inprocess
    from inprocess.elastic import TorchState

    state = TorchState(model, optimizer, step=0)  # outside the wrapped function: it outlives restarts

    @inprocess.Wrapper(store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if first and args.die_in_init == local_rank and call_wrapper.iteration == 0:
            record("killing", reason="die-in-init")
            os.kill(os.getpid(), signal.SIGKILL)
        dist.init_process_group(
            "gloo", store=call_wrapper.store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
        )
        state.sync()
        record("synced", iteration=call_wrapper.iteration, rank=rank, world=world_size, step=state.step,
               hash=model_hash(model))  # fmt: skip
        train_steps(state, world_size, rank, call_wrapper.iteration)
        dist.destroy_process_group()

    train()
    return 0


class Checkpointed:
    """What a job without in-memory state does: rank 0 saves a checkpoint at every commit (``torch.save``), and
    every rank of a restarted job loads it (``torch.load``)."""

    def __init__(self, path: str, model, optimizer) -> None:
        self.path = Path(path)
        self.model = model
        self.optimizer = optimizer
        self.step = 0

    def commit(self) -> None:
        import torch
        import torch.distributed as dist

        if dist.get_rank() == 0:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step}
            torch.save(state, self.path.with_suffix(".tmp"))
            os.replace(self.path.with_suffix(".tmp"), self.path)

    def load(self, record) -> None:
        import torch

        if self.path.exists():
            loaded = torch.load(self.path)
            self.model.load_state_dict(loaded["model"])
            self.optimizer.load_state_dict(loaded["optimizer"])
            self.step = loaded["step"]
            record("loaded", step=self.step)


def model_hash(model) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Recorder:
    """JSON lines, one ``write`` each, in this process's own file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, event: str, **fields: object) -> None:
        line = json.dumps(dict(fields, event=event, time=time.time(), pid=os.getpid(), initial=os.environ.get("RANK")))
        with open(self.path, "a") as file:
            file.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
