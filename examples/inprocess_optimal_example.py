"""nvidia-resiliency-ext's ``examples/inprocess/optimal_example.py`` scenario, on torchras's ``inprocess``.

The reference's end-to-end example, retold: the same command line, the same structure, the same faults. A user
of nvidia-resiliency-ext changes one line, the import. Run it on the CPU with gloo::

    torchrun --nproc-per-node 2 examples/inprocess_optimal_example.py --device cpu \\
        --total-iterations 200 --fault-prob 0.01 --chkpt-interval 10 --path /tmp/example --nested-restarter

The "optimal" use of the Wrapper: only what depends on the process group is restarted. The store the
application builds its process groups on, the model and the optimizer are created once in ``main()`` and
reused by every restart iteration; the wrapped ``train()`` builds a process group on a ``PrefixStore`` named
after the restart iteration, resumes from the last checkpoint, and raises ``RuntimeError`` at random
(``--fault-prob`` per step and rank): the fault injector of the reference's example. Every rank restarts
in-process after a fault; rank 0 logs ``restart latency`` and, with ``--nested-restarter``, the lines an outer
restarter reads (``[NestedRestarter] name=[InProcess] state=... stage=...``).

Ports: torchrun's store listens on ``MASTER_PORT``, the Wrapper's store on ``MASTER_PORT + 1``, the
application's store on ``MASTER_PORT + 2``.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import pathlib
import random
import time

os.environ["TORCH_CPP_LOG_LEVEL"] = "error"
import torch

import inprocess  # the one line that differs: was ``import nvidia_resiliency_ext.inprocess as inprocess``

# When the last fault was raised on this rank (perf_counter), to log how long the restart took.
fault_raised_at: list[float] = []


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="In-process restart, optimal usage", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--size", default=64, type=int, help="hidden size of the model")
    parser.add_argument("--layers", default=4, type=int, help="number of linear layers")
    parser.add_argument("--log-interval", default=100, type=int, help="steps between loss lines")
    parser.add_argument("--chkpt-interval", default=100, type=int, help="steps between checkpoints")
    parser.add_argument("--total-iterations", default=1000000, type=int, help="training steps")
    parser.add_argument("--seed", default=None, type=int, help="random seed (time-based if not given)")
    parser.add_argument("--path", default="/tmp/", type=str, help="folder of the checkpoint file")
    parser.add_argument("--fault-prob", default=0.001, type=float, help="probability of a fault per step")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="device")
    parser.add_argument(
        "--log-level", type=lambda name: logging._nameToLevel[name.upper()], default=logging.INFO, help="logging level"
    )
    parser.add_argument("--nested-restarter", action="store_true", help="log for an outer (nested) restarter")
    return parser.parse_args()


def train(
    base_store: torch.distributed.Store,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    backend: str,
    device: torch.device,
    timeout: datetime.timedelta,
    args: argparse.Namespace,
    call_wrapper: inprocess.CallWrapper | None = None,
) -> None:
    if fault_raised_at:
        logging.info(f"restart latency: {time.perf_counter() - fault_raised_at.pop():.3f}s")
    assert call_wrapper is not None  # the Wrapper passes it (the parameter is annotated with CallWrapper)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    # One namespace of the long-lived store per restart iteration: a new process group never meets the keys
    # of the one that was torn down.
    store = torch.distributed.PrefixStore(str(call_wrapper.iteration), base_store)
    torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    model_ddp = torch.nn.parallel.DistributedDataParallel(model)

    # Every restart iteration resumes from the last checkpoint.
    first_step = 0
    checkpoint_path = pathlib.Path(args.path) / "checkpoint.pt"
    if checkpoint_path.exists():
        checkpoint = torch.load(checkpoint_path)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
        torch.set_rng_state(checkpoint["rng"])
        first_step = checkpoint["iteration"]
    random.seed(time.perf_counter_ns() if args.seed is None else args.seed + first_step * world_size + rank)

    for step in range(first_step, args.total_iterations):
        if step % args.chkpt_interval == args.chkpt_interval - 1:
            torch.distributed.barrier()
            if rank == 0:
                checkpoint = dict(
                    model=model.state_dict(), opt=opt.state_dict(), rng=torch.get_rng_state(), iteration=step
                )
                with call_wrapper.atomic():  # a restart never cuts a checkpoint in half
                    torch.save(checkpoint, checkpoint_path)

        if random.random() < args.fault_prob:  # the fault injector
            fault_raised_at.append(time.perf_counter())
            raise RuntimeError(f"example fault at iteration={step} from rank={rank}")

        model.zero_grad()
        loss = model_ddp(torch.rand(args.size, args.size).to(device)).square().mean()
        loss.backward()
        opt.step()
        if rank == 0 and step % args.log_interval == args.log_interval - 1:
            logging.info(f"rank={rank} iteration={step} loss={loss.item()}")


def main() -> None:
    args = parse_args()
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=args.log_level)
    logging.info(f"{args}")

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend, timeout = torch.device("cuda"), "nccl", datetime.timedelta(seconds=150)
    else:
        device, backend, timeout = torch.device("cpu"), "gloo", datetime.timedelta(seconds=10)

    # Created once, reused by every restart iteration: nothing here depends on a process group.
    if args.seed is not None:
        torch.manual_seed(args.seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.size, args.size) for _ in range(args.layers)]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    store = torch.distributed.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]) + 2,
        world_size=int(os.environ["WORLD_SIZE"]),
        is_master=int(os.environ["RANK"]) == 0,
        multi_tenant=True,
        wait_for_workers=True,
        use_libuv=True,
    )

    wrapper_kwargs: dict = dict(
        store_kwargs={"port": int(os.getenv("MASTER_PORT", 29500)) + 1},
        health_check=inprocess.health_check.CudaHealthCheck(),
    )
    if args.nested_restarter:
        wrapper_kwargs.update(
            initialize=inprocess.nested_restarter.NestedRestarterHandlingCompleted(),
            abort=inprocess.Compose(
                inprocess.abort.AbortTorchDistributed(), inprocess.nested_restarter.NestedRestarterHandlingStarting()
            ),
            completion=inprocess.nested_restarter.NestedRestarterFinalized(),
            terminate=inprocess.nested_restarter.NestedRestarterAborted(),
        )
    # The CallWrapper is injected into ``call_wrapper``; ``train`` restarts in-process after every fault.
    inprocess.Wrapper(**wrapper_kwargs)(train)(store, model, opt, backend, device, timeout, args)


if __name__ == "__main__":
    main()
