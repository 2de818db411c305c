"""Two gloo ranks that build and drop a DDP job ``ROUNDS`` times: the teardown torch 2.13 can deadlock in.

Each round: a process group on a prefix of one store, a DDP model, a backward pass, an all-reduce of a tensor the
function then drops, ``destroy_process_group()``, and the model dropped, whose reducer holds the group: its
destructor joins gloo's worker threads with the GIL held, while a worker may wait for the GIL to free its last work
(rasd/torch/hooks.py, "Keeping gloo's teardown from deadlocking"). With ``--hooks`` rasd's hooks are installed
(counting only, no RAS node). Each rank prints ``rank R: N rounds`` at the end.

    python teardown_job.py PORT ROUNDS [--hooks]
"""

from __future__ import annotations

import datetime
import faulthandler
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 120  # a rank that is not done by then is deadlocked: its Python stack goes to stderr and it exits


def run(rank: int, port: int, rounds: int, hooks: bool) -> None:
    faulthandler.dump_traceback_later(DEADLINE_S, exit=True)
    if hooks:
        import rasd.torch

        rasd.torch.install(start_mesh=False)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    for round_ in range(rounds):
        dist.init_process_group("gloo", store=dist.PrefixStore(f"round{round_}", store), rank=rank, world_size=2)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
        model(torch.randn(2, 8)).sum().backward()
        agree(round_)
        dist.destroy_process_group()
        del model  # the reducer holds the group: its destructor joins gloo's workers here
    sys.stdout.write(f"rank {rank}: {rounds} rounds\n")  # one write: the two ranks share the pipe
    sys.stdout.flush()


def agree(round_: int) -> float:
    flag = torch.tensor([1.0, float(round_)])
    dist.all_reduce(flag)
    return float(flag[0].item())


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]), int(sys.argv[2]), "--hooks" in sys.argv), nprocs=2)
