"""One worker of ``rasd demo``: a small MLP trained data-parallel under ``inprocess.Wrapper``, faults on demand.

``rasd demo`` (``torchras.demo``) runs N of these under ``rasd launch``, as a user runs a training script:

    rasd launch --standalone --nproc-per-node 4 -m torchras.demo_worker --model ddp --steps 80 ...

Each trains the way a user's job trains (``--model``): torch's ``DistributedDataParallel`` by default, whose C++
reducer all-reduces the gradients during ``backward()``; FSDP2 (``fully_shard`` on a CPU device mesh), which
all-gathers the parameters in the forward and reduce-scatters the gradients in the backward; or ``manual``, one
hand-written ``dist.all_reduce`` of the gradients per step. Every 10 steps each pair of ranks also all-reduces a
metric on a two-rank group of its own, so the report has two kinds of communicators. Rank 0 prints a progress line
for the world, each pair's first rank one for its pair.

Training runs inside ``inprocess.Wrapper`` (``--no-restart``: without it), whose store is on ``MASTER_PORT + 1``
(the launcher's own store is on ``MASTER_PORT``). Its state is committed to memory every ``--commit-every`` steps:
with FSDP2 an ``inprocess.elastic.ShardedState``, the README's pattern for sharded models (each rank keeps its shard
and a copy of its neighbour's; on one machine the neighbour holds the shard itself, sealed in shared memory); with
DDP and the hand-written all-reduces an ``inprocess.elastic.TorchState`` of the whole model and optimizer state (a
``Replica``) and the step. After a fault the mesh's verdict restarts every surviving rank in place, and each builds
its process group, DDP or FSDP2 module and optimizer anew (the old ones hold the destroyed process group) and loads
them from the last commit, resharded to the ranks left. The Wrapper is built without ``joining=``: under ``rasd
launch`` it admits newcomers (``INPROCESS_JOINING``), so the replacement the launcher starts for a dead worker
(``INPROCESS_JOIN=1``) is admitted at the next commit, gets the state by ``state.sync()``, and the world is back to
its size.

Faults on demand: ``--inject KIND:rank=R,step=S[,seconds=X]`` (repeatable), the kinds in ``FAULTS``. R is the
initial rank: a replacement (which has none) never injects, so a fault happens once per demo.

A fault that no restart heals ends the demo instead of looping: the Wrapper's own policy
(``inprocess.repeated_faults``, on by default) gives up when the same exception (its type and the line that raised it)
ends ``REPEATS`` restart iterations in a row with no progress in between (no ``state.step`` above its highest, no new
commit), as a missing dependency does in every iteration: every worker leaves in the same iteration with exit code 1,
and the rank that decided logs the error and its traceback, once.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    import inprocess

KINDS = ("exception", "kill", "stop", "skip", "stall")
#: What each ``--inject`` kind does (``rasd demo --help`` prints it). Every fault happens at the start of step S,
#: where a data loader hands out the batch, before the forward pass.
FAULTS = """faults (--inject KIND:rank=R,step=S[,seconds=X], repeatable), each at the start of step S:
  exception  the rank raises (under the Wrapper every rank restarts; with --no-restart its
             process dies)
  kill       kill -9 of the rank (rasd launch starts a replacement, which joins the job at
             its next commit: the world is back to its size)
  stop       SIGSTOP of the rank (a hang; kill -CONT it to resume)
  skip       the rank skips one gradient collective, as a gradient-accumulation counter off by
             one on that rank would: one step under DDP's no_sync() (fsdp: under
             set_requires_gradient_sync(False); manual: no all-reduce). Its collectives fall out of
             step with the others' (MISMATCH), and once the job wedges, COMM_STUCK
  stall      the rank blocks in one call, time.sleep(X) (default 60 s), before its forward pass,
             as a wedged data loader does; the others wait inside the gradient collective
             (COMM_STUCK names the rank as behind)
"""
#: ``--model``: how the workers train, and what a progress line calls it.
MODELS = {"ddp": "DDP", "fsdp": "FSDP2", "manual": "hand-written all-reduces"}
#: How many restart iterations in a row the same exception may end, with no progress in between, before the demo
#: gives up on it: the Wrapper's default (``inprocess.repeated_faults.DEFAULT_LIMIT``, ``TORCHRAS_REPEATED_FAULTS``).
REPEATS = 3

log = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------------------------------------------
# One worker


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="rasd-demo-worker")
    ap.add_argument("--model", choices=MODELS, default="ddp")
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

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    rasd.install()
    trainer = Trainer(args, own_injections(args.inject, os.environ))
    if args.no_restart:
        return trainer.run_without_restarts()
    return trainer.run_under_the_wrapper()


#: The signal that asked this worker to stop (Ctrl+C, passed on by the launcher; a scheduler's SIGTERM), if one did.
_stop_signal: int | None = None


def _stop(signum: int, frame: object) -> None:
    """A clean exit (the node says goodbye: LEFT, not DEAD): ``SystemExit`` out of the training, now and, should
    the Wrapper take it for the fault of a restart (it reaches a rank blocked in a collective just as the others'
    exits restart it), again at the next step (``_exit_if_stopped``)."""
    global _stop_signal
    _stop_signal = signum
    sys.exit(0)


def _exit_if_stopped() -> None:
    if _stop_signal is not None:
        sys.exit(0)


def own_injections(specs: list[str], environ: Mapping[str, str]) -> list[Injection]:
    """The faults this process makes: those of its initial rank. A replacement that rasd launch started for a dead
    worker (``INPROCESS_JOIN=1``) has no initial rank (-1): the slot's ``RANK`` it inherits is the dead worker's,
    whose faults were made already, so a fault happens once per demo, never again in the replacement."""
    joiner = environ.get("INPROCESS_JOIN", "").strip() == "1"
    initial_rank = -1 if joiner else int(environ["RANK"])
    return [inj for inj in map(Injection.parse, specs) if inj.rank == initial_rank]


def say(line: str) -> None:
    """Write ``line`` and its newline with one ``write`` system call. ``rasd launch`` reads each worker's output
    through a pipe of its own and shows it line by line, whole; under a launcher whose workers share one terminal or
    pipe (torchrun without ``--tee``), ``print`` writes a line's text and its newline apart, and two workers' lines
    interleave mid-line (``...mean loss 0.0526step    40  pair 2-3...``). One write of a line, far below PIPE_BUF
    (4096 bytes), reaches a pipe or a terminal whole."""
    sys.stdout.flush()  # whatever Python still buffers goes first
    data = (line + "\n").encode()
    while data:
        data = data[os.write(sys.stdout.fileno(), data) :]


class Replica:
    """The whole model and optimizer state in host memory: what the ``TorchState`` of the DDP and hand-written
    models commits and restores, and what each restart iteration builds its module and optimizer from.

    Why not the live module: DDP holds the process group of the iteration that built it, which a restart destroys,
    so each iteration wraps a fresh module. The state dicts are torch's own "full" ones
    (``torch.distributed.checkpoint.state_dict``): parameter names without DDP's ``module.`` prefix. (FSDP2's
    state is a ``ShardedState``: a full copy per rank is what FSDP exists to avoid.)
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model: dict[str, Any] = {}
        self.optimizer: dict[str, Any] = {}
        self.capture(model, optimizer)

    def capture(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Take the live state: the dicts hold the live tensors, which ``commit()`` copies at once."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        self.model, self.optimizer = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))

    def load_into(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the state into a freshly built module and optimizer. torch's ``set_state_dict`` may replace
        entries of the dicts it is given: it gets copies of the containers, so that the replica stays whole (the
        tensors themselves are not written)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            model,
            optimizer,
            model_state_dict=_containers_copied(self.model),
            optim_state_dict=_containers_copied(self.optimizer),
            options=StateDictOptions(full_state_dict=True),
        )

    # What ``TorchState`` commits and restores (sync() broadcasts it to the ranks behind).

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model, self.optimizer = state["model"], state["optimizer"]


class Trainer:
    """A small MLP trained data-parallel the way a user's job trains it: ``DistributedDataParallel`` (the default:
    torch's C++ reducer all-reduces the gradients in buckets during ``backward()``), FSDP2 (``fully_shard`` on a
    CPU device mesh: the parameters all-gathered in the forward, the gradients reduce-scattered in the backward),
    or ``manual`` (the gradients all-reduced by hand, one ``dist.all_reduce`` per step). Its state, committed to
    memory every ``--commit-every`` steps: FSDP2's model and optimizer in a ``ShardedState`` (built by
    ``fsdp_module`` in every iteration), the others' in a ``Replica`` inside a ``TorchState``; the step with them.
    Each restart iteration builds its process group, module and optimizer anew and loads them from the last
    commit."""

    def __init__(self, args: argparse.Namespace, injections: list[Injection]) -> None:
        import torch

        from inprocess.elastic import ShardedState, TorchState

        self.args = args
        self.pending = list(injections)  # each fault happens once, even when its step is replayed after a restart
        torch.manual_seed(0)  # the same initial model on every rank
        # Drawn first whatever --model (FSDP2's own is drawn again by fsdp_module, from the same seed), so that the
        # target below, and with it the losses the demo prints, are the same for the three models.
        model = _mlp()
        self.target = torch.nn.Linear(32, 1)
        self.replica: Replica | None = None
        self.state: TorchState | ShardedState
        if args.model == "fsdp":
            self.state = ShardedState(self.fsdp_module, step=0)
        else:
            self.replica = Replica(model, _optimizer(model))
            self.state = TorchState(replica=self.replica, step=0)
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
        from inprocess.elastic import HostRemoved, JoinFailed

        # The Wrapper's store on MASTER_PORT + 1 (the launcher serves its own on MASTER_PORT). No ``joining=``:
        # under rasd launch the Wrapper admits the replacement of a dead worker by itself (INPROCESS_JOINING), as
        # it does for a user's script; with ``rasd demo --max-respawns 0`` (or under torchrun) the world shrinks.
        # A fault that every restart meets ends the training: the Wrapper's default (inprocess.repeated_faults).
        wrapper = inprocess.Wrapper(store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})
        try:
            wrapper(self.train_in_wrapper)()
        except inprocess.rank_assignment.RankDiscarded:
            # A hung rank that resumed after the others went on without it. Not a finished worker: a non-zero exit,
            # so that rasd launch starts a replacement, which joins (a user's script exits 1 too, on the exception).
            say(f"rank {os.environ['RANK']}: left the job (terminated while it was unresponsive)")
            return 1
        except (JoinFailed, HostRemoved) as error:
            say(str(error))  # a replacement that came too late (the job completed) says so, and is not respawned
            return 1 if isinstance(error, JoinFailed) else 0
        except inprocess.exception.RepeatedFault:
            return 1  # every rank gives up in the same iteration; the one that decided has said why, once
        return 0

    def train_in_wrapper(self, call_wrapper: inprocess.CallWrapper | None = None) -> None:
        import datetime

        import torch.distributed as dist

        assert call_wrapper is not None, "the Wrapper passes its CallWrapper to the function it wraps"
        _exit_if_stopped()  # stopped while the Wrapper restarted: leave, do not train on
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
        self.state.sync()  # after a restart: the last commit, on every rank (the model, optimizer and step)
        restart = call_wrapper.last_restart
        if restart is None and call_wrapper.iteration > 0:  # a replacement (INPROCESS_JOIN=1), admitted just now
            say(
                f"joined as rank {dist.get_rank()} of {dist.get_world_size()} at step {self.state.step} (the "
                "state came from the other ranks' memory)"
            )
        if restart is not None and dist.get_rank() == 0:
            cause = restart.reasons[0]  # the verdict; the other reasons are its consequences
            lost = time.time() - self.last_step_done
            say(
                f"restart {restart.count} after {cause}: {dist.get_world_size()} ranks continue from step "
                f"{self.state.step}, {lost:.1f} s lost"
            )
        self.train(call_wrapper)
        dist.barrier()
        dist.destroy_process_group()

    def fsdp_module(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """An FSDP2 module and its optimizer on this iteration's process group: the ``ShardedState``'s build
        function, called by ``state.sync()`` in every iteration, which loads the last commit into them."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)  # the same initial model on every rank: the state of a job's first iteration
        model = _mlp()
        # FSDP2 on the CPU needs a device mesh of type "cpu" over the gloo group; one parameter group (the whole
        # MLP): one all-gather in the forward, one reduce-scatter in the backward.
        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        return model, _optimizer(model)

    def build(self, call_wrapper: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """This iteration's module and optimizer, on its process group, holding the last commit: FSDP2's as
        ``state.sync()`` built and loaded them, the others' loaded from the ``Replica``."""
        from inprocess.elastic import ShardedState

        if isinstance(self.state, ShardedState):
            if call_wrapper is None:  # --no-restart: nothing to restore
                return self.fsdp_module()
            assert self.state.model is not None and self.state.optimizer is not None, "state.sync() builds them"
            return self.state.model, self.state.optimizer
        assert self.replica is not None
        model = _mlp()
        module: torch.nn.Module = model
        if self.args.model == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            module = DistributedDataParallel(model)  # gloo on the CPU: no device_ids
        optimizer = _optimizer(module)
        self.replica.load_into(module, optimizer)
        return module, optimizer

    def train(self, call_wrapper: object) -> None:
        import torch
        import torch.distributed as dist

        args, state = self.args, self.state
        rank, world = dist.get_rank(), dist.get_world_size()
        module, optimizer = self.build(call_wrapper)
        pairs = [dist.new_group([p, p + 1]) if p + 1 < world else dist.new_group([p]) for p in range(0, world, 2)]
        pair = pairs[rank // 2]
        while args.steps == 0 or state.step < args.steps:
            _exit_if_stopped()
            state.step += 1
            step = state.step
            started = time.monotonic()
            skip = self._inject_due(step)  # a stall blocks here, as a wedged data loader would: before the forward
            x = torch.randn(64, 32, generator=self.generator)
            with torch.no_grad():
                y = self.target(x)
            optimizer.zero_grad()
            with _gradient_sync_skipped(module) if skip else contextlib.nullcontext():
                loss = torch.nn.functional.mse_loss(module(x), y)
                loss.backward()  # DDP all-reduces the gradients in here, FSDP2 reduce-scatters them
            if args.model == "manual":
                _all_reduce_gradients(module, world, skip)
            optimizer.step()
            if step % 10 == 0:
                metric = loss.detach().clone()
                dist.all_reduce(metric, group=pair)
                if rank % 2 == 0 and step % args.print_every == 0:
                    members = dist.get_process_group_ranks(pair)
                    mean = metric.item() / len(members)
                    say(f"step {step:5d}  pair {'-'.join(map(str, members))}: mean loss {mean:.4f}")
            if rank == 0 and step % args.print_every == 0:
                say(f"step {step:5d}  world ({world} ranks, {MODELS[args.model]}): loss {loss.item():.4f}")
            if call_wrapper is not None and step % args.commit_every == 0:
                if self.replica is not None:
                    self.replica.capture(module, optimizer)
                state.commit()
            time.sleep(max(0.0, args.step_time - (time.monotonic() - started)))
            self.last_step_done = time.time()

    def _inject_due(self, step: int) -> bool:
        """Make the faults due at ``step`` (once each); True when the rank should skip this step's gradient
        synchronisation."""
        skip = False
        for inj in [inj for inj in self.pending if inj.step == step]:
            self.pending.remove(inj)
            skip = _inject(inj, inj.rank) or skip
        return skip


def _containers_copied(value: Any) -> Any:
    """``value`` with its dicts and lists copied, its tensors and other leaves shared."""
    if isinstance(value, dict):
        return {key: _containers_copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_containers_copied(item) for item in value]
    return value


def _mlp() -> torch.nn.Module:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def _optimizer(module: torch.nn.Module) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(module.parameters(), lr=0.02, momentum=0.9)  # momentum: an optimizer state to restore


@contextlib.contextmanager
def _gradient_sync_skipped(module: torch.nn.Module) -> Iterator[None]:
    """One step whose gradients this rank keeps to itself: the user-shaped way of skipping a collective.

    DDP: ``no_sync()``, as gradient accumulation uses it, entered by one rank alone (an accumulation counter off by
    one on that rank): its reducer leaves out the step's bucket all-reduce, so the rank's all-reduces pair, from
    then on, with the others' of the step before. gloo cannot tell; the job stays wedged at the next pair
    all-reduce, which the rank reaches while its partner waits in the world group's all-reduce: COMM_STUCK.
    FSDP2: ``set_requires_gradient_sync(False)``, its counterpart: the reduce-scatter of the step is left out, and
    the rank's next all-gather meets the others' reduce-scatter. ``manual``: nothing here; the hand-written
    all-reduce is left out (``_all_reduce_gradients``)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        with module.no_sync():
            yield
    elif isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    else:
        yield


def _all_reduce_gradients(module: torch.nn.Module, world: int, skip: bool) -> None:
    """``--model manual``: one hand-written all-reduce of all the gradients, then their mean (``skip``: left out)."""
    import torch
    import torch.distributed as dist

    grads = torch.cat([_gradient(p).flatten() for p in module.parameters()])
    if not skip:
        dist.all_reduce(grads)
    grads /= world
    offset = 0
    for p in module.parameters():
        _gradient(p).copy_(grads[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def _gradient(parameter: torch.nn.Parameter) -> torch.Tensor:
    """The gradient ``backward()`` left in ``parameter`` (every parameter of the model takes part in the loss)."""
    gradient = parameter.grad
    assert gradient is not None, "backward() left no gradient in a parameter of the model"
    return gradient


def _inject(inj: Injection, rank: int) -> bool:
    """Make the fault; return True when the rank should skip this step's gradient synchronisation."""
    say(f"rank {rank}: injecting {inj.kind} at step {inj.step}")
    if inj.kind == "exception":
        raise RuntimeError(f"injected exception on rank {rank} at step {inj.step}")
    if inj.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if inj.kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if inj.kind == "stall":
        # A wedged data loader: one blocking call in C for the whole stall, so the main thread runs no Python
        # bytecode until it returns (no asynchronous exception can land in it meanwhile).
        time.sleep(inj.seconds)
    return inj.kind == "skip"


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
