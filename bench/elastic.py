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
* join_admitted_s: a process started later, admitted and synced: not measured, joining a running job (issue 13
  layer C) is not built yet (null).

    .venv/bin/python bench/elastic.py [--samples 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
WORLD_SIZE = 4
WIDTH = 2500
LAYERS = 4
COMMIT_EVERY = 2
KILL_STEP = 7
VICTIM = 3
STEPS = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Reporter:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)

    def __call__(self, **fields: object) -> None:
        fields.setdefault("time", time.time())
        self.file.write(json.dumps(fields) + "\n")


# ---- one rank ------------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import inprocess
    from inprocess.elastic import TorchState

    initial_rank = int(os.environ["RANK"])
    report = Reporter(args.out)
    seconds = datetime.timedelta(seconds=1)
    app_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD_SIZE,
                              initial_rank == 0, timeout=120 * seconds, wait_for_workers=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    state = TorchState(model, optimizer, step=0) if args.mode == "memory" else None
    checkpoint = Path(args.checkpoint)

    @inprocess.Wrapper(store_kwargs={"port": args.wrapper_port, "timeout": 120 * seconds},
                       monitor_thread_interval=0.1 * seconds, monitor_process_interval=0.1 * seconds,
                       progress_watchdog_interval=0.1 * seconds, last_call_wait=0.1 * seconds,
                       soft_timeout=120 * seconds, hard_timeout=150 * seconds, barrier_timeout=300 * seconds,
                       heartbeat_timeout=60 * seconds, completion_timeout=300 * seconds)
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iteration = call_wrapper.iteration
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", store=dist.PrefixStore(f"pg{iteration}", app_store), rank=rank,
                                world_size=world_size, timeout=300 * seconds)
        started = time.perf_counter()
        if state is not None:
            outcome = state.sync()
            step = state.step
            report(event="sync", iteration=iteration, rank=initial_rank, seconds=time.perf_counter() - started,
                   broadcast=outcome.broadcast)
        else:
            step = 0
            if iteration > 0:
                saved = torch.load(checkpoint, weights_only=True)
                model.load_state_dict(saved["model"])
                optimizer.load_state_dict(saved["optimizer"])
                step = int(saved["step"])
            report(event="load", iteration=iteration, rank=initial_rank, seconds=time.perf_counter() - started)
        dist.all_reduce(torch.ones(1))
        report(event="ready", iteration=iteration, rank=initial_rank, step=step)
        loss = torch.zeros(1)
        while step < STEPS:
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
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                               partial)
                    os.replace(partial, checkpoint)
                    report(event="save", rank=initial_rank, seconds=time.perf_counter() - before, step=step)
        dist.destroy_process_group()

    train()


# ---- orchestration -------------------------------------------------------------------------------------------


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def base_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
                TORCH_CPP_LOG_LEVEL="ERROR", MASTER_ADDR="127.0.0.1")


def run_job(mode: str, directory: Path, timeout: float) -> list[dict]:
    out = directory / "events.jsonl"
    master_port, wrapper_port = free_port(), free_port()
    processes = []
    for rank in range(WORLD_SIZE):
        env = dict(base_env(), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_PORT=str(master_port))
        command = [sys.executable, __file__, "--worker", "--mode", mode, "--out", str(out), "--wrapper-port",
                   str(wrapper_port), "--checkpoint", str(directory / "checkpoint.pt")]
        log = open(directory / f"rank{rank}.log", "w")
        processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
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


def median(samples: list[float]) -> float | None:
    return statistics.median(samples) if samples else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--mode", choices=["memory", "disk"], default="memory")
    parser.add_argument("--out")
    parser.add_argument("--wrapper-port", type=int)
    parser.add_argument("--checkpoint")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=420)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    import torch

    megabytes = LAYERS * (WIDTH * WIDTH + WIDTH) * 4 / 1e6
    print(f"elastic state, {WORLD_SIZE} gloo ranks on the CPU, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"model {megabytes:.0f} MB, kill -9 of rank {VICTIM} at step {KILL_STEP}, {args.samples} samples per mode")
    figures: dict[str, list[float]] = {name: [] for name in
                                       ("restore_memory", "restore_disk", "commit", "save", "sync_broadcast",
                                        "sync_after_restart", "load_after_restart")}
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
    print(f"{'kill -9 -> ready to train at 3 ranks, state from memory':<62} {show(memory):>12}  "
          f"samples {[round(x, 3) for x in figures['restore_memory']]}")
    print(f"{'  same, state reloaded from a torch.save checkpoint on disk':<62} {show(disk):>12}  "
          f"samples {[round(x, 3) for x in figures['restore_disk']]}"
          + (f", ratio {disk / memory:.2f}x" if memory and disk else ""))
    print(f"{'  of which sync() after the restart (memory), per rank':<62} {show(result['sync_after_restart']):>12}")
    print(f"{'  of which torch.load + load_state_dict (disk), per rank':<62} {show(result['load_after_restart']):>12}")
    print(f"{'state.commit(), rank 0 during training':<62} {show(commit, 1000, 'ms'):>12}  "
          f"{len(figures['commit'])} commits")
    print(f"{'torch.save of the same state to local disk, rank 0':<62} {show(save, 1000, 'ms'):>12}  "
          + (f"ratio {save / commit:.1f}x" if commit and save else ""))
    print(f"{'first sync(): 100 MB from rank 0 to 3 ranks':<62} {show(result['sync_broadcast']):>12}  "
          "what a newcomer pays")
    print(f"{'a new process admitted and synced (world back to 4)':<62} {'missing':>12}  "
          "joining a running job is not built yet")
    rounded = {key: (None if value is None else round(value, digits)) for key, value, digits in (
        ("restore_memory_s", memory, 4), ("restore_disk_s", disk, 4), ("join_admitted_s", None, 4),
        ("commit_ms", None if commit is None else commit * 1000, 2),
        ("torch_save_ms", None if save is None else save * 1000, 2),
        ("sync_broadcast_s", result["sync_broadcast"], 4))}
    print(json.dumps(rounded))


if __name__ == "__main__":
    main()
