"""Restart latency: inprocess.Wrapper against torchrun's whole-job restart, 4 gloo ranks on the CPU.

Latency = from the fault (the faulty rank's clock just before it raises or kills itself) until every surviving
rank is back in the training function and has completed its first collective. Median of 5 per case, for the
Wrapper at its defaults (``inprocess.Wrapper()``: last_call_wait 1 s, 1 s intervals) and tuned (0.1 s each):

* exception: one job, 5 successive faults (iteration i fails on rank 1 + i % 3), 5 restarts;
* kill -9:   5 jobs, rank 2 kills itself once; the Wrapper continues on 3 ranks;
* torchrun:  ``--standalone --max-restarts 5`` with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (without it torch
             2.13 cannot re-rendezvous gloo), the same faults in attempts 0..4.

nvidia-resiliency-ext is not installed on this machine, so its baseline is not measured here.
The last line of the output is one JSON object with the four medians.

    .venv/bin/python bench/restart.py
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
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
WORLD_SIZE = 4
SAMPLES = 5
FAULT_STEP = 5
STEPS = 12

# The tuned arm; the default arm passes nothing (the Wrapper's own defaults, docs/inprocess.md).
TUNED_SETTINGS = dict(
    last_call_wait=0.1,
    monitor_thread_interval=0.1,
    monitor_process_interval=0.1,
    progress_watchdog_interval=0.1,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Reporter:
    """A rank's events, one JSON line each, stamped with the wall clock unless the caller gives a time."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - one line per event until the rank exits

    def __call__(self, **fields: object) -> None:
        fields.setdefault("time", time.time())
        self.file.write(json.dumps(fields) + "\n")


# ---- workers ---------------------------------------------------------------------------------------------------


def fault(kind: str, report: Reporter, **where: object) -> None:
    report(event="fault", kind=kind, **where)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("injected fault")


def wrapper_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import inprocess

    initial_rank = int(os.environ["RANK"])
    report = Reporter(args.out)
    app_store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        WORLD_SIZE,
        initial_rank == 0,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )
    seconds = datetime.timedelta(seconds=1)
    settings: dict[str, Any] = (
        {name: value * seconds for name, value in TUNED_SETTINGS.items()} if args.settings == "tuned" else {}
    )

    @inprocess.Wrapper(store_kwargs={"port": args.wrapper_port}, **settings)
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iteration = call_wrapper.iteration
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"pg{iteration}", app_store),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=60),
        )
        tensor = torch.ones(1)
        for step in range(STEPS):
            dist.all_reduce(tensor)
            if step == 0:
                report(event="first_collective", iteration=iteration, initial_rank=initial_rank)
            if step == FAULT_STEP:
                if args.kind == "exception" and iteration < SAMPLES and initial_rank == 1 + iteration % 3:
                    fault("exception", report, iteration=iteration, initial_rank=initial_rank)
                if args.kind == "kill" and iteration == 0 and initial_rank == 2:
                    fault("kill", report, iteration=iteration, initial_rank=initial_rank)
            time.sleep(0.02)
        dist.destroy_process_group()

    train()


def torchrun_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    rank = int(os.environ["RANK"])
    report = Reporter(args.out)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    tensor = torch.ones(1)
    for step in range(STEPS):
        dist.all_reduce(tensor)
        if step == 0:
            report(event="first_collective", iteration=attempt, initial_rank=rank)
        if step == FAULT_STEP and attempt < SAMPLES and rank == 1 + attempt % 3:
            fault(args.kind, report, iteration=attempt, initial_rank=rank)
        time.sleep(0.02)
    dist.destroy_process_group()


# ---- orchestration ---------------------------------------------------------------------------------------------


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def latencies(events: list[dict]) -> list[float]:
    """For every fault in iteration i: the last first-collective of iteration i + 1, minus the fault time."""
    samples = []
    for item in events:
        if item["event"] != "fault":
            continue
        back = [
            e["time"] for e in events if e["event"] == "first_collective" and e["iteration"] == item["iteration"] + 1
        ]
        if back:
            samples.append(max(back) - item["time"])
    return samples


def run_processes(commands: list[tuple[list[str], dict]], timeout: float) -> None:
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for command, env in commands
    ]
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print("warning: a run exceeded its time limit and was killed", file=sys.stderr)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def base_env() -> dict:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        TORCH_CPP_LOG_LEVEL="ERROR",
        MASTER_ADDR="127.0.0.1",
    )


def wrapper_run(kind: str, settings: str, directory: Path) -> list[float]:
    out = directory / "events.jsonl"
    master_port, wrapper_port = free_port(), free_port()
    commands = []
    for rank in range(WORLD_SIZE):
        env = dict(base_env(), RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_PORT=str(master_port))
        commands.append(
            (
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    "wrapper",
                    "--kind",
                    kind,
                    "--out",
                    str(out),
                    "--wrapper-port",
                    str(wrapper_port),
                    "--settings",
                    settings,
                ],
                env,
            )
        )
    run_processes(commands, timeout=240)  # start-up alone took 35-50 s at load 9
    return latencies(read(out))


def torchrun_run(kind: str, directory: Path) -> list[float]:
    out = directory / "events.jsonl"
    env = dict(base_env(), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={WORLD_SIZE}",
        f"--max-restarts={SAMPLES}",
        "--monitor-interval=0.1",
        __file__,
        "--worker",
        "torchrun",
        "--kind",
        kind,
        "--out",
        str(out),
    ]
    run_processes([(command, env)], timeout=150)
    return latencies(read(out))


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", choices=["wrapper", "torchrun"])
    parser.add_argument("--kind", choices=["exception", "kill"], default="exception")
    parser.add_argument("--out")
    parser.add_argument("--wrapper-port", type=int)
    parser.add_argument("--settings", choices=["default", "tuned"], default="tuned")
    args = parser.parse_args()
    if args.worker == "wrapper":
        return wrapper_worker(args)
    if args.worker == "torchrun":
        return torchrun_worker(args)

    import torch

    print(
        f"restart latency, {WORLD_SIZE} gloo ranks on the CPU, torch {torch.__version__}, {os.cpu_count()} cores, "
        f"median of {SAMPLES}"
    )
    print("Wrapper default: inprocess.Wrapper() (last_call_wait 1 s, intervals 1 s, soft 60 s, hard 90 s)")
    print(
        "Wrapper tuned: "
        + ", ".join(f"{name}={value} s" for name, value in TUNED_SETTINGS.items())
        + "; everything else at its default"
    )
    print(
        f"torchrun: --standalone --max-restarts {SAMPLES} --monitor-interval 0.1, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    )
    print("nvidia-resiliency-ext: not installed here, not measured")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as temporary:
        root = Path(temporary)
        for settings in ("tuned", "default"):
            (root / f"wrapper-{settings}-exception").mkdir()
            results[f"wrapper_{settings}_exception"] = wrapper_run(
                "exception", settings, root / f"wrapper-{settings}-exception"
            )
            kills: list[float] = []
            for sample in range(SAMPLES):
                directory = root / f"wrapper-{settings}-kill-{sample}"
                directory.mkdir()
                kills += wrapper_run("kill", settings, directory)
            results[f"wrapper_{settings}_kill"] = kills
        for kind in ("exception", "kill"):
            directory = root / f"torchrun-{kind}"
            directory.mkdir()
            results[f"torchrun_{kind}"] = torchrun_run(kind, directory)

    print()
    print(f"{'fault':<10} {'Wrapper':<8} {'median':>9} {'torchrun median':>16} {'speed-up':>9}   samples (s)")
    for kind in ("exception", "kill"):
        theirs = median(results[f"torchrun_{kind}"])
        for settings in ("default", "tuned"):
            ours = median(results[f"wrapper_{settings}_{kind}"])
            print(
                f"{kind:<10} {settings:<8} {ours:>7.3f} s {theirs:>14.3f} s {theirs / ours:>8.1f}x   "
                f"Wrapper {[round(x, 3) for x in results[f'wrapper_{settings}_{kind}']]}, "
                f"torchrun {[round(x, 3) for x in results[f'torchrun_{kind}']]}"
            )
    print(json.dumps({f"{name}_median_s": round(median(samples), 4) for name, samples in sorted(results.items())}))


if __name__ == "__main__":
    main()
