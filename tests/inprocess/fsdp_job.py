"""A user's FSDP2 training script written from the README's pattern for sharded state (``ShardedState``): torch's
own ``fully_shard`` on a CPU device mesh over gloo, the training function wrapped in ``inprocess.Wrapper``,
launched by plain ``torchrun`` or by ``rasd launch``.

    torchrun --nproc-per-node 4 fsdp_job.py --out DIR --steps 30 [--fault stall:2:12] [--fault kill:2:12]

The data are the same whatever the world size: step S's global batch of 12 samples is drawn from seed S, and rank
r of a world of w trains on its slice; FSDP2 averages the gradients, so every world computes the same update (up to
the order of floating-point sums). ``--fault KIND:RANK:STEP`` (repeatable): ``stall`` (a wedged data loader:
``time.sleep(600)``, once), ``kill`` (kill -9 of itself), both before the forward pass of step STEP, by the process
whose *initial* rank is RANK (a replacement started by ``rasd launch`` never injects); ``KIND:RANK:STEP:ITERATION``:
only once the Wrapper's iteration is ITERATION or later (a fault during the recovery from another).

Each process appends JSON lines to ``DIR/rank<initial rank or pid>.jsonl``: ``sync`` (where the state came from,
the step, the world, rank 0's digest of the full parameters), ``commit`` (step, world, digest) and ``done``
(rank 0 also saves the full parameters to ``DIR/final.pt``). ``--min-world W``: once trained, keep committing (each
commit lets a waiting replacement join) until the world is W again. ``--no-map``: the processes cannot map each
other's blobs (as ranks in separate pid namespaces), so restores fetch every byte over the network.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=FutureWarning)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

import inprocess  # noqa: E402
from inprocess.elastic import ShardedState  # noqa: E402

BATCH = 12  # divisible by 2, 3 and 4: every world trains on equal slices
TP = 2  # --tp: the tensor-parallel dimension of a 2-D mesh (dp = world / 2)


def initial_model() -> torch.nn.Sequential:
    """The model every process builds, the same on each (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 40), torch.nn.ReLU(), torch.nn.Linear(40, 4))


def global_batch(step: int) -> torch.Tensor:
    """Step ``step``'s global batch, whatever the world: each rank trains on its slice of it."""
    return torch.randn(BATCH, 16, generator=torch.Generator().manual_seed(step))


def optimizer_for(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def trained_alone(steps: int) -> dict[str, torch.Tensor]:
    """The parameters after ``steps`` steps of the same training in one process, on the whole batch: what every
    world computes (FSDP2 averages the slices' gradients), up to the order of floating-point sums. The tests'
    reference for a job's final parameters, computed in milliseconds instead of by a run without a fault."""
    model = initial_model()
    optimizer = optimizer_for(model)
    # As in the job, whose first sync reads the optimizer's state through torch's state-dict API: an optimizer
    # without state is given one by a step with zero gradients and a zero learning rate (AdamW's step count is 1).
    get_optimizer_state_dict(model, optimizer)
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        model(global_batch(step)).pow(2).mean().backward()
        optimizer.step()
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--commit-every", type=int, default=3)
    ap.add_argument("--fault", action="append", default=[])
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--redundancy", type=int, default=1)
    ap.add_argument("--min-world", type=int, default=0, help="once trained, commit until the world is this big")
    ap.add_argument("--tp", action="store_true", help="FSDP2 + TP on a (world / 2, 2) mesh where 2 divides the world")
    ap.add_argument("--no-map", action="store_true", help="no process can map another's blobs: fetch by network")
    args = ap.parse_args()
    if args.no_map:
        from inprocess.elastic import shared_memory

        shared_memory.open_fd = lambda handle: None  # what a process of another pid namespace gets
    joiner = os.environ.get("INPROCESS_JOIN") == "1"
    initial = -1 if joiner else int(os.environ["RANK"])
    out = Path(args.out)
    name = f"rank{initial}" if initial >= 0 else f"joiner{os.getpid()}"
    faults = [
        (kind, int(rank), int(step), int(after[0]) if after else 0)
        for kind, rank, step, *after in (f.split(":") for f in args.fault)
    ]
    faults = [fault for fault in faults if fault[1] == initial]

    def emit(**fields: object) -> None:
        with open(out / f"{name}.jsonl", "a") as lines:
            lines.write(json.dumps(fields) + "\n")

    def data_parallel() -> tuple[int, int]:
        """This rank's slice of the batch and how many slices: the TP pairs of a 2-D mesh train on one slice."""
        world, rank = dist.get_world_size(), dist.get_rank()
        tp = TP if args.tp and world % TP == 0 else 1
        return rank // tp, world // tp

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model = initial_model()
        world = dist.get_world_size()
        if args.tp and world % TP == 0:  # FSDP2 + TP on a 2-D mesh; a world it does not divide trains FSDP2 alone
            mesh = init_device_mesh("cpu", (world // TP, TP), mesh_dim_names=("dp", "tp"))
            parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
            fully_shard(model, mesh=mesh["dp"])
        else:
            fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        return model, optimizer_for(model)

    disk = {"checkpoint_dir": args.checkpoint_dir} if args.checkpoint_dir else {}
    state = ShardedState(build, redundancy=args.redundancy, step=0, **disk)

    def digest(model: torch.nn.Module) -> tuple[str, dict[str, torch.Tensor]]:
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # collective
        hashed = hashlib.sha256()
        for key in sorted(full):
            hashed.update(full[key].numpy().tobytes())
        return hashed.hexdigest()[:16], full

    @inprocess.Wrapper(store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        dist.init_process_group(
            "gloo",
            store=call_wrapper.store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=120),
        )
        outcome = state.sync()
        model, optimizer = state.model, state.optimizer
        assert model is not None and optimizer is not None
        rank, world = dist.get_rank(), dist.get_world_size()
        emit(
            event="sync",
            iteration=call_wrapper.iteration,
            source=outcome.source,
            step=state.step,
            world=world,
            rank=rank,
            digest=digest(model)[0],
            memory=state.memory_bytes(),
            fetched=outcome.fetched_bytes,
            mapped=outcome.mapped_bytes,
        )
        while state.step < args.steps:
            step = state.step + 1
            for fault in [fault for fault in faults if fault[2] == step and call_wrapper.iteration >= fault[3]]:
                faults.remove(fault)
                emit(event="fault", kind=fault[0], step=step)
                if fault[0] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(600)  # a stall: the restart wakes it
            x = global_batch(step)
            slot, slots = data_parallel()
            share = BATCH // slots
            optimizer.zero_grad()
            model(x[slot * share : (slot + 1) * share]).pow(2).mean().backward()
            optimizer.step()
            state.step = step
            if step % args.commit_every == 0:
                state.commit()
                emit(event="commit", step=step, world=world, digest=digest(model)[0], memory=state.memory_bytes())
        while world < args.min_world:  # each commit checks for waiting processes: a replacement's join restarts
            time.sleep(0.5)
            state.commit()
        hashed, full = digest(model)
        if rank == 0:
            torch.save(full, out / "final.pt")
        emit(event="done", step=state.step, world=world, digest=hashed, iteration=call_wrapper.iteration)
        dist.barrier()
        dist.destroy_process_group()

    train()


if __name__ == "__main__":
    main()
