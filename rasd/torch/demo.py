"""``rasd demo``: a real local training job with the mesh, to see torchras work and to break on purpose.

N processes (default 4) train a small model data-parallel with the gloo backend: each step all-reduces the
gradients on the world group, and every 10 steps each pair of ranks all-reduces a metric on its own group, so the
report has two kinds of communicators. Rank 0 prints a progress line per process group. The client port is on:
``rascli -v`` or ``echo verbose status | nc localhost 28028`` from another terminal.

Training runs inside ``inprocess.Wrapper`` (``--no-restart``: without it). Its state (model, optimizer, step) is an
``inprocess.elastic.TorchState`` committed to memory every ``--commit-every`` steps; after a fault the mesh's
verdict restarts every surviving rank in place, and training resumes from the last commit, on the ranks left.

More capacity, or a replacement after a kill: ``rasd demo --join`` from another terminal starts one more process
into the running demo (``inprocess.elastic.Joining``, docs/elastic.md section 5). It waits until the next commit,
which starts a rendezvous round that admits it; it gets the state by ``state.sync()`` and the world grows (up to
``--nproc``).

Faults on demand: ``--inject KIND:rank=R,step=S[,seconds=X]`` (repeatable), KIND one of
    exception   the rank raises (under the Wrapper every rank restarts; with --no-restart its process dies)
    kill        kill -9 of the rank
    stop        SIGSTOP of the rank (a hang; ``kill -CONT`` it to resume)
    skip        the rank skips one gradient all-reduce (its counts fall one behind: MISMATCH)
    stall       the rank sleeps X seconds (default 60) before an all-reduce (COMM_STUCK names it as behind)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    import inprocess

KINDS = ("exception", "kill", "stop", "skip", "stall")


@dataclass(frozen=True)
class Injection:
    kind: str
    rank: int
    step: int
    seconds: float = 60.0

    @classmethod
    def parse(cls, spec: str) -> Injection:
        kind, _, rest = spec.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}: choose from {', '.join(KINDS)}")
        fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
        try:
            return cls(
                kind, int(fields.get("rank", 0)), int(fields.get("step", 20)), float(fields.get("seconds", 60.0))
            )
        except ValueError as e:
            raise ValueError(f"bad fault {spec!r}: {e}") from e

    def spec(self) -> str:
        return f"{self.kind}:rank={self.rank},step={self.step},seconds={self.seconds}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", "-n", type=int, default=4, help="number of processes (default 4)")
    parser.add_argument("--steps", type=int, default=0, help="training steps (default 0: until Ctrl+C)")
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds per step (default 0.2)")
    parser.add_argument("--print-every", type=int, default=10, help="progress lines every N steps")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="KIND:rank=R,step=S",
        help="a fault to make: exception, kill, stop, skip or stall (repeatable)",
    )
    parser.add_argument(
        "--commit-every",
        type=int,
        default=10,
        help="keep an in-memory copy of the training state every N steps (default 10)",
    )
    parser.add_argument(
        "--no-restart",
        action="store_true",
        help="train without inprocess.Wrapper: the first fault ends the job (the old behaviour)",
    )
    parser.add_argument("--timeout-factor", type=float, default=0.0, help="scale every mesh timer")
    parser.add_argument("--addr", default="", help="client port address (TORCHRAS_ADDR; default localhost:28028)")
    parser.add_argument(
        "--join",
        action="store_true",
        help="start one more process into the demo running on --addr (a replacement, or capacity)",
    )


def join_file(addr: str) -> Path:
    """Where a running demo leaves what ``rasd demo --join`` needs: its workers' environment and command."""
    port = (addr or os.environ.get("TORCHRAS_ADDR") or "localhost:28028").rpartition(":")[2]
    return Path(tempfile.gettempdir()) / f"rasd-demo-{os.getuid()}-{port}.json"


def demo_main(args: argparse.Namespace) -> int:
    if args.join:
        return join_main(args)
    try:
        injections = [Injection.parse(s) for s in args.inject]
    except ValueError as e:
        print(f"rasd demo: {e}", file=sys.stderr)
        return 2
    for inj in injections:
        if not 0 <= inj.rank < args.nproc:
            print(f"rasd demo: --inject rank {inj.rank} is not in 0..{args.nproc - 1}", file=sys.stderr)
            return 2
    master_port, wrapper_port = _free_ports(2)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "RASD_DEMO_WRAPPER_PORT": str(wrapper_port),
        "WORLD_SIZE": str(args.nproc),
        "TORCHRAS_SECRET": os.environ.get("TORCHRAS_SECRET") or os.urandom(16).hex(),
        "PYTHONUNBUFFERED": "1",
    }
    if args.timeout_factor:
        env["TORCHRAS_TIMEOUT_FACTOR"] = str(args.timeout_factor)
    if args.addr:
        env["TORCHRAS_ADDR"] = args.addr
    cmd = [
        sys.executable,
        "-m",
        "rasd.torch.demo",
        "--steps",
        str(args.steps),
        "--step-time",
        str(args.step_time),
        "--print-every",
        str(args.print_every),
        "--commit-every",
        str(args.commit_every),
    ]
    if args.no_restart:
        cmd.append("--no-restart")
    for inj in injections:
        cmd += ["--inject", inj.spec()]
    addr = args.addr or env.get("TORCHRAS_ADDR") or "localhost:28028"
    host, _, port = addr.rpartition(":")
    how = (
        "without restarts: the first fault ends the job"
        if args.no_restart
        else "under inprocess.Wrapper: a fault restarts training in place from the last in-memory commit"
    )
    print(
        f"rasd demo: {args.nproc} gloo processes train a small MLP data-parallel, {how}. Their status: rascli -v "
        f"-p {port} (or: echo verbose status | nc {host.strip('[]')} {port}); events: rascli -m -p {port}. "
        "Ctrl+C stops it.",
        flush=True,
    )
    # A scheduler (or `timeout`) stops the demo with SIGTERM: end the workers as Ctrl+C does, never orphan them.
    signal.signal(signal.SIGTERM, _interrupt)
    workers = [
        subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdin=subprocess.DEVNULL)
        for r in range(args.nproc)
    ]
    joining = join_file(args.addr)
    if not args.no_restart:
        joining.write_text(json.dumps({"pid": os.getpid(), "env": env, "cmd": cmd}))
        joining.chmod(0o600)  # it holds the job's secret
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
        if not args.no_restart:
            joining.unlink(missing_ok=True)
    codes = [w.returncode for w in workers]
    faulted = {inj.rank for inj in injections if inj.kind in ("exception", "kill", "stop")}
    survivors_fine = all(c in (0, -signal.SIGTERM) for r, c in enumerate(codes) if r not in faulted)
    return 0 if survivors_fine and any(c in (0, -signal.SIGTERM) for c in codes) else 1


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def join_main(args: argparse.Namespace) -> int:
    """``rasd demo --join``: one more worker into the running demo; it ends when it or the demo ends."""
    path = join_file(args.addr)
    try:
        running = json.loads(path.read_text())
        os.kill(int(running["pid"]), 0)
    except (OSError, ValueError, KeyError):
        print(f"rasd demo --join: no running demo found ({path}); start one with: rasd demo", file=sys.stderr)
        return 2
    env = {key: value for key, value in running["env"].items() if key not in ("RANK", "LOCAL_RANK")}
    print(
        f"rasd demo --join: one more process joins the demo (pid {running['pid']}); it waits for the next "
        "commit, where a rendezvous round admits it and state.sync() gives it the model",
        flush=True,
    )
    signal.signal(signal.SIGTERM, _interrupt)
    worker = subprocess.Popen(running["cmd"], env={**env, "INPROCESS_JOIN": "1"}, stdin=subprocess.DEVNULL)
    try:
        while worker.poll() is None:
            try:
                os.kill(int(running["pid"]), 0)
            except OSError:  # the demo ended (Ctrl+C): this process goes with it
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("\nrasd demo --join: stopping", flush=True)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(5)
            except subprocess.TimeoutExpired:
                worker.kill()
    return 0 if worker.returncode in (0, -signal.SIGTERM) else 1


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# ----------------------------------------------------------------------------------------------------------------
# One worker


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rasd-demo-worker")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--step-time", type=float, default=0.2)
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--commit-every", type=int, default=10)
    ap.add_argument("--inject", action="append", default=[])
    ap.add_argument("--no-restart", action="store_true")
    args = ap.parse_args(argv)
    import logging

    level = os.environ.get("TORCHRAS_LOG_LEVEL")
    logging.basicConfig(level=level or "WARNING", format=f"[rank {os.environ.get('RANK')}] %(levelname)s %(message)s")
    if level is None:  # the progress lines tell the story; TORCHRAS_LOG_LEVEL=INFO shows the verdicts and restarts
        for name in ("rasd", "inprocess"):
            logging.getLogger(name).setLevel(logging.ERROR)
    import rasd

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a clean exit: the node says goodbye
    rasd.install()
    joiner = os.environ.get("INPROCESS_JOIN") == "1"  # started by ``rasd demo --join``: no initial rank
    initial_rank = -1 if joiner else int(os.environ["RANK"])
    trainer = Trainer(args, [Injection.parse(s) for s in args.inject if Injection.parse(s).rank == initial_rank])
    if args.no_restart:
        return trainer.run_without_restarts()
    return trainer.run_under_the_wrapper()


class Trainer:
    """A small MLP trained data-parallel. Its state (model, optimizer, step) lives in an ``inprocess.elastic``
    ``TorchState`` committed to memory every ``--commit-every`` steps, so a restart resumes from the last commit."""

    def __init__(self, args: argparse.Namespace, injections: list[Injection]) -> None:
        import torch

        from inprocess.elastic import TorchState

        self.args = args
        self.pending = list(injections)  # each fault happens once, even when its step is replayed after a restart
        torch.manual_seed(0)  # the same initial model on every rank
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.target = torch.nn.Linear(32, 1)
        self.state = TorchState(self.model, self.optimizer, step=0)
        self.generator = torch.Generator().manual_seed(1000 + int(os.environ.get("RANK", os.getpid())))
        self.last_step_done = time.time()  # wall clock: what a restart cost is the gap in training it left

    def run_without_restarts(self) -> int:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        self.train(None)
        dist.barrier()
        dist.destroy_process_group()
        return 0

    def run_under_the_wrapper(self) -> int:
        import inprocess
        from inprocess.elastic import HostRemoved, JoinFailed, Joining

        wrapper = inprocess.Wrapper(
            store_kwargs={"port": int(os.environ["RASD_DEMO_WRAPPER_PORT"])},
            # Processes may join (rasd demo --join) up to the initial size; a round below it waits 1 s for more.
            joining=Joining(max_nodes=int(os.environ["WORLD_SIZE"]), last_call=1.0, check_every=1),
        )
        try:
            wrapper(self.train_in_wrapper)()
        except inprocess.rank_assignment.RankDiscarded:
            print(f"rank {os.environ['RANK']}: left the job (terminated while it was unresponsive)", flush=True)
        except (JoinFailed, HostRemoved) as error:
            print(f"rasd demo: {error}", flush=True)
            return 1 if isinstance(error, JoinFailed) else 0
        return 0

    def train_in_wrapper(self, call_wrapper: inprocess.CallWrapper | None = None) -> None:
        import datetime

        import torch.distributed as dist

        assert call_wrapper is not None, "the Wrapper passes its CallWrapper to the function it wraps"
        dist.init_process_group(
            "gloo",
            store=call_wrapper.store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=600),
        )
        # No try/finally around the training: after a fault the Wrapper's abort destroys the groups, and a rank
        # that destroyed its own on the way out would break its peers' collectives first, so that their errors,
        # not its own, would be recorded as the cause.
        self.state.sync()
        restart = call_wrapper.last_restart
        if restart is None and call_wrapper.iteration > 0:  # started by rasd demo --join, admitted just now
            print(
                f"joined as rank {dist.get_rank()} of {dist.get_world_size()} at step {self.state.step} (the "
                "state came from the other ranks' memory)",
                flush=True,
            )
        if restart is not None and dist.get_rank() == 0:
            cause = restart.reasons[0]  # the verdict; the other reasons are its consequences
            lost = time.time() - self.last_step_done
            print(
                f"restart {restart.count} after {cause}: {dist.get_world_size()} ranks continue from step "
                f"{self.state.step}, {lost:.1f} s lost",
                flush=True,
            )
        self.train(call_wrapper)
        dist.barrier()
        dist.destroy_process_group()

    def train(self, call_wrapper: object) -> None:
        import torch
        import torch.distributed as dist

        args, state = self.args, self.state
        rank, world = dist.get_rank(), dist.get_world_size()
        pairs = [dist.new_group([p, p + 1]) if p + 1 < world else dist.new_group([p]) for p in range(0, world, 2)]
        pair = pairs[rank // 2]
        while args.steps == 0 or state.step < args.steps:
            state.step += 1
            step = state.step
            started = time.monotonic()
            x = torch.randn(64, 32, generator=self.generator)
            with torch.no_grad():
                y = self.target(x)
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.optimizer.zero_grad()
            loss.backward()
            skip = self._inject_due(step)
            grads = torch.cat([_gradient(p).flatten() for p in self.model.parameters()])
            if not skip:
                dist.all_reduce(grads)
            grads /= world
            offset = 0
            for p in self.model.parameters():
                _gradient(p).copy_(grads[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            self.optimizer.step()
            if step % 10 == 0:
                metric = loss.detach().clone()
                dist.all_reduce(metric, group=pair)
                if rank % 2 == 0 and step % args.print_every == 0:
                    members = dist.get_process_group_ranks(pair)
                    print(
                        f"step {step:5d}  pair {'-'.join(map(str, members))}: {step // 10} all-reduces, "
                        f"mean loss {metric.item() / len(members):.4f}",
                        flush=True,
                    )
            if rank == 0 and step % args.print_every == 0:
                print(
                    f"step {step:5d}  world ({world} ranks): {step} gradient all-reduces, loss {loss.item():.4f}",
                    flush=True,
                )
            if call_wrapper is not None and step % args.commit_every == 0:
                state.commit()
            time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
            self.last_step_done = time.time()

    def _inject_due(self, step: int) -> bool:
        """Make the faults due at ``step`` (once each); True when the rank should skip this step's all-reduce."""
        skip = False
        for inj in [inj for inj in self.pending if inj.step == step]:
            self.pending.remove(inj)
            skip = _inject(inj, inj.rank) or skip
        return skip


def _gradient(parameter: torch.nn.Parameter) -> torch.Tensor:
    """The gradient ``backward()`` left in ``parameter`` (every parameter of the model takes part in the loss)."""
    gradient = parameter.grad
    assert gradient is not None, "backward() left no gradient in a parameter of the model"
    return gradient


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
        # A slow rank, not a frozen interpreter: short sleeps, so a restart can reach it between two of them.
        deadline = time.monotonic() + inj.seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return inj.kind == "skip"


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
