"""``rasd demo``: a real local training job with the mesh, to see torchras work and to break on purpose.

N processes (default 4) train a small model data-parallel with the gloo backend: each step all-reduces the
gradients on the world group, and every 10 steps each pair of ranks all-reduces a metric on its own group, so the
report has two kinds of communicators. Rank 0 prints a progress line per process group. The client port is on:
``rascli -v`` or ``echo verbose status | nc localhost 28028`` from another terminal.

Faults on demand: ``--inject KIND:rank=R,step=S[,seconds=X]`` (repeatable), KIND one of
    exception   the rank raises (its process dies of it)
    kill        kill -9 of the rank
    stop        SIGSTOP of the rank (a hang; ``kill -CONT`` it to resume)
    skip        the rank skips one gradient all-reduce (its counts fall one behind: MISMATCH)
    stall       the rank sleeps X seconds (default 60) before an all-reduce (COMM_STUCK names it as behind)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

KINDS = ("exception", "kill", "stop", "skip", "stall")


@dataclass(frozen=True)
class Injection:
    kind: str
    rank: int
    step: int
    seconds: float = 60.0

    @classmethod
    def parse(cls, spec: str) -> "Injection":
        kind, _, rest = spec.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}: choose from {', '.join(KINDS)}")
        fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
        try:
            return cls(kind, int(fields.get("rank", 0)), int(fields.get("step", 20)),
                       float(fields.get("seconds", 60.0)))
        except ValueError as e:
            raise ValueError(f"bad fault {spec!r}: {e}") from e

    def spec(self) -> str:
        return f"{self.kind}:rank={self.rank},step={self.step},seconds={self.seconds}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", "-n", type=int, default=4, help="number of processes (default 4)")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default 0: until Ctrl+C)")
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds per step (default 0.2)")
    parser.add_argument("--print-every", type=int, default=10, help="progress lines every N steps")
    parser.add_argument("--inject", action="append", default=[], metavar="KIND:rank=R,step=S",
                        help="a fault to make: exception, kill, stop, skip or stall (repeatable)")
    parser.add_argument("--timeout-factor", type=float, default=0.0, help="scale every mesh timer")
    parser.add_argument("--addr", default="", help="client port address (TORCHRAS_ADDR; default localhost:28028)")


def demo_main(args: argparse.Namespace) -> int:
    try:
        injections = [Injection.parse(s) for s in args.inject]
    except ValueError as e:
        print(f"rasd demo: {e}", file=sys.stderr)
        return 2
    for inj in injections:
        if not 0 <= inj.rank < args.nproc:
            print(f"rasd demo: --inject rank {inj.rank} is not in 0..{args.nproc - 1}", file=sys.stderr)
            return 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
           "WORLD_SIZE": str(args.nproc), "TORCHRAS_SECRET": os.environ.get("TORCHRAS_SECRET") or os.urandom(16).hex(),
           "PYTHONUNBUFFERED": "1"}
    if args.timeout_factor:
        env["TORCHRAS_TIMEOUT_FACTOR"] = str(args.timeout_factor)
    if args.addr:
        env["TORCHRAS_ADDR"] = args.addr
    cmd = [sys.executable, "-m", "rasd.torch.demo", "--steps", str(args.steps), "--step-time", str(args.step_time),
           "--print-every", str(args.print_every)]
    for inj in injections:
        cmd += ["--inject", inj.spec()]
    addr = args.addr or env.get("TORCHRAS_ADDR") or "localhost:28028"
    host, _, port = addr.rpartition(":")
    print(f"rasd demo: {args.nproc} gloo processes train a small MLP data-parallel. Their status: rascli -v -p {port}"
          f" (or: echo verbose status | nc {host.strip('[]')} {port}). Ctrl+C stops it.", flush=True)
    workers = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdin=subprocess.DEVNULL)
               for r in range(args.nproc)]
    try:
        while any(w.poll() is None for w in workers):
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nrasd demo: stopping", flush=True)
    finally:
        for w in workers:
            if w.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    w.send_signal(sig)
        deadline = time.monotonic() + 5
        for w in workers:
            try:
                w.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.kill()
    codes = [w.returncode for w in workers]
    return 0 if all(c in (0, -signal.SIGTERM) for c in codes) else 1


# ----------------------------------------------------------------------------------------------------------------
# One worker


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rasd-demo-worker")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--step-time", type=float, default=0.2)
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--inject", action="append", default=[])
    args = ap.parse_args(argv)
    import datetime
    import logging

    logging.basicConfig(level=os.environ.get("TORCHRAS_LOG_LEVEL", "WARNING"),
                        format=f"[rank {os.environ.get('RANK')}] %(levelname)s %(message)s")
    import torch
    import torch.distributed as dist

    import rasd

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a clean exit: the node says goodbye
    rasd.install()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = [dist.new_group([p, p + 1]) if p + 1 < world else dist.new_group([p]) for p in range(0, world, 2)]
    pair = pairs[rank // 2]
    mine = [Injection.parse(s) for s in args.inject if Injection.parse(s).rank == rank]

    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.nn.Linear(32, 1)
    step = 0
    while args.steps == 0 or step < args.steps:
        step += 1
        started = time.monotonic()
        x = torch.randn(64, 32)
        with torch.no_grad():
            y = target(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        skip = False
        for inj in mine:
            if inj.step == step:
                skip = _inject(inj, rank) or skip
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        if not skip:
            dist.all_reduce(grads)
        grads /= world
        offset = 0
        for p in model.parameters():
            p.grad.copy_(grads[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()
        if step % 10 == 0:
            metric = loss.detach().clone()
            dist.all_reduce(metric, group=pair)
            if rank % 2 == 0 and step % args.print_every == 0:
                members = dist.get_process_group_ranks(pair)
                print(f"step {step:5d}  pair {'-'.join(map(str, members))}: {step // 10} all-reduces, "
                      f"mean loss {metric.item() / len(members):.4f}", flush=True)
        if rank == 0 and step % args.print_every == 0:
            print(f"step {step:5d}  world ({world} ranks): {step} gradient all-reduces, loss {loss.item():.4f}",
                  flush=True)
        time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _inject(inj: Injection, rank: int) -> bool:
    """Make the fault; return True when the rank should skip this step's gradient all-reduce."""
    print(f"rank {rank}: injecting {inj.kind} at step {inj.step}", flush=True)
    if inj.kind == "exception":
        raise RuntimeError(f"injected exception on rank {rank} at step {inj.step}")
    if inj.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if inj.kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if inj.kind == "stall":
        time.sleep(inj.seconds)
    return inj.kind == "skip"


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
