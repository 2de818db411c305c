"""One process of the NCCL checks in tests/gpu/test_nccl.py: the backend path of a GPU machine, end to end.

Usage: ``python nccl_job.py counters|ddp|restart OUT.json``; MASTER_ADDR,
MASTER_PORT and TORCHRAS_ADDR come from the environment. One rank on one GPU: NCCL refuses two ranks on one
device, and the machines that check this have one.

``counters``: ``rasd.install()``, an NCCL process group, synchronous and asynchronous all-reduces and a barrier on
CUDA tensors; then our STATUS (text and JSON) from TORCHRAS_ADDR, and NCCL's own RAS report from the address rasd
moved it to (``NCCL_RAS_ADDR``), when this NCCL build has RAS. Writes what it saw to OUT.json.

``restart``: ``inprocess.Wrapper`` around a function that makes an NCCL group and raises in its first iteration;
the Wrapper aborts the NCCL communicator, runs its CUDA health check and restarts; the second iteration finishes.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time

MODE, OUT = sys.argv[1], sys.argv[2]
SYNC_ALL_REDUCES, ASYNC_ALL_REDUCES = 7, 5


def ask(address: str, command: bytes, timeout: float = 30.0) -> str:
    """The reply to ``command`` after the protocol-2 handshake, read until the server closes."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]") or "localhost", int(port)), 5) as s:
        s.settimeout(timeout)
        s.sendall(b"CLIENT PROTOCOL 2\n")
        greeting = s.recv(64)
        s.sendall(command)
        chunks = [greeting]
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def counters() -> None:
    import torch
    import torch.distributed as dist

    import rasd
    from rasd.core.comms import OP_TYPES

    hooks = rasd.install()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, True, timeout=datetime.timedelta(seconds=60)
    )
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    tensor = torch.ones(1 << 20, device="cuda")
    for _ in range(SYNC_ALL_REDUCES):
        dist.all_reduce(tensor)
    works = [dist.all_reduce(tensor, async_op=True) for _ in range(ASYNC_ALL_REDUCES)]
    for work in works:
        work.wait()
    dist.barrier()
    torch.cuda.synchronize()
    # An all-reduce queued behind about a second of GPU work: it returns at once, and is not completed until the
    # GPU gets to it.
    all_reduce = OP_TYPES.index("AllReduce")
    world = next(c for c in hooks.registry.comms() if c.size == 1)
    torch.cuda._sleep(2_000_000_000)
    dist.all_reduce(tensor)
    returned = time.monotonic()
    record = next(r for c in hooks.snapshot().comms for r in c.ranks if c.comm_hash == world.comm_hash)
    gpu_busy = [record.launched[all_reduce], record.completed[all_reduce], time.monotonic() - returned]
    torch.cuda.synchronize()
    record = next(r for c in hooks.snapshot().comms for r in c.ranks if c.comm_hash == world.comm_hash)
    gpu_done = [record.launched[all_reduce], record.completed[all_reduce], time.monotonic() - returned]
    counted = {
        hex(comm.comm_hash): {"launched": list(comm.launched), "completed": list(comm.completed), "device": comm.device}
        for comm in hooks.registry.comms()
    }
    ours = ask(os.environ["TORCHRAS_ADDR"], b"VERBOSE STATUS\n")
    ours_json = ask(os.environ["TORCHRAS_ADDR"], b"SET FORMAT json\nSTATUS\n")
    nccl_address = os.environ.get("NCCL_RAS_ADDR", "")
    try:
        theirs = ask(nccl_address, b"VERBOSE STATUS\n") if nccl_address else ""
    except OSError as error:  # an NCCL build without RAS, or RAS off
        theirs = f"unreachable: {error}"
    result = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": torch.cuda.get_device_name(0),
        "counted": counted,
        "gpu_busy": gpu_busy,
        "gpu_done": gpu_done,
        "ours": ours,
        "ours_json": ours_json,
        "torchras_addr": os.environ["TORCHRAS_ADDR"],
        "nccl_ras_addr": nccl_address,
        "theirs": theirs,
    }
    dist.destroy_process_group()
    with open(OUT, "w") as f:
        json.dump(result, f)


def ddp() -> None:
    """DDP on NCCL: its buckets are issued by torch's C++ reducer, counted from the group's sequence number and the
    Flight Recorder's NCCL states (``completed`` once the watchdog saw the GPU work finish)."""
    import torch
    import torch.distributed as dist

    import rasd

    hooks = rasd.install()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, True, timeout=datetime.timedelta(seconds=60)
    )
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256).cuda(), bucket_cap_mb=0.1)
    steps = 10
    for _ in range(steps):
        model(torch.randn(32, 256, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    world = dist.group.WORLD
    seq = world._get_sequence_number_for_group()
    records = []
    for _ in range(40):  # the watchdog marks entries completed within its poll interval; quiet reads follow
        time.sleep(0.5)
        (comm,) = [c for c in hooks.snapshot().comms if c.size == 1]
        records.append({"launched": list(comm.ranks[0].launched), "completed": list(comm.ranks[0].completed)})
        if records[-1]["launched"] == records[-1]["completed"] and sum(records[-1]["launched"]) == seq:
            break
    result = {"seq": seq, "steps": steps, "records": records, "counting": hooks.records.describe()}
    dist.destroy_process_group()
    with open(OUT, "w") as f:
        json.dump(result, f)


def restart() -> None:
    import torch
    import torch.distributed as dist

    import inprocess

    iterations: list[dict] = []
    seconds = datetime.timedelta(seconds=0.1)

    @inprocess.Wrapper(
        last_call_wait=seconds,
        monitor_thread_interval=seconds,
        monitor_process_interval=seconds,
        progress_watchdog_interval=seconds,
        health_check=inprocess.health_check.CudaHealthCheck(),
    )
    def train(call_wrapper: inprocess.CallWrapper) -> int:
        torch.cuda.set_device(0)
        store = dist.PrefixStore(f"iteration{call_wrapper.iteration}", call_wrapper.store)
        dist.init_process_group(
            "nccl",
            store=store,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=60),
        )
        tensor = torch.full((1024,), 2.0, device="cuda")
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        iterations.append({"iteration": call_wrapper.iteration, "sum": float(tensor.sum())})
        if call_wrapper.iteration == 0:
            raise RuntimeError("injected fault in iteration 0")
        dist.destroy_process_group()
        return call_wrapper.iteration

    returned = train()
    with open(OUT, "w") as f:
        json.dump({"returned": returned, "iterations": iterations}, f)


if __name__ == "__main__":
    {"counters": counters, "restart": restart, "ddp": ddp}[MODE]()
