"""Simulator throughput: nodes x simulated seconds per wall second, this tree against another checkout of the repo.

The workload is what the reliability sweep and the scale figures run on (docs/reliability.md): a job of ``--nodes``
processes on the deterministic simulator (``rasd.sim``), started from a shared table, at rest for a while, then a
STATUS gather every 2 simulated seconds from a random root, one process killed at 10 s and a second one paused at
20 s, for ``--seconds`` simulated seconds. Each run is a fresh child process that imports ``rasd`` from the tree it
measures, so the two trees run the same workload file; the runs alternate (A B A B ...) so that a change in the
machine's load falls on both, and the figure is the median per tree.

    python bench/sim_speed.py --baseline /path/to/other/checkout        # the table, then one JSON line
    python bench/sim_speed.py --nodes 1024 --seconds 30 --runs 3

The number of messages each run sent is printed too: the same workload on two trees whose mesh behaves alike sends
the same number of messages (the simulator is reproducible from its seed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _workload(nodes: int, seconds: float) -> dict[str, float]:
    """One run, in this process, with whatever ``rasd`` is first on the path."""
    import random

    from rasd.core.events import Kind
    from rasd.sim import Simulation

    sim = Simulation(nodes, seed=nodes, record=frozenset({Kind.PEER_DEAD}))
    rng = random.Random(nodes)
    began = time.process_time()
    sim.start("quiet")
    query = 0
    while sim.now < seconds - 1e-9:
        target = min(seconds, sim.now + 2.0)
        if sim.now >= 4.0:
            query += 1
            sim.gather(rng.randrange(nodes), query)
        if sim.now < 10.0 <= target:
            sim.run_until(10.0)
            sim.kill(nodes // 3)
        if sim.now < 20.0 <= target:
            sim.run_until(20.0)
            sim.pause(2 * nodes // 3)
        sim.run_until(target)
    cpu = time.process_time() - began
    return {"cpu_s": cpu, "node_seconds_per_s": nodes * seconds / cpu, "messages": sim.messages_sent}


def _child(tree: Path, nodes: int, seconds: float) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]);"
        "import sim_speed; print(json.dumps(sim_speed._workload(int(sys.argv[3]), float(sys.argv[4]))))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tree), str(HERE), str(nodes), str(seconds)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sim_speed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout of the repository to compare against")
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    trees = {"this tree": HERE.parent}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(_child(tree, args.nodes, args.seconds))
    figures: dict[str, float] = {"nodes": args.nodes, "simulated_s": args.seconds}
    print(f"simulator throughput, {args.nodes} nodes, {args.seconds:.0f} simulated s, {args.runs} runs per tree")
    print(f"{'tree':<12} {'node-s per CPU-s (median)':>26} {'CPU s (median)':>15} {'messages':>10}")
    for name, results in runs.items():
        speed = statistics.median(r["node_seconds_per_s"] for r in results)
        cpu = statistics.median(r["cpu_s"] for r in results)
        messages = {int(r["messages"]) for r in results}
        print(f"{name:<12} {speed:>26.0f} {cpu:>15.2f} {','.join(map(str, sorted(messages))):>10}")
        key = "this" if name == "this tree" else "baseline"
        figures[f"{key}_node_seconds_per_s"] = round(speed, 1)
        figures[f"{key}_cpu_s"] = round(cpu, 3)
        figures[f"{key}_messages"] = min(messages)
    if "baseline_node_seconds_per_s" in figures:
        ratio = figures["this_node_seconds_per_s"] / figures["baseline_node_seconds_per_s"]
        figures["speedup"] = round(ratio, 3)
        print(f"this tree runs the simulator {ratio:.2f}x as fast as the baseline")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
