"""A partition past the dead limit, in the simulator at the default timers: when each side knows, when the job is one.

One host (8 processes) of a job is cut off from the rest, then healed after ``heal`` dead limits. The simulator
(``rasd/sim``: the real node state machine, virtual time, simulated TCP with loss 0) runs the mesh at the default
timers (factor 1: hang 10 s, dead 60 s), so the figures are in real seconds of a real job, as modelled. Figures:

* larger_side_knows_s / smaller_side_knows_s: from the cut until every process of that side holds exactly the
  other side dead (a long partition, healed after 3 dead limits);
* one_job_after_heal_s: from the heal until the larger side agrees on one dead list and every process of the
  smaller side has either left the job or holds that same list (it was never held dead: a heal before the
  larger side's verdict about it), for each heal time;
* larger_side_lost: processes of the larger side that left the job or are held dead by it (must be 0).

The baseline is NCCL RAS's rule (a peer is dead after 60 s of silence to its ring neighbours, flooded, permanent; a
dead address's CONNINIT is NACKed: shared/reference/nccl-ras-behaviour.md 3.7): the two sides never become one job.
The previous torchras commit (513f095), which followed that rule, was measured with the same schedule: after 4 dead
limits the smaller side held 9 of the other 56 processes dead, and both sides stayed apart after the heal.

    .venv/bin/python bench/partition_heal.py [--nodes 64] [--heals 0.9,1.0,1.05,1.1,1.5,2.5]
"""

from __future__ import annotations

import argparse
import json
import time

from rasd.core.config import Timers
from rasd.sim import Simulation


def run(n: int, heal: float, seed: int) -> dict[str, float | int | None]:
    t = Timers()
    sim = Simulation(n, seed=seed, timers=t, procs_per_host=8)
    minority = set(range(8, 16))
    majority = set(range(n)) - minority
    sim.start(bootstrap="quiet")
    sim.run_until(1.0)
    keys = {i: sim.key(i) for i in range(n)}
    minority_keys = {keys[i] for i in minority}
    majority_keys = {keys[i] for i in majority}
    cut = sim.partition(minority, majority)
    begin = sim.now
    larger = smaller = None
    step = 0.5
    while sim.now < begin + heal * t.dead:
        sim.run_until(min(begin + heal * t.dead, sim.now + step))
        if larger is None and all(sim.nodes[i].node.dead == minority_keys for i in majority):
            larger = sim.now - begin
        if smaller is None and all(sim.nodes[i].node.dead == majority_keys for i in minority):
            smaller = sim.now - begin
    sim.heal(cut)
    healed = sim.now
    one_job = None
    while sim.now < healed + 3 * t.dead:
        sim.run_until(sim.now + step)
        views = {frozenset(sim.nodes[i].node.dead) for i in majority}
        staying = [i for i in minority if not sim.nodes[i].node.expelled]
        # One job: the larger side agrees on one dead list, and every process of the smaller side that did not
        # leave (one the larger side never held dead: a heal before its verdict) holds that same list.
        if len(views) == 1 and all(sim.nodes[i].node.dead == next(iter(views)) for i in staying):
            one_job = sim.now - healed
            break
    lost = sum(1 for i in majority if sim.nodes[i].node.expelled)
    lost += len(set().union(*(sim.nodes[i].node.dead for i in majority)) & majority_keys)
    return {
        "heal_dead_limits": heal,
        "larger_side_knows_s": larger,
        "smaller_side_knows_s": smaller,
        "one_job_after_heal_s": one_job,
        "smaller_side_left": sum(1 for i in minority if sim.nodes[i].node.expelled),
        "larger_side_lost": lost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--heals", default="0.9,1.0,1.05,1.1,1.5,3.0")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    began = time.monotonic()
    rows = [run(args.nodes, float(h), args.seed) for h in args.heals.split(",")]
    header = ("heal (dead limits)", "larger knows", "smaller knows", "one job after", "left", "lost")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (18, 13, 14, 14, 5, 5), strict=True)))
    for r in rows:

        def s(x: object) -> str:
            return "-" if x is None else f"{x:.1f} s"

        print(
            f"{r['heal_dead_limits']:>18} {s(r['larger_side_knows_s']):>13} {s(r['smaller_side_knows_s']):>14} "
            f"{s(r['one_job_after_heal_s']):>14} {r['smaller_side_left']:>5} {r['larger_side_lost']:>5}"
        )
    print(f"{args.nodes} processes, one host of 8 cut off; simulator, default timers; {time.monotonic() - began:.0f} s")
    print(json.dumps({"nodes": args.nodes, "runs": rows}))


if __name__ == "__main__":
    main()
