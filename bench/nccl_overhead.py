"""The hooks' cost per NCCL collective on a GPU: rasd's counting against torch alone, in the same process.

One rank, one GPU (NCCL refuses two ranks on one device), an NCCL process group and a small all-reduce issued in a
loop: the CPU time per call is what a training step pays, since an NCCL call only queues work. The arms alternate
in blocks (with, without, without, with, ...) by ``rasd.torch.install()`` / ``uninstall()``; the RAS node runs in
both (it starts with the first ``init_process_group``), so only the counting differs. On a GPU group the hooks
issue the call asynchronously, wait for it as torch does, and queue its ``Work`` until the GPU completes it
(rasd/torch/hooks.py), so this is the cost of that path. Needs a CUDA GPU; prints a table and, last, one JSON line.

    python bench/nccl_overhead.py [--calls 20000] [--blocks 8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="all-reduces per block")
    parser.add_argument("--blocks", type=int, default=8, help="blocks per arm")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    import rasd.torch

    if not torch.cuda.is_available():
        sys.exit("bench/nccl_overhead.py needs a CUDA GPU")
    os.environ.setdefault("TORCHRAS_ADDR", f"127.0.0.1:{free_port()}")
    rasd.torch.install()
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=60))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    tensor = torch.ones(4, device="cuda")
    for _ in range(1000):  # warm-up: NCCL's first calls set up its channels
        dist.all_reduce(tensor)
    torch.cuda.synchronize()

    def block() -> float:
        """CPU seconds per call (wall clock on this otherwise idle thread), the GPU drained before and after."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            dist.all_reduce(tensor)
        issued = time.perf_counter() - start
        torch.cuda.synchronize()
        return issued / args.calls

    samples: dict[str, list[float]] = {"with": [], "without": []}
    order = ["with", "without", "without", "with"] * ((args.blocks + 1) // 2)
    for arm in order[: 2 * args.blocks]:
        if arm == "with":
            rasd.torch.install()
        else:
            rasd.torch.uninstall()
        samples[arm].append(block())
    rasd.torch.install()
    with_us = statistics.median(samples["with"]) * 1e6
    without_us = statistics.median(samples["without"]) * 1e6
    print(
        f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name(0)}; {args.calls} all-reduces of 4 floats per block, {args.blocks} blocks per arm"
    )
    print(f"{'arm':<28} {'us per call (median)':>21}  blocks (us)")
    print(f"{'torch alone':<28} {without_us:>21.2f}  {[round(x * 1e6, 2) for x in samples['without']]}")
    print(f"{'with rasd counting':<28} {with_us:>21.2f}  {[round(x * 1e6, 2) for x in samples['with']]}")
    print(f"hooks' cost per NCCL call: {with_us - without_us:.2f} us")
    dist.destroy_process_group()
    print(
        json.dumps(
            {
                "nccl_call_us_without": round(without_us, 3),
                "nccl_call_us_with": round(with_us, 3),
                "nccl_hook_cost_us": round(with_us - without_us, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
