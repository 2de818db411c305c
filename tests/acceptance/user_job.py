"""A user's training script, as a user writes it from the README: torch's own DDP or FSDP2 on gloo, the training
function wrapped in ``inprocess.Wrapper``, launched by plain ``torchrun``. Nothing in it is shaped around torchras.

    torchrun --nproc-per-node 4 user_job.py --model ddp --steps 40 --out DIR [--block sleep --block-rank 2 ...]

``--checkpoint-step S --checkpoint-seconds N`` makes rank 0 write a checkpoint at step S for N seconds
(``torch.save`` of its state, again and again, to local disk) while the other ranks wait in ``dist.barrier()``: the
most common checkpoint code there is, a healthy slow phase that must never be taken for a stuck rank.

``--evaluate-step S --evaluate-seconds N`` makes every rank gather the full weights at step S (torch's
``get_model_state_dict``, full and on rank 0's CPU), rank 0 evaluate an unsharded copy for N seconds (forward passes
under ``torch.no_grad``) and the others wait in ``dist.barrier()``: an evaluation on one rank, the other healthy slow
phase.

``--block KIND`` makes one rank stop in one long blocking call before its forward pass at ``--block-step`` (a
wedged data loader): ``sleep`` (time.sleep), ``queue`` (queue.Queue.get on a queue nobody fills) or ``recv``
(a socket read from a peer that never writes). It blocks once: after the restart that the mesh's COMM_STUCK verdict
causes, the rank trains on.

Every 10 steps the ranks average the loss for the log with a functional collective (``funcol.all_reduce``, what
DTensor and compiled code issue): torch runs it beneath ``torch.distributed``'s Python functions.

Each rank writes ``DIR/rank<R>.json`` when training is done: steps trained, world size, restart iteration,
and what torch's records say the job performed on the world group (its sequence number and its Flight Recorder
entries by name), then waits for ``DIR/release`` (the test reads the report meanwhile) and exits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import socket
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=FutureWarning)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as funcol  # noqa: E402

import inprocess  # noqa: E402

blocked_once: list[bool] = []
checkpointed: list[bool] = []
evaluated: list[bool] = []


def block(kind: str) -> None:
    """One long blocking call, as a data loader that wedged."""
    print(f"rank {os.environ['RANK']}: blocking in {kind}", flush=True)
    if kind == "sleep":
        time.sleep(600)
    elif kind == "queue":
        queue.Queue().get()
    elif kind == "recv":
        left, right = socket.socketpair()
        try:
            left.recv(1)
        finally:
            left.close()
            right.close()


def checkpoint(model: torch.nn.Module, seconds: float, out: Path) -> None:
    """Rank 0's checkpoint: real serialisation and disk writes for ``seconds`` (a large model's state takes that)."""
    print(f"rank {os.environ['RANK']}: checkpointing for {seconds:g} s", flush=True)
    payload = {"model": model.state_dict(), "extra": torch.randn(2_000_000)}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.save(payload, out / "checkpoint.pt")
    print(f"rank {os.environ['RANK']}: checkpoint written", flush=True)


def evaluate(model: torch.nn.Module, seconds: float) -> None:
    """Rank 0 evaluates an unsharded copy of the weights for ``seconds``; every rank takes part in the gathering."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if int(os.environ["RANK"]) != 0:
        return
    print(f"rank 0: evaluating for {seconds:g} s", flush=True)
    copy = layers()
    copy.load_state_dict(full)
    batches = 0
    end = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < end:
            copy(torch.randn(256, 32)).argmax(dim=1)
            batches += 1
    print(f"rank 0: evaluation done ({batches} batches)", flush=True)


def layers() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)
    )


def build(model_kind: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = layers()
    if model_kind == "ddp":
        wrapped: torch.nn.Module = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    return wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.01)


def train(args: argparse.Namespace, progress: dict, call_wrapper: inprocess.CallWrapper | None = None) -> None:
    assert call_wrapper is not None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 2, world, is_master=False, use_libuv=True
    )
    store = dist.PrefixStore(f"iteration{call_wrapper.iteration}", store)
    created_ns = time.time_ns()  # this iteration's groups: the Flight Recorder also holds the destroyed ones
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    model, opt = build(args.model)
    # Every rank resumes from the step the slowest one completed (the in-memory state of a user's job).
    start = torch.tensor([progress["step"]])
    dist.all_reduce(start, op=dist.ReduceOp.MIN)
    step = int(start.item())
    while step < args.steps:
        if args.block and rank == args.block_rank and step == args.block_step and not blocked_once:
            blocked_once.append(True)
            block(args.block)
        loss = model(torch.randn(16, 32)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        step += 1
        progress["step"] = step
        if step == args.checkpoint_step and not checkpointed:
            checkpointed.append(True)
            if rank == 0:
                checkpoint(model, args.checkpoint_seconds, Path(args.out))
            dist.barrier()  # the others wait for rank 0's checkpoint
        if step == args.evaluate_step and not evaluated:
            evaluated.append(True)
            evaluate(model, args.evaluate_seconds)
            dist.barrier()  # the others wait for rank 0's evaluation
        if step % 10 == 0:  # the mean loss for the log, with a functional collective (as DTensor code issues them)
            total = funcol.all_reduce(loss.detach(), "sum", dist.group.WORLD)
            if rank == 0:
                print(f"step {step} loss {float(funcol.wait_tensor(total)) / world:.4f}", flush=True)
            else:
                funcol.wait_tensor(total)
        time.sleep(args.step_time)
    world_pg = dist.group.WORLD
    assert world_pg is not None
    seq = world_pg._get_sequence_number_for_group()
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace_json")  # noqa: B009
    entries = json.loads(dump(includeCollectives=True, onlyActive=False))["entries"]
    names: dict[str, int] = {}
    for e in entries:
        if e["process_group"][0] == world_pg.group_name and e["time_created_ns"] >= created_ns:
            names[e["profiling_name"]] = names.get(e["profiling_name"], 0) + 1
    out = Path(args.out)
    result = {"rank": rank, "steps": step, "world": dist.get_world_size(), "iteration": call_wrapper.iteration}
    result.update(seq=seq, fr_names=names, pid=os.getpid())
    written = out / f"rank{rank}.json.tmp"
    written.write_text(json.dumps(result))
    written.replace(out / f"rank{rank}.json")  # whole: a test reads it as soon as it appears
    while not (out / "release").exists():
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-time", type=float, default=0.05)
    ap.add_argument("--block", choices=("sleep", "queue", "recv"), default=None)
    ap.add_argument("--block-rank", type=int, default=2)
    ap.add_argument("--block-step", type=int, default=15)
    ap.add_argument("--checkpoint-step", type=int, default=0)
    ap.add_argument("--checkpoint-seconds", type=float, default=0.0)
    ap.add_argument("--evaluate-step", type=int, default=0)
    ap.add_argument("--evaluate-seconds", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The application's store, outside the wrapped function (as in nvidia-resiliency-ext's examples).
    app_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 2, world, is_master=rank == 0, use_libuv=True
    )
    progress = {"step": 0}
    wrapper = inprocess.Wrapper(store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})
    wrapper(train)(args, progress)
    del app_store


if __name__ == "__main__":
    main()
