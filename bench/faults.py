"""Reliability under real network faults, hostile input and load (issue 14; docs/reliability.md).

Phases, in one run:

* **soak** (``--soak-minutes``, default 30): 16 ``rasd swarm`` members on 3 hosts (network namespaces,
  tests/netns.py), timers at factor 0.5 (hang 5 s, dead 30 s). Every ``--fault-every`` seconds a random fault:
  a member SIGSTOPped for 1 to 8 s then resumed, or a member killed with SIGKILL and restarted on its host (a new
  process in its place). 100 concurrent clients (34/33/33 per host, each a thread in a client process inside the
  host): four in five ask STATUS in a loop (a query is *answered* when a report arrives, retrying the handshake
  and up to 3 connections; *unanswered* otherwise), one in five holds a MONITOR session. Both cores are kept
  saturated by other programs: the fuzz and sweep workers below, then busy loops once those are done (or, with
  ``--busy-loops 0``, programs the user started beside the run, such as a long sweep). Counted: a
  false verdict is a PEER_DEAD about a member that was not killed, or a PEER_HUNG about one that was neither
  stopped nor killed; every kill must be known dead by every member alive at the end; RSS and open fds of the
  members never killed, from the end of the warm-up to the end.
* **fuzz** (``--fuzz-inputs`` per port, default 1,000,000): the mesh port (``FrameReader`` at both limits, and a
  real meshed Node before and after authentication) and the client port (``ClientSession`` driving real gathers),
  tests/reliability/fuzz.py. Crashes, hangs and verdict changes counted, each printed whole with the command
  that replays it (``python tests/reliability/fuzz.py --target postauth --seed S --count N``).
* **sweeps** (``--sim-seeds``, default 10,000): tests/reliability/sweep.py, properties checked at every step.
* **partitions** (netns, factor 0.2, 6 members on 3 hosts): 10 % loss and a 30±20 ms delay proxy throughout,
  one host partitioned for 4 s (past the hang limit, before the dead limit), another host's link down for 3 s;
  counted: PEER_DEAD about anyone (all reachable: every one is false).
* **timing** (``--mismatch-queries`` per job, default 10,000): a healthy 8-member swarm stepping every 20 ms and a
  healthy 4-rank gloo job, queried back to back by 4 clients. Ours: text reports that say MISMATCH. The baseline,
  in the same run on the same job: NCCL's rule (any difference in launch counts is a MISMATCH) applied to the
  per-rank counts of JSON reports taken in between (one for every three of ours).

The fuzz and sweep work runs in ``--workers`` (default 2) worker processes during the soak (they are the "other
program" that saturates the cores); whatever is not done when the soak ends is finished after it. Prints a table
and, last, one JSON line. Usage: .venv/bin/python bench/faults.py [--soak-minutes 30] [--fuzz-inputs 1000000]
[--sim-seeds 10000] [--mismatch-queries 10000]; the fuzz part alone, on one process:
``bench/faults.py --skip soak,partition,timing --sim-seeds 0 --workers 1 --fuzz-inputs 200000``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO / "tests", REPO / "tests" / "reliability", REPO / "tests" / "integration", REPO):
    sys.path.insert(0, str(extra))

CLIENT_PORT = 28028
FUZZ_CHUNK = 20_000
SOAK_SAMPLES = 8  # memory samples of every live member through the soak, after its warm-up
SWEEP_CHUNK = 10


# ----------------------------------------------------------------------------------------------------------------
# CPU work: fuzz and sweeps, in worker processes


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _fuzz_task(task: tuple[str, int, int]) -> dict:
    import fuzz

    port, count, seed = task
    rss_before = _rss()
    rng = random.Random(seed)
    pool = fuzz.corpus()
    if port == "client":
        out = fuzz.client(rng, fuzz.client_inputs(rng), count)
    else:
        # The node targets draw their own stream from the seed, so that a finding's reproduction command
        # (``fuzz.py --target ... --seed ... --count ...``, printed with it) replays it exactly.
        out = fuzz.Findings()
        out.add(fuzz.frames(rng, fuzz.inputs(rng, pool), count * 8 // 10))
        out.add(fuzz.mesh(seed, count // 10, authenticated=False, pool=pool))
        out.add(fuzz.mesh(seed, count - count * 8 // 10 - count // 10, authenticated=True, pool=pool))
    return {
        "kind": "fuzz",
        "port": port,
        "inputs": out.inputs,
        "crashes": out.crashes[:5],
        "crash_count": len(out.crashes),
        "hangs": len(out.hangs),
        "hang_examples": out.hangs[:2],
        "verdict_examples": out.verdict_changes[:5],
        "verdict_changes": len(out.verdict_changes),
        "slowest_s": out.slowest_s,
        "pid": os.getpid(),
        "rss_before": rss_before,
        "rss_after": _rss(),
    }


def _sweep_task(seeds: list[int]) -> dict:
    import sweep

    results = [sweep.check_seed(s) for s in seeds]
    return {
        "kind": "sweep",
        "seeds": len(results),
        "seed_list": seeds,
        "nodes": [r.nodes for r in results],
        "violations": [(r.seed, r.violations[:3], r.repro()) for r in results if r.violations],
        "steps": sum(r.steps for r in results),
        "gathers": sum(r.gathers for r in results),
    }


def _run_task(task: tuple) -> dict:
    kind, arg = task
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return _fuzz_task(arg) if kind == "fuzz" else _sweep_task(arg)


def _fuzz_rss_growth_pct(results: list[dict]) -> float | None:
    """Memory over the fuzz volume: for each worker process and port, its RSS at the end of its first fuzz task of
    that port (targets, corpus and interpreter warm) against the end of its last; the largest growth, in percent.
    Every task builds fresh targets, so what a target leaks past its task shows up as growth from task to task.
    (Per port: a worker that runs a client task after a mesh task holds the mesh task's high-water mark.)"""
    growth: list[float] = []
    for pid, port in {(r["pid"], r["port"]) for r in results}:
        mine = [r["rss_after"] for r in results if (r["pid"], r["port"]) == (pid, port)]
        if len(mine) >= 2:
            growth.append(100.0 * (mine[-1] / mine[0] - 1))
    return round(max(growth), 1) if growth else None


def _first_task_growth_mb(results: list[dict]) -> list[float]:
    """Each worker's RSS growth during its first fuzz task (imports, corpus and one task's targets)."""
    firsts: dict[int, dict] = {}
    for r in results:
        firsts.setdefault(r["pid"], r)
    return [(r["rss_after"] - r["rss_before"]) / 2**20 for r in firsts.values()]


class CpuWork:
    """The fuzz and sweep tasks on 2 worker processes, in the background; results gathered as they come."""

    def __init__(self, fuzz_inputs: int, sim_seeds: int, workers: int = 2, sim_first: int = 0) -> None:
        tasks: list[tuple] = []
        for port in ("mesh", "client"):
            left, seed = fuzz_inputs, 0
            while left > 0:
                tasks.append(("fuzz", (port, min(FUZZ_CHUNK, left), 1000 * seed + (port == "client"))))
                left -= FUZZ_CHUNK
                seed += 1
        seeds = list(range(sim_first, sim_first + sim_seeds))
        sweeps = [("sweep", seeds[i : i + SWEEP_CHUNK]) for i in range(0, sim_seeds, SWEEP_CHUNK)]
        # The fuzz volume first (its figure is per port), then seeds until the budget runs out.
        self.tasks = tasks + sweeps
        self.results: list[dict] = []
        self.cut_short = False
        self.started = time.monotonic()
        self.seconds = 0.0
        self.pool = multiprocessing.get_context("fork").Pool(workers)
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        for result in self.pool.imap_unordered(_run_task, self.tasks):
            self.results.append(result)
        self.seconds = time.monotonic() - self.started

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, deadline: float) -> None:
        """Wait for every task, or stop at ``deadline`` (monotonic) and keep what is done (reported as such)."""
        self._thread.join(None if deadline == float("inf") else max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self.pool.terminate()
            self.seconds = time.monotonic() - self.started
            self.cut_short = True
        else:
            self.pool.close()
        self.pool.join()


# ----------------------------------------------------------------------------------------------------------------
# Clients inside a host (``faults.py _clients``)


def clients_main(argv: list[str]) -> int:
    from ras_client import connect

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=CLIENT_PORT)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    stop = time.monotonic() + args.seconds
    lock = threading.Lock()
    stats: dict[str, Any] = {
        "asked": 0,
        "answered": 0,
        "unanswered": 0,
        "retries": 0,
        "mismatch": 0,
        "monitor_events": 0,
        "monitor_sessions": 0,
        "errors": [],
    }

    def one_query() -> str:
        with connect(args.port, attempts=10) as s:
            s.sendall(b"STATUS\n")
            s.settimeout(60)
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
            text = b"".join(chunks).decode(errors="replace")
            if "Communicators" not in text and "communicators" not in text.lower():
                raise ConnectionError(f"not a report: {text[:80]!r}")
            return text

    def querier(rng: random.Random) -> None:
        while time.monotonic() < stop:
            with lock:
                stats["asked"] += 1
            for attempt in range(3):
                try:
                    one_query()
                    with lock:
                        stats["answered"] += 1
                    break
                except (OSError, AssertionError, ConnectionError) as exc:
                    with lock:
                        stats["retries"] += 1
                        if attempt == 2:
                            stats["unanswered"] += 1
                            stats["errors"].append(f"{type(exc).__name__}: {exc}"[:120])
                    time.sleep(0.5)
            time.sleep(rng.uniform(0.5, 2.0))

    def monitor(rng: random.Random) -> None:
        while time.monotonic() < stop:
            try:
                with connect(args.port, attempts=10) as s:
                    s.sendall(b"MONITOR all\n")
                    with lock:
                        stats["monitor_sessions"] += 1
                    s.settimeout(1.0)
                    while time.monotonic() < stop:
                        try:
                            data = s.recv(65536)
                        except TimeoutError:
                            continue
                        if not data:
                            break
                        with lock:
                            stats["monitor_events"] += data.count(b"\n")
            except (OSError, AssertionError):
                time.sleep(0.5)

    threads = []
    for i in range(args.clients):
        rng = random.Random(i)
        threads.append(threading.Thread(target=monitor if i % 5 == 4 else querier, args=(rng,), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.seconds + 120)
    stats["errors"] = stats["errors"][:10]
    Path(args.out).write_text(json.dumps(stats))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# The soak


def _member_usage(pids: list[int]) -> dict[int, tuple[int, int]]:
    """RSS and open fds of each process."""
    import psutil

    usage = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            usage[pid] = (p.memory_info().rss, p.num_fds())
        except psutil.Error:
            pass
    return usage


def soak(minutes: float, cpu: CpuWork, fault_every: float, workdir: Path, busy_loops: int = 2) -> dict:
    from multihost import HostSwarm
    from netns import Network
    from rasd.core.config import Timers

    timers = Timers().scaled(0.5)
    env = {"TORCHRAS_TIMEOUT_FACTOR": "0.5", "TORCHRAS_SWARM_STEP_S": "1"}
    rng = random.Random(14)
    seconds = minutes * 60
    result: dict = {}
    busy: list[subprocess.Popen] = []
    with Network(3) as net, HostSwarm(net, 16, env=env, workdir=str(workdir / "soak")) as sw:
        original = {i: sw.members[i].pid for i in range(sw.n)}
        killed_addrs: set[str] = set()
        stopped: dict[str, float] = {}  # addr -> longest stop
        client_procs = []
        shares = [34, 33, 33]
        for host, count in zip(net.hosts, shares, strict=True):
            out = workdir / f"clients-{host.name}.json"
            client_procs.append(
                (
                    out,
                    host.popen(
                        [
                            sys.executable,
                            str(Path(__file__).resolve()),
                            "_clients",
                            "--clients",
                            str(count),
                            "--seconds",
                            str(seconds),
                            "--out",
                            str(out),
                        ],
                        cwd=str(REPO),
                        stdin=subprocess.DEVNULL,
                    ),
                )
            )
        started = time.monotonic()
        warmup = min(60.0, seconds / 10)
        faults = {"stops": 0, "kills": 0}
        next_fault = started + warmup
        # Every live member's RSS and fds, SOAK_SAMPLES times from the end of the warm-up: the shape of the growth.
        samples: list[dict[int, tuple[int, int]]] = []
        next_sample = started + warmup
        while time.monotonic() - started < seconds:
            now = time.monotonic()
            if now - started >= warmup and now >= next_sample:
                next_sample = now + (seconds - warmup) / SOAK_SAMPLES
                samples.append(_member_usage([sw.members[i].pid for i in range(sw.n) if sw.alive(i)]))
            if cpu.done and not busy and busy_loops:
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy_loops)]
            if now >= next_fault:
                next_fault = now + fault_every
                live = [i for i in range(sw.n) if sw.alive(i)]
                roll = rng.random()
                if roll < 0.6:
                    i = rng.choice(live)
                    pause = rng.uniform(1.0, 8.0)
                    addr = sw.members[i].addr
                    stopped[addr] = max(stopped.get(addr, 0.0), pause)
                    sw.pause(i)
                    time.sleep(pause)
                    sw.resume(i)
                    faults["stops"] += 1
                elif roll < 0.9:
                    i = rng.choice(live)
                    killed_addrs.add(sw.members[i].addr)
                    original.pop(i, None)
                    sw.kill(i)
                    sw.members[i].proc.wait(10)
                    sw.replace(i)
                    faults["kills"] += 1
            time.sleep(0.2)
        samples.append(_member_usage([sw.members[i].pid for i in range(sw.n) if sw.alive(i)]))
        clients: dict[str, Any] = {
            "asked": 0,
            "answered": 0,
            "unanswered": 0,
            "retries": 0,
            "monitor_events": 0,
            "monitor_sessions": 0,
            "errors": [],
        }
        for out, proc in client_procs:
            try:
                proc.wait(180)
                data = json.loads(out.read_text())
                for k in clients:
                    clients[k] += data[k]
            except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
                clients["errors"].append(f"client process: {exc}")
        time.sleep(timers.unresponsive)
        false_dead, false_hung = [], []
        for i in range(sw.n):
            if not sw.alive(i):
                continue
            for e in sw.events(i, "PEER_DEAD"):
                if e["addr"] not in killed_addrs and e["addr"] != sw.members[i].addr:
                    false_dead.append(e)
            for e in sw.events(i, "PEER_HUNG"):
                if e["addr"] not in killed_addrs and e["addr"] not in stopped:
                    false_hung.append(e)
        missed = [
            (i, a)
            for i in range(sw.n)
            if sw.alive(i)
            for a in killed_addrs
            if a not in {e["addr"] for e in sw.events(i, "PEER_DEAD")}
            and a != sw.members[i].addr
            and _known_before(sw, i, a)
        ]
        for p in busy:
            p.kill()
            p.wait()
        # The same processes at both ends: the members alive at the end of the warm-up and never killed since.
        before, after = (samples[0], samples[-1]) if samples else ({}, {})
        same = sorted(set(before) & set(after) & set(original.values()))
        rss0, fds0 = (sum(before[p][k] for p in same) for k in (0, 1)) if same else (1, 0)
        rss1, fds1 = (sum(after[p][k] for p in same) for k in (0, 1)) if same else (1, 0)
        result = {
            "minutes": round((time.monotonic() - started) / 60, 2),
            "faults": faults,
            "clients": clients,
            "false_dead": len(false_dead),
            "false_hung": len(false_hung),
            "false_examples": (false_dead + false_hung)[:3],
            "missed_deaths": len(missed),
            "rss_growth_pct": round(100 * (rss1 / rss0 - 1), 2),
            "fd_growth": fds1 - fds0,
            "members_measured": len(same),
            **_growth_shape(samples),
            "cpu_work_done_during_soak": cpu.done,
        }
    return result


def _growth_shape(samples: list[dict[int, tuple[int, int]]]) -> dict:
    """How memory grew over the soak, beyond its two ends: per interval between samples, the RSS growth of the
    members alive at both of its samples (same pids, summed), and the same over the second half alone. A leak grows
    at a steady rate; structures filling towards their bounds grow less and less."""

    def growth(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]) -> tuple[float | None, int]:
        same = set(a) & set(b)
        before = sum(a[p][0] for p in same)
        return (round(100 * (sum(b[p][0] for p in same) / before - 1), 2) if before else None), len(same)

    if len(samples) < 3:
        return {}
    middle = samples[len(samples) // 2]
    second_half, members = growth(middle, samples[-1])
    return {
        "rss_growth_by_interval_pct": [growth(a, b)[0] for a, b in itertools.pairwise(samples)],
        "rss_growth_second_half_pct": second_half,
        "members_second_half": members,
    }


def _known_before(sw, i: int, addr: str) -> bool:
    """Member ``i`` (as it is now) knew the killed process (a member restarted after a kill may never have)."""
    return addr in {e["addr"] for e in sw.events(i, "PEER_NEW")}


# ----------------------------------------------------------------------------------------------------------------
# Partitions with loss and delay


def partitions(workdir: Path) -> dict:
    from multihost import HostSwarm, report_view
    from netns import Network

    env = {"TORCHRAS_TIMEOUT_FACTOR": "0.2", "TORCHRAS_SWARM_STEP_S": "0"}
    with Network(3) as net:
        h0, h1, h2 = net.hosts
        net.delay(h1, 0.03, jitter=0.02)
        with HostSwarm(net, 6, env=env, workdir=str(workdir / "partition")) as sw:
            net.loss(0.1)
            with net.isolate(h2):
                time.sleep(4.0)
            with net.link_down(h0):
                time.sleep(3.0)
            net.heal()
            end = time.monotonic() + 30
            views = []
            while time.monotonic() < end:
                views = [report_view(sw.query(h)) for h in net.hosts]
                if all(v.get("dead") == 0 and v.get("missing") == 0 for v in views):
                    break
                time.sleep(0.5)
            false_dead = sum(len(sw.verdicts(i)) for i in range(sw.n))
            hung = sum(len(sw.verdicts(i, "PEER_HUNG")) for i in range(sw.n))
            agree = len({json.dumps(v, sort_keys=True) for v in views}) == 1
    return {"false_dead": false_dead, "hung_verdicts": hung, "reports_agree": agree, "views": views}


# ----------------------------------------------------------------------------------------------------------------
# No false MISMATCH from timing


def _free_port(start: int) -> int:
    for port in range(start, start + 500):
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port")


def _nccl_rule_mismatch(doc: dict) -> bool:
    """NCCL's rule on one JSON report: any difference in launch counts among a communicator's ranks."""
    for comm in doc.get("communicators", []):
        counts = {tuple(sorted(r["collective_counts"].items())) for r in comm.get("ranks", [])}
        if len(counts) > 1:
            return True
    return False


def _hammer(port: int, queries: int, clients: int = 4) -> dict:
    from ras_client import ask

    lock = threading.Lock()
    stats: dict[str, Any] = {
        "ours": 0,
        "ours_mismatch": 0,
        "baseline": 0,
        "baseline_mismatch": 0,
        "failed": 0,
        "example": "",
    }
    per_client = queries // clients * 4 // 3  # every fourth query is a JSON one, for the baseline

    def run(k: int) -> None:
        for q in range(per_client):
            json_turn = q % 4 == 3
            try:
                if json_turn:
                    doc = json.loads(ask(port, b"SET FORMAT json\nSTATUS\n", timeout=30).removeprefix("OK\n"))
                    bad = _nccl_rule_mismatch(doc)
                else:
                    text = ask(port, b"STATUS\n", timeout=30)
                    bad = "MISMATCH" in text
            except (OSError, ValueError, AssertionError):
                with lock:
                    stats["failed"] += 1
                continue
            with lock:
                key = "baseline" if json_turn else "ours"
                stats[key] += 1
                stats[key + "_mismatch"] += bad
                if bad and not json_turn and not stats["example"]:
                    stats["example"] = text[-1500:]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats


def timing(queries: int, workdir: Path) -> dict:
    from rasd.swarm import Swarm

    out = {}
    port = _free_port(29600)
    env = {
        "TORCHRAS_DEFAULT_ADDR": f"localhost:{port}",
        "TORCHRAS_RUN_DIR": str(workdir / "endpoints-swarm"),
        "TORCHRAS_SWARM_STEP_S": "0.02",
    }  # default timers: the in-flight grace a user has (2 s)
    started = time.monotonic()
    with Swarm(8, env=env):
        out["swarm"] = _hammer(port, queries)
    out["swarm"]["seconds"] = round(time.monotonic() - started, 1)
    # A real gloo job: 4 ranks of tests/reliability/gloo_worker.py on loopback, one all_reduce every 50 ms.
    port = _free_port(port + 10)
    gloo_dir = workdir / "gloo"
    gloo_dir.mkdir(exist_ok=True)
    base = {
        **os.environ,
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port(29450)),
        "TORCHRAS_ADDR": f"localhost:{port}",
        "TORCHRAS_RUN_DIR": str(workdir / "endpoints-gloo"),
    }
    worker = REPO / "tests" / "reliability" / "gloo_worker.py"
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(gloo_dir)],
            env={**base, "RANK": str(r)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            cwd=str(REPO),
        )
        for r in range(4)
    ]
    try:
        deadline = time.monotonic() + 180
        while not all((gloo_dir / f"rank{r}.json").exists() for r in range(4)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("the gloo job did not start")
            time.sleep(0.2)
        started = time.monotonic()
        out["gloo"] = _hammer(port, queries)
        out["gloo"]["seconds"] = round(time.monotonic() - started, 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


# ----------------------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    if argv and argv[0] == "_clients":
        return clients_main(argv[1:])
    parser = argparse.ArgumentParser(description="reliability figures (issue 14)")
    parser.add_argument("--soak-minutes", type=float, default=30.0)
    parser.add_argument("--fault-every", type=float, default=15.0, help="seconds between soak faults")
    parser.add_argument("--fuzz-inputs", type=int, default=1_000_000, help="per port")
    parser.add_argument("--sim-seeds", type=int, default=10_000)
    parser.add_argument("--sim-first", type=int, default=0, help="the first sweep seed (the others follow it)")
    parser.add_argument("--mismatch-queries", type=int, default=10_000, help="per job (swarm, gloo)")
    parser.add_argument(
        "--cpu-minutes",
        type=float,
        default=0.0,
        help="stop the fuzz and sweep work this long after the start (0: no limit)",
    )
    parser.add_argument("--skip", default="", help="comma-separated phases to skip: soak,partition,timing")
    parser.add_argument("--workers", type=int, default=2, help="processes for the fuzz and sweep work")
    parser.add_argument(
        "--busy-loops",
        type=int,
        default=2,
        help="busy-looping processes that keep the cores saturated during the soak once the fuzz and sweep work is"
        " done (0: programs started beside this run saturate them, e.g. tests/reliability/sweep.py processes)",
    )
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    import tempfile

    from netns import namespaces_unavailable

    reason = namespaces_unavailable()
    if reason and not {"soak", "partition"} <= skip:
        print(f"network namespaces unavailable ({reason}): soak and partition phases skipped", file=sys.stderr)
        skip |= {"soak", "partition"}
    work = Path(tempfile.mkdtemp(prefix="torchras-faults-"))
    began = time.monotonic()
    cpu = CpuWork(args.fuzz_inputs, args.sim_seeds, args.workers, args.sim_first)
    soak_out = soak(args.soak_minutes, cpu, args.fault_every, work, args.busy_loops) if "soak" not in skip else {}
    cpu.wait(began + args.cpu_minutes * 60 if args.cpu_minutes else float("inf"))
    part = partitions(work) if "partition" not in skip else {}
    tim = timing(args.mismatch_queries, work) if "timing" not in skip else {}

    fuzz_results = [r for r in cpu.results if r["kind"] == "fuzz"]
    sweep_results = [r for r in cpu.results if r["kind"] == "sweep"]
    fuzz_by_port = {p: sum(r["inputs"] for r in fuzz_results if r["port"] == p) for p in ("mesh", "client")}
    fuzz_crashes = sum(r["crash_count"] for r in fuzz_results)
    fuzz_hangs = sum(r["hangs"] for r in fuzz_results)
    fuzz_verdict_changes = sum(r["verdict_changes"] for r in fuzz_results)
    fuzz_rss_growth_pct = _fuzz_rss_growth_pct(fuzz_results)
    sizes: dict[int, int] = {}
    for r in sweep_results:
        for n in r["nodes"]:
            sizes[n] = sizes.get(n, 0) + 1
    violations = [v for r in sweep_results for v in r["violations"]]
    sim_seeds = sum(r["seeds"] for r in sweep_results)
    swept = sorted(s for r in sweep_results for s in r["seed_list"])

    rows = [
        ("fuzz inputs, mesh port (frames; node pre-/post-auth)", f"{fuzz_by_port['mesh']:,}", ""),
        ("fuzz inputs, client port", f"{fuzz_by_port['client']:,}", ""),
        (
            "fuzz crashes / hangs / verdict changes",
            f"{fuzz_crashes} / {fuzz_hangs} / {fuzz_verdict_changes}",
            "target 0 / 0 / 0",
        ),
        (
            "fuzz worker RSS growth, first task's end to last's",
            "-" if fuzz_rss_growth_pct is None else f"{fuzz_rss_growth_pct} %",
            "memory flat: the largest of any worker; its first task, warm-up included: "
            + ", ".join(f"{mb:+.1f} MB" for mb in _first_task_growth_mb(fuzz_results)),
        ),
        (
            "fuzz slowest single input",
            f"{max((r['slowest_s'] for r in fuzz_results), default=0):.3f} s",
            "hang limit 1 s",
        ),
        ("sim seeds (nodes: count)", sim_seeds, ", ".join(f"{n}: {c}" for n, c in sorted(sizes.items()))),
        ("sim property violations", len(violations), "target 0"),
    ]
    if swept:
        rows.append(("sim seeds run (first, last)", f"{swept[0]}, {swept[-1]}", "chunks of 10, whole chunks only"))
    if soak_out:
        c = soak_out["clients"]
        rows += [
            (
                "soak minutes (16 members, 3 hosts)",
                soak_out["minutes"],
                f"{soak_out['faults']['stops']} stops, {soak_out['faults']['kills']} kills+restarts",
            ),
            (
                "soak false verdicts (DEAD + HUNG)",
                soak_out["false_dead"] + soak_out["false_hung"],
                f"DEAD {soak_out['false_dead']}, HUNG {soak_out['false_hung']}; "
                f"kills missed {soak_out['missed_deaths']}",
            ),
            (
                "soak queries asked / answered / unanswered",
                f"{c['asked']} / {c['answered']} / {c['unanswered']}",
                f"{c['retries']} retries; {c['monitor_sessions']} MONITOR sessions, {c['monitor_events']} events",
            ),
            (
                "soak RSS growth of members never killed",
                f"{soak_out['rss_growth_pct']} %",
                f"fds {soak_out['fd_growth']:+d} over {soak_out['members_measured']} members",
            ),
            (
                "soak RSS growth over the second half",
                f"{soak_out.get('rss_growth_second_half_pct')} %",
                f"{soak_out.get('members_second_half')} members alive through it; by interval (%): "
                + ", ".join(map(str, soak_out.get("rss_growth_by_interval_pct", []))),
            ),
        ]
    if part:
        rows += [
            (
                "partition/loss/delay/link-down: false PEER_DEAD",
                part["false_dead"],
                f"HUNG verdicts {part['hung_verdicts']}; reports agree after heal: {part['reports_agree']}",
            )
        ]
    for job in ("swarm", "gloo"):
        if job in tim:
            s = tim[job]
            rows += [
                (
                    f"false MISMATCH, healthy {job}: ours",
                    f"{s['ours_mismatch']} / {s['ours']}",
                    f"{s['seconds']} s, {s['failed']} failed queries",
                ),
                (
                    "  same job, NCCL's rule on JSON reports",
                    f"{s['baseline_mismatch']} / {s['baseline']}",
                    "baseline, same run",
                ),
            ]
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>22}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {str(value):>22}  {note}")
    for v in violations[:5]:
        print(f"violation: seed {v[0]}: {v[1]}  repro: {v[2]}")
    for r in fuzz_results:
        for crash in r["crashes"][:2] + r.get("hang_examples", []) + r.get("verdict_examples", []):
            print(f"fuzz finding: {crash}")
    for job in ("swarm", "gloo"):
        if tim.get(job, {}).get("example"):
            print(f"first false MISMATCH, {job}:\n{tim[job]['example']}")
    if soak_out and soak_out["false_examples"]:
        print(f"soak false verdict examples: {soak_out['false_examples']}")
    if soak_out and soak_out["clients"]["errors"]:
        print(f"soak client errors: {soak_out['clients']['errors'][:5]}")
    print(
        f"total {time.monotonic() - began:.0f} s; cpu work {cpu.seconds:.0f} s"
        + (" (stopped at --cpu-minutes: the figures are what fit)" if cpu.cut_short else "")
    )
    figures = {
        "fuzz_inputs": fuzz_by_port["mesh"] + fuzz_by_port["client"],
        "fuzz_inputs_mesh": fuzz_by_port["mesh"],
        "fuzz_inputs_client": fuzz_by_port["client"],
        "fuzz_crashes": fuzz_crashes,
        "fuzz_hangs": fuzz_hangs,
        "fuzz_verdict_changes": fuzz_verdict_changes,
        "fuzz_rss_growth_pct": fuzz_rss_growth_pct,
        "soak_minutes": soak_out.get("minutes", 0),
        "soak_false_verdicts": soak_out["false_dead"] + soak_out["false_hung"] if soak_out else None,
        "soak_unanswered_queries": soak_out["clients"]["unanswered"] if soak_out else None,
        "soak_queries": soak_out["clients"]["asked"] if soak_out else None,
        "soak_rss_growth_pct": soak_out.get("rss_growth_pct"),
        "soak_fd_growth": soak_out.get("fd_growth"),
        "soak_rss_growth_second_half_pct": soak_out.get("rss_growth_second_half_pct"),
        "soak_rss_growth_by_interval_pct": soak_out.get("rss_growth_by_interval_pct"),
        "partition_false_dead": part.get("false_dead"),
        "sim_seeds": sim_seeds,
        "sim_violations": len(violations),
        "sim_nodes": sizes,
        "mismatch_false_swarm": tim.get("swarm", {}).get("ours_mismatch"),
        "mismatch_queries_swarm": tim.get("swarm", {}).get("ours"),
        "mismatch_baseline_swarm": tim.get("swarm", {}).get("baseline_mismatch"),
        "mismatch_false_gloo": tim.get("gloo", {}).get("ours_mismatch"),
        "mismatch_queries_gloo": tim.get("gloo", {}).get("ours"),
        "mismatch_baseline_gloo": tim.get("gloo", {}).get("baseline_mismatch"),
    }
    print(json.dumps(figures))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
