"""``rasd demo``: a real local training job with the mesh, to see torchras work and to break on purpose.

N processes (default 4) train a small MLP with the gloo backend on the CPU, under ``inprocess.Wrapper``, the way a
user's job trains (``torchras.demo_worker`` has the worker's side: the models, the progress lines, the faults). The
demo runs them under ``rasd launch``, exactly as a user would:

    rasd launch --standalone --nproc-per-node 4 --max-respawns 3 -m torchras.demo_worker --model ddp ...

so a fault is healed as in a user's job: the mesh's verdict restarts the survivors in place within seconds, from the
last in-memory commit; and when a worker died (a kill -9, a hung worker that its monitor process ended, a worker
that left after it resumed), the launcher starts a replacement, which joins the running job at the next commit and
gets the model from the survivors' memory: the world is back to N, with no command typed. ``--max-respawns 0``
keeps the old behaviour (the job goes on smaller). The launcher's event lines (``rasd launch: ...``, on stderr)
tell what happened to the processes; the workers' progress lines (stdout) are shown whole and without the
launcher's ``[default0]:`` prefixes, since each already says which rank or group it is about.

The client port is on: ``rascli -v`` or ``echo verbose status | nc localhost 28028`` from another terminal.

Faults on demand: ``--inject KIND:rank=R,step=S[,seconds=X]`` (repeatable), the kinds in
``torchras.demo_worker.FAULTS``. R is an initial rank: a replacement never makes a fault again.

A fault that no restart heals (the same exception ends ``REPEATS``, 3, restart iterations in a row with no step
completed in between: a missing dependency, a bug, a bad setting) ends the demo instead of looping: every worker's
Wrapper gives up (its default policy, ``inprocess.repeated_faults``), one rank says what the error was, once, and
``rasd launch`` does what it does for any job whose Wrapper gave up: it respawns nothing, says that the job gave up
and why, and its status, the demo's, is 1 (``torchras.launch.workers``).

``--join`` (once needed to bring a replacement in by hand, from a second terminal) is kept for the command lines
that have it: it says that the demo now respawns a dead process by itself, and exits.
"""

from __future__ import annotations

import argparse
import os
import sys

from .demo_worker import FAULTS, MODELS, REPEATS, Injection

#: The module every worker runs (``python -m``).
WORKER = "torchras.demo_worker"
#: What the demo's first line says of each model.
TRAINING = {
    "ddp": "with DistributedDataParallel",
    "fsdp": "with FSDP2 (fully_shard)",
    "manual": "data-parallel, all-reducing the gradients by hand",
}
#: ``rasd demo --join``: what it says now.
JOIN_NOTE = (
    "rasd demo --join: nothing to do: rasd demo runs its workers under rasd launch, which respawns a dead process "
    "by itself; the replacement joins the running job at its next commit (see the demo's 'rasd launch:' lines)"
)

DESCRIPTION = f"""A real local training job with the mesh: N gloo processes on the CPU train a small MLP
with torch's DistributedDataParallel (--model fsdp: FSDP2; --model manual: hand-written
all-reduces) under inprocess.Wrapper, which restarts them in place after a fault, from the
training state kept in memory. They run under rasd launch, which respawns a dead process;
the replacement joins the running job and gets the model from the others' memory. Query it
from another terminal: rascli -v

A fault that restarts cannot heal ends it: when the same exception (its type and the line
that raised it) ends {REPEATS} restart iterations in a row with no step completed in
between, as a missing dependency does, every worker exits with status 1 and one rank prints
the error once."""


def add_parser(subcommands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``rasd demo`` on the ``rasd`` command's parser (``torchras.cli``)."""
    parser = subcommands.add_parser(
        "demo",
        help="a real local torch.distributed training job with the mesh, under rasd launch",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = FAULTS
    parser.add_argument("--nproc", "-n", type=int, default=4, help="number of processes (default 4)")
    parser.add_argument(
        "--model",
        choices=MODELS,
        default="ddp",
        help="how the workers train: ddp (torch's DistributedDataParallel, the default), fsdp (FSDP2, fully_shard "
        "on a CPU device mesh, its state sharded in memory: ShardedState) or manual (the gradients all-reduced by "
        "hand)",
    )
    parser.add_argument("--steps", type=int, default=0, help="training steps (default 0: until Ctrl+C)")
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds per step (default 0.2)")
    parser.add_argument("--print-every", type=int, default=10, help="progress lines every N steps")
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="KIND:rank=R,step=S",
        help="a fault to make: exception, kill, stop, skip or stall (repeatable; below)",
    )
    parser.add_argument(
        "--commit-every",
        type=int,
        default=10,
        help="keep an in-memory copy of the training state every N steps (default 10); a replacement is admitted "
        "at a commit",
    )
    parser.add_argument(
        "--max-respawns",
        type=int,
        default=3,
        help="replacements rasd launch starts per process when it dies (default 3; 0: the job goes on smaller)",
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
        help="no longer needed: the demo respawns a dead process by itself (kept for old command lines; it says so "
        "and exits)",
    )


def worker_arguments(args: argparse.Namespace, injections: list[Injection]) -> list[str]:
    """The command line of ``torchras.demo_worker``."""
    argv = [
        "--model",
        args.model,
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
        argv.append("--no-restart")
    for inj in injections:
        argv += ["--inject", inj.spec()]
    return argv


def launch_arguments(args: argparse.Namespace, injections: list[Injection]) -> list[str]:
    """``rasd launch``'s command line for the demo: one node, a store on a free port, the workers as a module."""
    return [
        "--standalone",
        "--nproc-per-node",
        str(args.nproc),
        "--max-respawns",
        str(args.max_respawns),
        "-m",
        WORKER,
        *worker_arguments(args, injections),
    ]


def main(args: argparse.Namespace) -> int:
    if args.join:
        print(JOIN_NOTE, flush=True)
        return 0
    try:
        injections = [Injection.parse(s) for s in args.inject]
    except ValueError as e:
        print(f"rasd demo: {e}", file=sys.stderr)
        return 2
    if args.nproc < 1:
        print("rasd demo: --nproc must be at least 1", file=sys.stderr)
        return 2
    if args.max_respawns < 0:
        print("rasd demo: --max-respawns must be at least 0", file=sys.stderr)
        return 2
    for inj in injections:
        if not 0 <= inj.rank < args.nproc:
            print(f"rasd demo: --inject rank {inj.rank} is not in 0..{args.nproc - 1}", file=sys.stderr)
            return 2
    # The workers inherit this process's environment through the launcher.
    if args.timeout_factor:
        os.environ["TORCHRAS_TIMEOUT_FACTOR"] = str(args.timeout_factor)
    if args.addr:
        os.environ["TORCHRAS_ADDR"] = args.addr
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # a small MLP: one thread a process (no launcher warning)
    addr = os.environ.get("TORCHRAS_ADDR") or "localhost:28028"
    host, _, port = addr.rpartition(":")
    if args.no_restart:
        how = "without restarts: the first fault ends the job"
    elif args.max_respawns:
        how = (
            "under inprocess.Wrapper: a fault restarts training in place from the last in-memory commit, and a dead "
            "process is respawned and joins the job"
        )
    else:
        how = "under inprocess.Wrapper: a fault restarts training in place from the last in-memory commit"
    print(
        f"rasd demo: {args.nproc} gloo processes train a small MLP {TRAINING[args.model]}, {how}. Their status: "
        f"rascli -v -p {port} (or: echo verbose status | nc {host.strip('[]')} {port}); events: rascli -m -p {port}. "
        "Ctrl+C stops it.",
        flush=True,
    )
    from .launch.main import main as launch

    # The workers' progress lines say which rank or group they are about: shown without torchrun's prefix.
    return launch(launch_arguments(args, injections), line_prefixes=False)
