"""How fast the mesh finds dead and hung processes, what it costs, and whether it cries wolf.

Real processes (``rasd swarm``, 16 members on this machine):
  * kill -9 of a member -> every survivor records PEER_DEAD (median of 3 kills). The baseline is NCCL RAS's
    documented rule, a constant: dead after 60 s of silence (shared/reference/nccl-ras-behaviour.md). The same
    kill with the fast-death rule off shows our silence ladder alone (60 s, then the last call and the gather of
    docs/architecture.md 2.7): what a whole host losing power, which refuses no reconnect, costs;
  * SIGSTOP of a member -> a neighbour records PEER_UNRESPONSIVE (median of 3);
  * CPU share of an idle member;
  * false verdicts (PEER_DEAD, PEER_HUNG, PEER_UNRESPONSIVE about a live member) during 2 minutes with both
    cores saturated by other processes.
Simulator (same core, virtual network): messages per node per second at rest at 1,024 and 4,096 nodes, and the
time for one death to reach every node at 4,096.

Prints a table, then, as its last line, one JSON object of the figures.
Usage: python bench/detection.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable

import psutil

from rasd.core.events import Kind
from rasd.sim import Simulation
from rasd.swarm import Swarm

N = 16
#: NCCL RAS's dead limit: a peer silent this long is declared dead (shared/reference/nccl-ras-behaviour.md).
NCCL_DEAD_S = 60.0


def seen_by(
    swarm: Swarm, members: list[int], kind: str, victim: int, quantifier: Callable[[Iterable[object]], bool] = all
) -> Callable[[], bool]:
    """A condition for ``Swarm.wait_for``: ``quantifier`` (all or any) of ``members`` recorded ``kind`` about
    ``victim``. A function of its arguments, so that a loop can build one per iteration."""
    return lambda: quantifier(swarm.saw(member, kind, victim) for member in members)


def crash_all_peers(env: dict[str, str], kills: int, limit: float) -> list[float]:
    out = []
    with Swarm(N, env=env) as sw:
        for victim in range(kills):
            t0 = time.time()
            sw.kill(victim)
            alive = [i for i in range(N) if i > victim]
            sw.wait_for(seen_by(sw, alive, "PEER_DEAD", victim), limit, "PEER_DEAD", step=0.01)
            out.append(max(e["wall"] for i in alive if (e := sw.saw(i, "PEER_DEAD", victim))) - t0)
    return out


def hang_flag(repeats: int) -> list[float]:
    out = []
    with Swarm(N) as sw:
        for victim in range(repeats):
            t0 = time.time()
            sw.pause(victim)
            others = [i for i in range(N) if i != victim]
            sw.wait_for(seen_by(sw, others, "PEER_UNRESPONSIVE", victim, any), 30, "UNRESPONSIVE", step=0.01)
            out.append(min(e["wall"] for i in others if (e := sw.saw(i, "PEER_UNRESPONSIVE", victim))) - t0)
            sw.resume(victim)
            # Only the neighbours that flagged it have something to take back (it resumed before the hang limit).
            flagged = [i for i in others if sw.saw(i, "PEER_UNRESPONSIVE", victim)]
            sw.wait_for(seen_by(sw, flagged, "PEER_RECOVERED", victim), 30, "RECOVERED")
    return out


def idle_cpu(seconds: float) -> float:
    with Swarm(N) as sw:
        time.sleep(2.0)
        procs = [psutil.Process(m.pid) for m in sw.members]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(seconds)
        after = [sum(p.cpu_times()[:2]) for p in procs]
    return 100.0 * statistics.mean(a - b for a, b in zip(after, before, strict=True)) / seconds


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def false_verdicts(seconds: float) -> tuple[int, int]:
    with Swarm(N) as sw:
        stop_at = time.time() + seconds
        burners = [multiprocessing.Process(target=_burn, args=(stop_at,)) for _ in range(os.cpu_count() or 2)]
        for b in burners:
            b.start()
        for b in burners:
            b.join()
        verdicts = sum(len(sw.events(i, k)) for i in range(N) for k in ("PEER_DEAD", "PEER_HUNG"))
        unresponsive = sum(len(sw.events(i, "PEER_UNRESPONSIVE")) for i in range(N))
    return verdicts, unresponsive


def sim_rest(n: int, window: float = 10.0) -> float:
    sim = Simulation(n, seed=n)
    sim.start()
    sim.run_until(15.0)  # settle: every link up
    before = sim.messages_sent
    sim.run_until(15.0 + window)
    return (sim.messages_sent - before) / n / window


def sim_death_spread(n: int) -> float:
    sim = Simulation(n, seed=7)
    sim.start()
    sim.run_until(15.0)
    victim = n // 3
    t0 = sim.now
    sim.kill(victim)
    addr = sim.addr(victim)
    sim.run_while(lambda: not all(s.node.is_dead(addr) for s in sim.live()), 120, step=0.01)
    return max(t for i, t, e in sim.events(Kind.PEER_DEAD) if e.addr == addr) - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter runs (30 s saturation, no NCCL baseline)")
    args = ap.parse_args()
    saturate = 30.0 if args.quick else 120.0

    crash = crash_all_peers({}, kills=3, limit=30)
    nccl = [] if args.quick else crash_all_peers({"TORCHRAS_FAST_DEATH": "0"}, kills=1, limit=120)
    hang = hang_flag(3)
    cpu = idle_cpu(20.0)
    verdicts, unresponsive = false_verdicts(saturate)
    m1024 = sim_rest(1024)
    m4096 = sim_rest(4096)
    spread = sim_death_spread(4096)

    crash_s = statistics.median(crash)
    rows = [
        ("kill -9 -> PEER_DEAD at all 15 survivors (median of 3)", f"{crash_s:.3f} s", "target < 2 s"),
        (
            "  NCCL RAS: dead after 60 s of silence (documented constant)",
            f"{NCCL_DEAD_S:.1f} s",
            f"ratio {NCCL_DEAD_S / crash_s:.0f}x",
        ),
        (
            "  ours with fast death off (silence ladder only), same run",
            f"{nccl[0]:.1f} s" if nccl else "skipped",
            "60 s + last call + gather",
        ),
        (
            "SIGSTOP -> PEER_UNRESPONSIVE at a neighbour (median of 3)",
            f"{statistics.median(hang):.2f} s",
            "target < 6 s",
        ),
        ("idle RAS node, CPU share of one core", f"{cpu:.3f} %", "target < 0.5 %"),
        (
            f"false verdicts in {saturate:.0f} s with all cores saturated",
            f"{verdicts}",
            f"target 0 (UNRESPONSIVE events: {unresponsive})",
        ),
        ("sim: messages per node per second at rest, 1,024 nodes", f"{m1024:.2f}", ""),
        ("sim: messages per node per second at rest, 4,096 nodes", f"{m4096:.2f}", "flat as N grows"),
        ("sim: one death known by all 4,095 survivors", f"{spread:.3f} s", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>10}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>10}  {note}")
    figures = {
        "crash_all_peers_s": round(crash_s, 4),
        "hang_flag_s": round(statistics.median(hang), 3),
        "idle_cpu_pct": round(cpu, 4),
        "false_verdicts": verdicts,
        "msgs_per_node_s_1024": round(m1024, 3),
        "msgs_per_node_s_4096": round(m4096, 3),
        "death_spread_s_4096": round(spread, 4),
    }
    if nccl:
        figures["silence_ladder_crash_all_peers_s"] = round(nccl[0], 2)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
