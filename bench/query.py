"""STATUS latency: how long ``echo status | nc localhost 28028`` takes, healthy and right after a hang.

* 16 real processes (``rasd swarm``): median and p99 of 50 STATUS queries, connect to last byte; then a member is
  SIGSTOPped: the first query (which waits for the silent leg, reported as a TIMEOUT warning, as NCCL does) and
  the median of 20 queries after it (which route around the silent process).
* 1,024 and 4,096 nodes in the simulator, every hop charged the processing time measured here for one request
  and one response, plus the report build time measured for that many processes. The baseline is NCCL's mesh:
  a ring alone, where a gather is N/2 hops deep (``express_links=False``), in the same run.

Prints a table and, last, one JSON object of the figures. Usage: python bench/query.py
"""

from __future__ import annotations

import functools
import json
import random
import socket
import statistics
import sys
import time

from rasd.core import node as core, wire
from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord
from rasd.core.events import Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.report.model import build_report
from rasd.report.text import render_tail
from rasd.sim import Simulation
from rasd.swarm import Swarm

PORT = 29877


def _connect(port: int) -> socket.socket:
    """A connection to a process that answers (with SO_REUSEPORT one may land on a stopped process)."""
    for _ in range(10):
        s = socket.create_connection(("localhost", port), 5)
        s.settimeout(1.0)
        s.sendall(b"CLIENT PROTOCOL 2\n")
        try:
            if s.recv(64).startswith(b"SERVER PROTOCOL"):
                return s
        except OSError:
            pass
        s.close()
    raise RuntimeError("no process answered")


def status(port: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    s = _connect(port)
    s.settimeout(30)
    s.sendall(b"STATUS\n")
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return time.perf_counter() - t0, out.decode()


def real_16() -> dict[str, float]:
    env = {"TORCHRAS_ADDR": f"localhost:{PORT}", "TORCHRAS_SWARM_STEP_S": "0"}
    with Swarm(16, env=env) as sw:
        time.sleep(1.0)
        lat = [status(PORT)[0] for _ in range(50)]
        sw.pause(5)
        first, report = status(PORT)
        assert "TIMEOUT" in report, "the first query after a hang should wait for the silent leg"
        after = [status(PORT)[0] for _ in range(20)]
        sw.resume(5)
    lat.sort()
    return {
        "p50": statistics.median(lat),
        "p99": lat[int(0.99 * (len(lat) - 1))],
        "first_after_hang": first,
        "after_hang_p50": statistics.median(after),
    }


def measured_hop_cost() -> float:
    """Seconds one node spends on one gather request plus one response, with a node's usual payload."""
    sim = Simulation(3, seed=1)
    sim.start()
    sim.run_until(2.0)
    a, b = sim.nodes[0].node, sim.nodes[1].node
    (cid,) = [c.id for c in b.conns.values() if c.peer == a.me.addr and c.state is core.ConnState.READY]
    data = _process_data(1, 0)
    n = 2000
    t0 = time.perf_counter()
    for i in range(n):
        b.received(cid, wire.encode(wire.CollReq(a.me.addr, 10_000 + i, 5000)), 2.0)
        frame = wire.encode(wire.collresp(a.me.addr, 10_000 + i, 0, ((Addr("10.9.9.9", i + 1), data),)))
        for c in list(b.conns.values()):  # answer b's forward so that its gather completes
            b.received(c.id, frame, 2.0)
    return (time.perf_counter() - t0) / n


def _process_data(n_ranks: int, rank: int) -> ProcessData:
    counts = tuple(range(N_OPS))
    return ProcessData(
        comms=(CommRecord(0x1234, n_ranks, (RankRecord(rank, launched=counts, completed=counts),), ((0, n_ranks, 1),)),)
    )


def report_build_time(n: int) -> float:
    peers = tuple(
        PeerInfo(
            Addr(f"10.{i // 8 // 256}.{i // 8 % 256}.1", 20000 + i % 8), pid=i, hostname=f"h{i}", incarnation=i, rank=i
        )
        for i in range(n)
    )
    snap = JobSnapshot(peers=peers, responses={p.addr: _process_data(n, p.rank) for p in peers})
    t0 = time.perf_counter()
    render_tail(build_report(snap))
    return time.perf_counter() - t0


def _gathering(sim: Simulation, key: tuple[int, int]) -> bool:
    return key not in sim.gathers_done


def simulated(n: int, hop_cost: float, express: bool, queries: int = 10) -> float:
    sim = Simulation(n, seed=n, hop_cost=hop_cost, express_links=express, record=frozenset({Kind.PEER_DEAD}))
    sim.start("quiet")
    sim.run_until(4.0)
    rng = random.Random(n)
    times = []
    for q in range(queries):
        root = rng.randrange(n)
        t0 = sim.now
        sim.gather(root, q)
        sim.run_while(functools.partial(_gathering, sim, (root, q)), 30.0, step=0.005)
        times.append(sim.gathers_done[(root, q)][0] - t0)
        sim.run_until(sim.now + 0.2)
    return statistics.median(times)


def main() -> int:
    real = real_16()
    hop = measured_hop_cost()
    rows = [
        ("16 real processes: STATUS p50", real["p50"], "target < 0.05 s"),
        ("16 real processes: STATUS p99", real["p99"], ""),
        (
            "first STATUS after a SIGSTOP (waits for the silent leg)",
            real["first_after_hang"],
            "NCCL bound: <= leg timeout 5 s + 5 s",
        ),
        ("later STATUS after the SIGSTOP, p50", real["after_hang_p50"], "as fast as healthy"),
    ]
    figures = {
        "status_p50_s_16": real["p50"],
        "status_p99_s_16": real["p99"],
        "first_after_hang_s": real["first_after_hang"],
        "after_hang_p50_s": real["after_hang_p50"],
    }
    print(
        f"16 real processes: p50 {real['p50']:.4f} s, p99 {real['p99']:.4f} s; after a hang: first "
        f"{real['first_after_hang']:.3f} s, then p50 {real['after_hang_p50']:.4f} s",
        flush=True,
    )
    for n in (1024, 4096):
        build = report_build_time(n)
        ours = simulated(n, hop, express=True) + build
        # The ring's gather is N/2 hops deep and every hop re-reads the growing reply: slow to simulate, so fewer
        # queries (its spread is small: the depth does not depend on the root).
        ring = simulated(n, hop, express=False, queries=2) + build
        print(f"sim {n}: {ours:.4f} s with express links, {ring:.4f} s with the ring alone", flush=True)
        rows.append((f"sim {n} nodes: STATUS p50 (express links)", ours, "target < 1 s at 4,096" if n == 4096 else ""))
        rows.append((f"sim {n} nodes: STATUS p50, NCCL's ring alone", ring, f"ratio {ring / ours:.1f}x"))
        figures[f"status_p50_s_{n}"] = ours
        figures[f"ring_status_p50_s_{n}"] = ring
    width = max(len(r[0]) for r in rows)
    print(f"per-hop processing time measured here: {hop * 1e6:.0f} us")
    print(f"{'figure':<{width}}  {'seconds':>9}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>9.4f}  {note}")
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
