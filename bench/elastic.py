"""Elastic state: restore from memory (inprocess.elastic.TorchState) against reloading a disk checkpoint.

4 gloo ranks under inprocess.Wrapper train a model of about 100 MB (4 x Linear(2500, 2500), 25 M float32
parameters; plain SGD, so the optimizer holds no tensors). Each step: forward and backward on a batch of 1, one
small all_reduce (the loss), ``optimizer.step()``. Rank 3 kills itself (SIGKILL) after step 7, so the last commit
or checkpoint (step 6) is complete in both modes (a restart that cuts a ``torch.save`` waits for it: the save runs
in C++ and the restart exception is delivered between bytecodes). Two modes, the same job otherwise:

* memory: ``state.commit()`` every 2 steps on every rank; after the restart ``state.sync()`` (the wrapper has
          restored the last commit; every survivor holds the same commit, so nothing is broadcast);
* disk:   the torchrun way of keeping state: rank 0 ``torch.save``s model, optimizer and step every 2 steps to a
          file on local disk (written beside and renamed, so a kill never leaves half a file); after the restart
          every rank ``torch.load``s it and loads the state dicts. The page cache is warm (the file was just
          written): the most favourable case for the disk.

Figures (median over the samples):

* restore_memory_s / restore_disk_s: from the kill (the victim's clock just before SIGKILL) until every survivor
  holds the restored state and has completed its first collective at 3 ranks, ready to train (the training step
  itself, the same in both modes and seconds long on 2 shared cores, is left out);
* commit_ms / torch_save_ms: one ``state.commit()`` / one ``torch.save`` of the same state, on rank 0 during
  training (all 4 ranks busy);
* sync_broadcast_s: the first ``sync()`` of the job, which broadcasts rank 0's 100 MB to the 3 others (what a
  newcomer pays to get the state without touching disk);
* join_admitted_s (memory mode): after the kill, the job trains on at 3 ranks and a fifth process is started with
  ``INPROCESS_JOIN=1``. From its join (it is in the wait list: its interpreter, torch, monitor process and mesh
  node are up) until every rank of the grown world (4) has synced the 100 MB state to it and completed its first
  collective. It covers the wait for the next commit (every 2 steps; the host-update check runs at each), the
  restart of the 3 ranks, the rendezvous round (complete at once: max_nodes 4) and the 100 MB broadcast.
  join_from_start_s: the same end point, from the newcomer's process start (adds its interpreter and torch import,
  its monitor process and its mesh node). The baseline a torchrun user has: an elastic agent that sees a new node
  re-launches every worker (torchrun's whole-job restart: bench/README.md, "Restart latency") and every
  worker reloads the checkpoint (load_after_restart below, per rank); here the 3 running ranks keep their
  processes and their state.

Both modes run the Wrapper with ``joining=Joining(max_nodes=4, last_call=0.1)``: a restart below 4 ranks waits
the 0.1 s last call for latecomers, in both modes alike.

Sharded rows (``--sharded``, issue 43): FSDP2 (``fully_shard``) on 4 gloo ranks, 4 x Linear(1600, 1600) with
AdamW (123 MB of state), ``inprocess.elastic.ShardedState`` with k = 1 against ``dcp.save``/``dcp.load`` on local
disk and a full copy per rank (what ``rasd demo``'s Replica did), in the same processes: commit / save time (the
slowest rank, best of 3), the restore at 3 ranks after rank 3 left without a word (the state alone: the fault's
detection and the Wrapper's restart are the rows above), the restore at 4 once a fresh process joined, and the
bytes each rank holds against (1 + k) / N of the state. The ranks of one machine hold and read each other's blobs in
place (``inprocess.elastic.shared_memory``); ``--no-map``: no process opens another's blobs, so guards receive
copies and restores fetch by network, as between machines.
The disk's restore starts, like every in-place restart, with torch's DTensor caches emptied.

    .venv/bin/python bench/elastic.py [--samples 2]
    .venv/bin/python bench/elastic.py --sharded [--tp] [--no-map]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The job plumbing of bench/restart.py: free ports, a rank's event log, a rank's environment (bench/ is the
# script's folder, so on sys.path).
from restart import Reporter, base_env, free_port, read

WORLD_SIZE = 4
WIDTH = 2500
LAYERS = 4
COMMIT_EVERY = 2
KILL_STEP = 7
VICTIM = 3
STEPS = 10


# ---- one rank ------------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import inprocess
    from inprocess.elastic import Joining, TorchState

    initial_rank = int(os.environ.get("RANK", "-1"))  # -1: a newcomer (INPROCESS_JOIN=1), ranked by a round
    report = Reporter(args.out)
    seconds = datetime.timedelta(seconds=1)
    app_store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD_SIZE,
        initial_rank == 0,
        timeout=120 * seconds,
        wait_for_workers=False,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    state = TorchState(model, optimizer, step=0) if args.mode == "memory" else None
    checkpoint = Path(args.checkpoint)

    @inprocess.Wrapper(
        store_kwargs={"port": args.wrapper_port, "timeout": 120 * seconds},
        monitor_thread_interval=0.1 * seconds,
        monitor_process_interval=0.1 * seconds,
        progress_watchdog_interval=0.1 * seconds,
        last_call_wait=0.1 * seconds,
        soft_timeout=120 * seconds,
        hard_timeout=150 * seconds,
        barrier_timeout=300 * seconds,
        heartbeat_timeout=60 * seconds,
        completion_timeout=300 * seconds,
        joining=Joining(max_nodes=WORLD_SIZE, last_call=0.1, check_every=1),
    )
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iteration = call_wrapper.iteration
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        joined_at = call_wrapper.joining.joined_at if call_wrapper.joining is not None else None
        if joined_at is not None:
            report(event="joined", iteration=iteration, rank=initial_rank, time=joined_at)
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"pg{iteration}", app_store),
            rank=rank,
            world_size=world_size,
            timeout=300 * seconds,
        )
        started = time.perf_counter()
        if state is not None:
            outcome = state.sync()
            step = state.step
            report(
                event="sync",
                iteration=iteration,
                rank=initial_rank,
                seconds=time.perf_counter() - started,
                broadcast=outcome.broadcast,
            )
        else:
            step = 0
            if iteration > 0:
                saved = torch.load(checkpoint, weights_only=True)
                model.load_state_dict(saved["model"])
                optimizer.load_state_dict(saved["optimizer"])
                step = int(saved["step"])
            report(event="load", iteration=iteration, rank=initial_rank, seconds=time.perf_counter() - started)
        dist.all_reduce(torch.ones(1))
        report(event="ready", iteration=iteration, rank=initial_rank, step=step, world_size=world_size)
        loss = torch.zeros(1)
        # Memory mode trains on until a newcomer brought the world back to 4 (the same decision on every rank).
        while step < STEPS or (args.until_world and world_size < WORLD_SIZE and step < 100 * STEPS):
            if (iteration, initial_rank, step) == (0, VICTIM, KILL_STEP):
                report(event="kill", iteration=iteration, rank=initial_rank)
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            output = model(torch.randn(1, WIDTH))
            value = output.pow(2).mean()
            value.backward()
            loss.fill_(value.item())
            dist.all_reduce(loss)
            optimizer.step()
            step += 1
            if step % COMMIT_EVERY == 0:
                before = time.perf_counter()
                if state is not None:
                    state.step = step
                    state.commit()
                    report(event="commit", rank=initial_rank, seconds=time.perf_counter() - before, step=step)
                elif rank == 0:
                    partial = checkpoint.with_suffix(".partial")
                    torch.save(
                        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial
                    )
                    os.replace(partial, checkpoint)
                    report(event="save", rank=initial_rank, seconds=time.perf_counter() - before, step=step)
        dist.destroy_process_group()

    train()


# ---- orchestration -------------------------------------------------------------------------------------------


def run_job(mode: str, directory: Path, timeout: float) -> list[dict]:
    out = directory / "events.jsonl"
    master_port, wrapper_port = free_port(), free_port()
    processes = []
    command = [
        sys.executable,
        __file__,
        "--worker",
        "--mode",
        mode,
        "--out",
        str(out),
        "--wrapper-port",
        str(wrapper_port),
        "--checkpoint",
        str(directory / "checkpoint.pt"),
    ]
    if mode == "memory":
        command.append("--until-world")
    for rank in range(WORLD_SIZE):
        env = dict(base_env(), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_PORT=str(master_port))
        with open(directory / f"rank{rank}.log", "w") as log:  # the rank writes to its own copy
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        if mode == "memory":  # once the job trains at 3 ranks, a newcomer joins it
            while time.monotonic() < deadline and not [
                item for item in read(out) if item["event"] == "ready" and item["iteration"] == 1
            ]:
                time.sleep(0.2)
            env = dict(base_env(), WORLD_SIZE=str(WORLD_SIZE), MASTER_PORT=str(master_port), INPROCESS_JOIN="1")
            with open(directory / "newcomer.log", "w") as log, open(out, "a") as events:
                events.write(json.dumps({"event": "newcomer_start", "time": time.time()}) + "\n")
                processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        for process in processes:
            process.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print(f"warning: a {mode} run exceeded {timeout:.0f} s and was killed", file=sys.stderr)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return read(out)


def restore_latency(events: list[dict]) -> float | None:
    kills = [item["time"] for item in events if item["event"] == "kill"]
    ready = [item["time"] for item in events if item["event"] == "ready" and item["iteration"] == 1]
    if not kills or len(ready) != WORLD_SIZE - 1:
        return None
    return max(ready) - kills[0]


def join_latencies(events: list[dict]) -> tuple[float | None, float | None]:
    """(from the newcomer's join, from its process start) until every rank of the world of 4 is ready."""
    joined = [item for item in events if item["event"] == "joined"]
    started = [item["time"] for item in events if item["event"] == "newcomer_start"]
    if not joined or not started:
        return None, None
    ready = [
        item["time"]
        for item in events
        if item["event"] == "ready"
        and item["iteration"] == joined[0]["iteration"]
        and item.get("world_size") == WORLD_SIZE
    ]
    if len(ready) != WORLD_SIZE:
        return None, None
    return max(ready) - joined[0]["time"], max(ready) - started[0]


def median(samples: list[float]) -> float | None:
    return statistics.median(samples) if samples else None


# ---- sharded state (FSDP2): memory with redundancy against DCP on disk and a full copy per rank ------------------

SHARDED_WIDTH = 1600  # 4 x Linear(1600, 1600): 10.2 M parameters, 41 MB; with AdamW's two moments 123 MB of state
SHARDED_REPEATS = 3


def sharded_rank(
    rank: int, ports: list[int], folder: str, results: Any, tp: bool = False, no_map: bool = False
) -> None:
    """One process of the sharded figures (no Wrapper: the restarts are done by hand, to time the state alone).
    Ranks 0-3 train at 4, commit, time the three ways of keeping state; rank 3 then leaves (as a killed rank does:
    no goodbye) and 0-2 restore at 3; then rank 4, a fresh process, joins and all restore at 4."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from inprocess.elastic import ShardedState, caches, shared_memory

    if no_map:  # guards receive copies and restores fetch by network, as between machines
        shared_memory.open_fd = lambda handle: None

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(SHARDED_WIDTH, SHARDED_WIDTH) for _ in range(LAYERS)])
        world = dist.get_world_size()
        if tp and world % 2 == 0:  # FSDP2 + TP: (world / 2) x 2, colwise and rowwise layers in turn
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                ParallelStyle,
                RowwiseParallel,
                parallelize_module,
            )

            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
            plan: dict[str, ParallelStyle] = {
                str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(LAYERS)
            }
            parallelize_module(model, mesh["tp"], plan)
            fully_shard(model, mesh=mesh["dp"])
        else:  # FSDP2 (and FSDP2 + TP at 3 ranks, where 2 does not divide the world)
            fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    def group(port: int, new_rank: int, world: int) -> None:
        store = dist.TCPStore("127.0.0.1", port, world, new_rank == 0, timeout=datetime.timedelta(seconds=300))
        dist.init_process_group("gloo", store=store, rank=new_rank, world_size=world)

    def train(state: ShardedState) -> None:
        assert state.model is not None and state.optimizer is not None
        state.optimizer.zero_grad()
        torch.manual_seed(state.step)  # the same batch on every rank (a TP group's ranks must see the same input)
        state.model(torch.randn(2, SHARDED_WIDTH)).sum().backward()
        state.optimizer.step()
        state.step += 1

    def timed(action: Any) -> float:
        dist.barrier()
        started = time.perf_counter()
        action()
        dist.barrier()
        return time.perf_counter() - started

    def build_together() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """``ShardedState``'s build, ending in a barrier: the load's time then starts with every rank built, as the
        disk row's does (without it, the load's first gather counts the wait for the slowest rank's build)."""
        built = build()
        dist.barrier()
        return built

    state = ShardedState(build_together, step=0)
    figures: dict[str, Any] = {"rank": rank}
    if rank < WORLD_SIZE:
        group(ports[0], rank, WORLD_SIZE)
        state.sync()
        train(state)
        assert state.model is not None and state.optimizer is not None
        model, optimizer = state.model, state.optimizer
        figures["commit_s"] = min(timed(state.commit) for _ in range(SHARDED_REPEATS))
        figures["memory_bytes"] = state.memory_bytes()
        sharded = get_state_dict(model, optimizer)
        figures["state_bytes"] = sum(
            t.numel() * t.element_size()
            for t in _tensors(get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True)))
        )
        path = Path(folder) / "dcp"
        figures["dcp_save_s"] = min(
            timed(lambda: dcp.save({"model": sharded[0], "optim": sharded[1]}, checkpoint_id=path))
            for _ in range(SHARDED_REPEATS)
        )
        copies: list[Any] = []

        def full_copy() -> None:  # what rasd demo's Replica did: every rank the whole state
            full = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
            copies[:] = [[t.clone() for t in _tensors(full)]]

        figures["full_copy_s"] = min(timed(full_copy) for _ in range(SHARDED_REPEATS))
        figures["full_copy_bytes"] = sum(t.numel() * t.element_size() for t in copies[0])
        copies.clear()
        dist.destroy_process_group()
        if rank == VICTIM:
            results.put(figures)
            return
        group(ports[1], rank, WORLD_SIZE - 1)
        outcomes = []
        figures["restore_memory_3_s"] = timed(lambda: outcomes.append(state.sync()))
        figures["restore_memory_3_load_s"] = outcomes[0].load_s
        figures["restore_memory_3_build_s"] = outcomes[0].build_s
        figures["restore_memory_3_commit_s"] = outcomes[0].commit_s
        figures["restore_memory_3_fetched"] = outcomes[0].fetched_bytes
        figures["restore_memory_3_mapped"] = outcomes[0].mapped_bytes

        def restore_from_disk(cold: bool) -> float:
            """DCP's restore as a user's script does it after a restart: build, read into the state dicts, apply
            them; the load's share is timed as memory's (every rank built). Returns the load's seconds. Like every
            in-place restart (the Wrapper's, and ``sync()``'s), it starts with torch's DTensor caches emptied."""
            caches.forget_dtensor_caches()
            model3, optimizer3 = build()
            template = get_state_dict(model3, optimizer3)
            both: dict[str, Any] = {"model": template[0], "optim": template[1]}
            if cold and rank == 0:
                evict_page_cache(path)  # the checkpoint read from the disk itself, as a process on another host
            dist.barrier()
            started = time.perf_counter()
            dcp.load(both, checkpoint_id=path)
            set_state_dict(model3, optimizer3, model_state_dict=both["model"], optim_state_dict=both["optim"])
            return time.perf_counter() - started

        loads: list[float] = []
        figures["restore_disk_3_s"] = timed(lambda: loads.append(restore_from_disk(cold=False)))
        figures["dcp_load_3_s"] = loads[-1]
        figures["restore_disk_3_cold_s"] = timed(lambda: loads.append(restore_from_disk(cold=True)))
        figures["dcp_load_3_cold_s"] = loads[-1]
        train(state)
        state.commit()
        dist.destroy_process_group()
        group(ports[2], rank, WORLD_SIZE)
    else:
        group(ports[2], WORLD_SIZE - 1, WORLD_SIZE)
    started = time.perf_counter()
    outcome = state.sync()
    figures["restore_memory_4_s"] = time.perf_counter() - started
    figures["restore_memory_4_load_s"] = outcome.load_s
    figures["restore_memory_4_build_s"] = outcome.build_s
    figures["source_4"] = outcome.source
    dist.destroy_process_group()
    results.put(figures)


def evict_page_cache(folder: Path) -> None:
    """Drop the page cache's copy of every file under ``folder`` (written back first), so that the next read comes
    from the disk: ``posix_fadvise(DONTNEED)``, per file, no privileges needed."""
    for file in folder.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _tensors(tree: Any) -> list[Any]:
    import torch

    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for value in tree.values() for t in _tensors(value)]
    if isinstance(tree, (list, tuple)):
        return [t for value in tree for t in _tensors(value)]
    return []


def sharded_main(tp: bool = False, no_map: bool = False) -> None:
    """The sharded rows: FSDP2 (``tp``: FSDP2 + TP on a 2 x 2 mesh) on 4 gloo ranks, ``ShardedState`` (k = 1) against
    DCP on local disk and a full copy."""
    import torch
    import torch.multiprocessing as mp

    ports = [free_port() for _ in range(3)]
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="elastic-sharded-", dir="/tmp") as folder:
        processes = [
            context.Process(target=sharded_rank, args=(rank, ports, folder, results, tp, no_map))
            for rank in range(WORLD_SIZE + 1)
        ]
        for process in processes:
            process.start()
        rows = [results.get(timeout=600) for _ in processes]
        for process in processes:
            process.join(60)
    rows.sort(key=lambda row: row["rank"])
    first = rows[:WORLD_SIZE]
    state_mb = first[0]["state_bytes"] / 1e6
    expected = (1 + 1) / WORLD_SIZE * first[0]["state_bytes"]
    memory = [row["memory_bytes"] for row in first]
    print(
        f"sharded state: {'FSDP2 + TP (2 x 2 mesh; FSDP2 alone at 3)' if tp else 'FSDP2'} on {WORLD_SIZE} gloo ranks, "
        f"torch {torch.__version__}, {os.cpu_count()} cores, "
        f"4 x Linear({SHARDED_WIDTH}, {SHARDED_WIDTH}) + AdamW: {state_mb:.0f} MB of state; k = 1; "
        + (
            "--no-map: guards receive copies, restores fetch by network (as between machines)"
            if no_map
            else "one machine: guards hold descriptors, restores map blobs in place"
        )
    )

    def worst(key: str, subset: list[dict] = first) -> float:
        return max(row[key] for row in subset if key in row)

    survivors = [row for row in rows if "restore_memory_3_s" in row]
    table = [
        ("commit, ShardedState in memory (k = 1), s", worst("commit_s")),
        ("save, dcp.save to local disk, s", worst("dcp_save_s")),
        ("full copy per rank (full state dict + clone), s", worst("full_copy_s")),
        (
            "load at 3 after rank 3 left, from memory (agree, map or fetch, dcp.load, apply), s",
            worst("restore_memory_3_load_s", survivors),
        ),
        ("load at 3 from local disk (dcp.load, apply), s", worst("dcp_load_3_s", survivors)),
        ("  the same, the checkpoint's page cache dropped first, s", worst("dcp_load_3_cold_s", survivors)),
        ("until training resumes at 3, from memory (sync), s", worst("restore_memory_3_s", survivors)),
        (
            "  bytes mapped in place, MB (the survivors together)",
            sum(r["restore_memory_3_mapped"] for r in survivors) / 1e6,
        ),
        (
            "  bytes fetched by network, MB (the survivors together)",
            sum(r["restore_memory_3_fetched"] for r in survivors) / 1e6,
        ),
        ("  of which build() (model, fully_shard, optimizer state)", worst("restore_memory_3_build_s", survivors)),
        ("  of which the re-protection (the copies topped up to k + 1)", worst("restore_memory_3_commit_s", survivors)),
        ("until training resumes at 3, from local disk (build, load), s", worst("restore_disk_3_s", survivors)),
        ("  the same, the page cache dropped first, s", worst("restore_disk_3_cold_s", survivors)),
        ("restore at 4 with a newcomer, from memory (sync), s", worst("restore_memory_4_s", rows)),
        ("  of which build() (the newcomer's first FSDP2 module)", worst("restore_memory_4_build_s", rows)),
        ("  of which the load from memory", worst("restore_memory_4_load_s", rows)),
        ("memory per rank, ShardedState, MB (max)", max(memory) / 1e6),
        ("memory per rank, ShardedState, MB (min)", min(memory) / 1e6),
        ("(1 + k) / N of the state, MB", expected / 1e6),
        ("memory per rank, full copy, MB", first[0]["full_copy_bytes"] / 1e6),
    ]
    for name, value in table:
        print(f"{name:<78} {value:>10.3f}")
    print(json.dumps({name: round(value, 4) for name, value in table}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--mode", choices=["memory", "disk"], default="memory")
    parser.add_argument("--out")
    parser.add_argument("--wrapper-port", type=int)
    parser.add_argument("--checkpoint")
    parser.add_argument("--until-world", action="store_true")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=420)
    parser.add_argument("--sharded", action="store_true", help="the sharded rows only (FSDP2, ShardedState)")
    parser.add_argument("--tp", action="store_true", help="with --sharded: FSDP2 + TP on a 2 x 2 mesh")
    parser.add_argument("--no-map", action="store_true", help="with --sharded: copies and fetches by network")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.sharded:
        return sharded_main(args.tp, args.no_map)

    import torch

    megabytes = LAYERS * (WIDTH * WIDTH + WIDTH) * 4 / 1e6
    print(
        f"elastic state, {WORLD_SIZE} gloo ranks on the CPU, torch {torch.__version__}, {os.cpu_count()} cores, "
        f"model {megabytes:.0f} MB, kill -9 of rank {VICTIM} at step {KILL_STEP}, {args.samples} samples per mode"
    )
    figures: dict[str, list[float]] = {
        name: []
        for name in (
            "restore_memory",
            "restore_disk",
            "commit",
            "save",
            "sync_broadcast",
            "sync_after_restart",
            "load_after_restart",
            "join_admitted",
            "join_from_start",
        )
    }
    with tempfile.TemporaryDirectory(prefix="elastic-bench-", dir="/tmp") as temporary:
        for sample in range(args.samples):
            for mode in ("memory", "disk"):
                directory = Path(temporary) / f"{mode}-{sample}"
                directory.mkdir()
                events = run_job(mode, directory, args.timeout)
                latency = restore_latency(events)
                if latency is None:
                    print(f"warning: {mode} sample {sample} incomplete, see {directory}", file=sys.stderr)
                else:
                    figures[f"restore_{mode}"].append(latency)
                if mode == "memory":
                    admitted, from_start = join_latencies(events)
                    if admitted is None or from_start is None:
                        print(
                            f"warning: memory sample {sample}: the newcomer was not admitted, see {directory}",
                            file=sys.stderr,
                        )
                    else:
                        figures["join_admitted"].append(admitted)
                        figures["join_from_start"].append(from_start)
                for item in events:
                    if item["event"] == "commit" and item["rank"] == 0:
                        figures["commit"].append(item["seconds"])
                    if item["event"] == "save":
                        figures["save"].append(item["seconds"])
                    if item["event"] == "sync" and item["iteration"] == 0 and item["broadcast"]:
                        figures["sync_broadcast"].append(item["seconds"])
                    if item["event"] == "sync" and item["iteration"] == 1:
                        figures["sync_after_restart"].append(item["seconds"])
                    if item["event"] == "load" and item["iteration"] == 1:
                        figures["load_after_restart"].append(item["seconds"])
            if sample + 1 < args.samples:
                time.sleep(1)

    result = {name: median(values) for name, values in figures.items()}
    memory, disk = result["restore_memory"], result["restore_disk"]
    commit, save = result["commit"], result["save"]

    def show(value: float | None, scale: float = 1.0, unit: str = "s") -> str:
        return "n/a" if value is None else f"{value * scale:.3f} {unit}"

    print()
    print(f"{'figure':<62} {'value':>12}  note")
    print(
        f"{'kill -9 -> ready to train at 3 ranks, state from memory':<62} {show(memory):>12}  "
        f"samples {[round(x, 3) for x in figures['restore_memory']]}"
    )
    print(
        f"{'  same, state reloaded from a torch.save checkpoint on disk':<62} {show(disk):>12}  "
        f"samples {[round(x, 3) for x in figures['restore_disk']]}"
        + (f", ratio {disk / memory:.2f}x" if memory and disk else "")
    )
    print(f"{'  of which sync() after the restart (memory), per rank':<62} {show(result['sync_after_restart']):>12}")
    print(f"{'  of which torch.load + load_state_dict (disk), per rank':<62} {show(result['load_after_restart']):>12}")
    print(
        f"{'state.commit(), rank 0 during training':<62} {show(commit, 1000, 'ms'):>12}  "
        f"{len(figures['commit'])} commits"
    )
    print(
        f"{'torch.save of the same state to local disk, rank 0':<62} {show(save, 1000, 'ms'):>12}  "
        + (f"ratio {save / commit:.1f}x" if commit and save else "")
    )
    print(
        f"{'first sync(): 100 MB from rank 0 to 3 ranks':<62} {show(result['sync_broadcast']):>12}  "
        "what a newcomer pays"
    )
    print(
        f"{'a new process: from its join to 4 ranks ready, state synced':<62} "
        f"{show(result['join_admitted']):>12}  samples {[round(x, 3) for x in figures['join_admitted']]}"
    )
    print(
        f"{'  same, from the newcomer process start (import torch ...)':<62} "
        f"{show(result['join_from_start']):>12}  samples {[round(x, 3) for x in figures['join_from_start']]}"
    )
    rounded = {
        key: (None if value is None else round(value, digits))
        for key, value, digits in (
            ("restore_memory_s", memory, 4),
            ("restore_disk_s", disk, 4),
            ("join_admitted_s", result["join_admitted"], 4),
            ("join_from_start_s", result["join_from_start"], 4),
            ("commit_ms", None if commit is None else commit * 1000, 2),
            ("torch_save_ms", None if save is None else save * 1000, 2),
            ("sync_broadcast_s", result["sync_broadcast"], 4),
        )
    }
    print(json.dumps(rounded))


if __name__ == "__main__":
    main()
