"""What rasd costs a training loop, and how long a stalled rank takes to be named: ``python bench/overhead.py``.

Workload: 4 gloo processes on this machine's CPU, an all-reduce loop on a small tensor (4 floats) and on a 1 MiB
tensor (262,144 floats), steps per second measured on rank 0 (the all-reduce keeps the ranks in lock step).

With rasd = what ``rasd.install()`` before ``init_process_group`` gives a job: torch.distributed's functions
wrapped and counting, this process's RAS node running (its thread, keepalives on every link, the sweeper's counter
gathers every 5 s, the client port). Without = torch alone: the original functions and no rasd thread.

Fairness: the two arms alternate **inside the same 4 processes**, in blocks of a fixed number of steps, in the
order with, without, without, with, ... (ABBA: a drift of the machine weighs on both arms alike, and each arm
follows a switch in half of its blocks). At a switch every rank changes at the same step: to leave,
``rasd.torch.uninstall()`` then ``rasd.stop()``; to come back, ``rasd.torch.install()`` then a fresh node from
the job's store (a new bootstrap prefix per switch); then the same settle time in both arms. Whole jobs A/B/A/B
would compare different process placements, ports and import states, and each costs seconds of ``import torch``.
The slowdown of a size is the median over adjacent (with, without) block pairs of ``rate_without / rate_with -
1``, shown with the interquartile range of those pairs: on a 2-core machine running 4 busy processes, blocks differ
by 10-20 % among themselves, far more than the effect, so the median carries a few per cent of uncertainty.

Two direct measurements resolve what that cannot: the CPU time of rasd's threads during the with-blocks (all
ranks, as a share of the machine: on a saturated machine, CPU taken from training), and the hooks' own cost per
call (a counted no-op against the bare no-op, on a private registry), as a share of a step.

Stuck verdict: then, with rasd on and default timers (stuck limit 20 s, sweep every 5 s; ``--factor`` scales
both, ``--stuck-limit`` sets the limit before scaling), rank 2 stops before an all-reduce that ranks 0, 1 and 3
enter, and waits on its own node's COMM_STUCK event before joining; the time from the stall to the verdict's
arrival is taken on every rank. Expected: the stuck limit plus up to one sweep plus a gather.

The table's last line is one JSON object: ``slowdown_pct_small``, ``slowdown_pct_1mb`` (per cent fewer steps per
second with rasd; negative: faster, i.e. noise), ``stuck_verdict_s`` (median over ranks and stalls, in seconds at
the factor used), and the context: the factor, the stuck limit and sweep in seconds, the hook's ns per call and
rasd's CPU share.
"""

from __future__ import annotations

import argparse
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
WORLD = 4
SIZES = {"small": 4, "1mb": 262_144}


# ----------------------------------------------------------------------------------------------------------------
# One rank


def _switch(on: bool, block: int, rank: int, hooks_only: bool = False) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import rasd
    import rasd.torch
    from rasd.services import client_port

    if hooks_only:  # the node runs in both arms: only the wrappers come and go
        if on:
            rasd.torch.install()
        else:
            rasd.torch.uninstall()
    elif on:
        hooks = rasd.torch.install()
        rasd.start(
            c10d._get_default_store(),
            rank=rank,
            prefix=f"torchras-bench/{block}",
            local_data=hooks.snapshot,
            services=[client_port.serve],
        )
    else:
        rasd.torch.uninstall()
        rasd.stop()
    dist.barrier()


def _settle(seconds: float, on: bool) -> None:
    """Let a fresh node connect to its peers before a measured block (the same wait in both arms)."""
    import rasd

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    if on:
        assert rasd.node() is not None


def _hook_cost_ns(calls: int = 200_000) -> float:
    """The wrapper's own cost per call: a counted no-op against the bare no-op (a private registry, so the job's
    counters are untouched)."""
    import torch.distributed.distributed_c10d as c10d

    from rasd.core.comms import OP_TYPES
    from rasd.core.registry import CommRegistry, LocalComm
    from rasd.torch.hooks import TorchHooks

    def all_reduce(tensor, op=None, group=None, async_op=False):  # same signature
        return None

    hooks = TorchHooks(CommRegistry(), start_mesh=False)
    world = c10d.GroupMember.WORLD
    hooks.by_group[id(world)] = LocalComm(comm_hash=1, size=4, rank=0)
    # The real group's sequence number, read before and after the call as in a job (rasd.torch.records).
    hooks.seq_readers[id(world)] = getattr(world, "_get_sequence_number_for_group")  # noqa: B009 - untyped
    counted = hooks._counting(all_reduce, OP_TYPES.index("AllReduce"))
    best = {}
    for name, fn in (("bare", all_reduce), ("counted", counted)):
        runs = []
        for _ in range(5):
            started = time.perf_counter_ns()
            for _ in range(calls):
                fn(None)
            runs.append((time.perf_counter_ns() - started) / calls)
        best[name] = min(runs)
    return best["counted"] - best["bare"]


def _record_read_ms(reads: int = 7) -> tuple[float, int]:
    """The RAS thread's cost of one Flight Recorder read (dump, parse, count) with the ring as the job left it:
    (median milliseconds, entries in the ring). The dump holds the GIL throughout (docs/operations.md)."""
    import torch.distributed.distributed_c10d as c10d

    from rasd.core.registry import LocalComm
    from rasd.torch.records import RecordCounter, _dump_flight_recorder

    entries = len(json.loads(_dump_flight_recorder())["entries"])
    times = []
    for _ in range(reads):
        counter = RecordCounter(flight_recorder=True)
        counter.add(c10d.GroupMember.WORLD, LocalComm(comm_hash=1, size=4, rank=0), created_ns=0)
        counter.groups[next(iter(counter.groups))].fr_seq = 0  # count the whole ring, as a first read does
        started = time.perf_counter()
        counter._read(0.0)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), entries


def worker(args: argparse.Namespace) -> int:
    import datetime
    import warnings

    warnings.filterwarnings("ignore")
    import threading

    import psutil
    import torch
    import torch.distributed as dist

    import rasd

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    rasd.install()  # the first arm is "with": installed before init, as a user does
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    out: dict = {"rank": rank, "blocks": []}
    on = True
    block = 0
    me = psutil.Process()

    def rasd_cpu() -> float:
        # rasd's threads: the node, its event dispatcher, asyncio's executor (every Python thread but this one)
        ids = {t.native_id for t in threading.enumerate() if t is not threading.main_thread()}
        return sum(t.user_time + t.system_time for t in me.threads() if t.id in ids)

    def server_cpu() -> float:
        # The metrics server process this rank started (rasd.services.metrics_server), in the scrape arm.
        for child in me.children():
            try:
                if "rasd.services.metrics_server" in child.cmdline():
                    times = child.cpu_times()
                    return times.user + times.system
            except psutil.Error:
                continue
        return 0.0

    if args.arm == "scrape":
        # The server process starts at nice 19 and imports for a while on this saturated machine: wait until it
        # answers, so that its start is not counted as serving.
        first = _Target(args.metrics_base + rank)
        first.scrape(deadline_s=120.0)
        first.close()

    for size_name, numel in SIZES.items():
        if size_name not in args.sizes.split(","):
            continue
        steps = args.steps_small if size_name == "small" else args.steps_1mb
        t = torch.ones(numel)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        size_started = time.monotonic()
        server_started = server_cpu()
        if args.arm == "scrape" and rank == 0 and on:
            (Path(args.out) / "scrape").touch()  # the first block is a "with" block
        i = 0
        go = torch.ones(1)
        while True:
            want = (i % 4) in (0, 3)  # with, without, without, with, ...
            if want != on and args.arm == "scrape":
                # rasd and its metrics run in both arms; "with" is the scraper at work (rank 0 tells it)
                if rank == 0 and want:
                    (Path(args.out) / "scrape").touch()
                elif rank == 0:
                    (Path(args.out) / "scrape").unlink(missing_ok=True)
                on = want
            elif want != on:
                block += 1
                _switch(want, block, rank, args.arm == "hooks")
                on = want
            _settle(args.settle, on)
            dist.barrier()
            cpu = rasd_cpu()
            started = time.perf_counter()
            for _ in range(steps):
                dist.all_reduce(t)
            elapsed = time.perf_counter() - started
            out["blocks"].append(
                {"size": size_name, "rasd": on, "steps": steps, "seconds": elapsed, "rasd_cpu": rasd_cpu() - cpu}
            )
            i += 1
            if i % 2 == 0:  # after each pair, rank 0 says whether this size's time is up
                go.fill_(1.0 if time.monotonic() - size_started < args.seconds_per_size else 0.0)
                dist.broadcast(go, 0)
                if go.item() == 0.0:
                    break
        out.setdefault("server_cpu", 0.0)
        out["server_cpu"] += server_cpu() - server_started
    if not on and args.arm != "scrape":
        block += 1
        _switch(True, block, rank)
    if rank == 0 and args.arm == "scrape":
        (Path(args.out) / "scrape").unlink(missing_ok=True)
    # Stalls: rank 2 stops before an all-reduce the others enter, until its own node names the communicator.

    seen: list[tuple[float, str]] = []
    arrived = threading.Event()

    def on_stuck(event) -> None:  # rasd.Event, on the dispatcher thread
        seen.append((time.time(), event.details))
        arrived.set()

    rasd.on_event(on_stuck, kinds={rasd.Kind.COMM_STUCK})
    out["stalls"] = []
    t = torch.ones(4)
    for _ in range(args.stalls):
        dist.barrier()
        before = len(seen)
        arrived.clear()
        started = time.time()
        if rank == 2 and not arrived.wait(timeout=args.stuck_limit * args.factor * 3 + 60):
            raise SystemExit("overhead: no COMM_STUCK verdict")
        dist.all_reduce(t)  # ranks 0, 1, 3 block here until rank 2 comes
        dist.barrier()
        mine = seen[before : before + 1]
        out["stalls"].append(
            {"started": started, "verdict": mine[0][0] if mine else None, "details": mine[0][1] if mine else None}
        )
    if rank == 0:
        out["hook_ns"] = _hook_cost_ns()
        out["record_read_ms"], out["record_ring_entries"] = _record_read_ms()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    return 0


#: What Prometheus 3 asks for: OpenMetrics first, the text format as a fallback.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;"
    "version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


class _Target:
    """One rank's /metrics over a kept-alive HTTP/1.1 connection, as Prometheus scrapes a target."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.request = (
            f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {PROMETHEUS_ACCEPT}\r\n"
            "User-Agent: overhead-scraper\r\n\r\n"
        ).encode()

    def scrape(self, deadline_s: float = 5.0) -> None:
        """One scrape, whole; raises OSError (and drops the connection) on any failure."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=deadline_s)
            self.sock.sendall(self.request)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise OSError("connection closed")
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200 "):
                raise OSError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
            length = next(
                int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")
            )
            while len(body) < length:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise OSError("connection closed")
                body += chunk
        except (OSError, StopIteration, ValueError) as e:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
            raise OSError(str(e)) from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def scraper(args: argparse.Namespace) -> int:
    """Scrape every rank's /metrics, round robin, ``--scrape-rate`` times a second while ``OUT/scrape`` exists,
    until ``OUT/done`` does; write how many scrapes it made in how long, and its own CPU time.

    At nice 19: it stands in for a Prometheus server on another machine, so on this saturated machine it takes only
    CPU that training leaves; each rank's connection is kept alive, as Prometheus keeps its connections."""
    os.nice(19)
    out = Path(args.out)
    targets = [_Target(args.metrics_base + r) for r in range(WORLD)]
    made, failed, busy = 0, 0, 0.0
    interval = 1.0 / args.scrape_rate
    cpu = time.process_time()
    while not (out / "done").exists():
        if not (out / "scrape").exists():
            time.sleep(0.01)
            continue
        began = time.monotonic()
        next_at = began
        while (out / "scrape").exists():
            try:
                targets[(made + failed) % WORLD].scrape()
                made += 1
            except OSError:
                failed += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                next_at = time.monotonic()  # far behind (the machine is saturated): no burst to catch up
        busy += time.monotonic() - began
    summary = {"scrapes": made, "failed": failed, "seconds": busy, "cpu": time.process_time() - cpu}
    (out / "scraper.json").write_text(json.dumps(summary))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# The driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace) -> dict:
    out = Path(tempfile.mkdtemp(prefix="torchras-overhead-"))
    master = _free_port()
    cmd = [sys.executable, __file__, "--worker", "--out", str(out)] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("worker", "scraper", "out")
    ]
    env = dict(
        os.environ,
        WORLD_SIZE=str(WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        TORCH_CPP_LOG_LEVEL="ERROR",
        TORCHRAS_ADDR=f"localhost:{args.port}",
        TORCHRAS_RUN_DIR=str(out / "endpoints"),
        TORCHRAS_TIMEOUT_FACTOR=str(args.factor),
        TORCHRAS_STUCK_LIMIT=str(args.stuck_limit),
    )
    scraping = None
    if args.arm == "scrape":
        env["TORCHRAS_METRICS_ADDR"] = f"127.0.0.1:{args.metrics_base}"  # + LOCAL_RANK: a port per rank
        scraping = subprocess.Popen([*cmd[:2], "--scraper", "--out", str(out)] + cmd[5:], env=env)
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(WORLD)]
    try:
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise SystemExit(f"overhead: the job did not finish within {args.timeout}s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    if scraping is not None:
        (out / "done").touch()
        scraping.wait(30)
    if any(p.returncode for p in procs):
        raise SystemExit(f"overhead: a rank failed: {[p.returncode for p in procs]}")
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}
    if scraping is not None:
        results[0]["scraper"] = json.loads((out / "scraper.json").read_text())
    return results


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return q[0], q[2]


def summarize(results: dict, args: argparse.Namespace) -> tuple[list[str], dict]:
    cpus = os.cpu_count() or 1
    lines = [
        f"rasd overhead ({args.arm}): {WORLD} gloo processes on {cpus} CPUs; with and without rasd in "
        f"alternating blocks (ABBA) in the same processes, {args.seconds_per_size:g} s of blocks per size",
        "",
    ]
    lines.append(
        f"{'tensor':>6}  {'pairs':>5}  {'steps/block':>11}  {'with (steps/s)':>14}  {'without':>8}  "
        f"{'slowdown':>8}  {'pairs IQR':>17}  {'rasd threads CPU':>16}"
    )
    summary: dict = {}
    blocks = results[0]["blocks"]
    step_ms: dict = {}
    for size in [x for x in SIZES if x in args.sizes.split(",")]:
        mine = [b for b in blocks if b["size"] == size]

        def rate(block: dict) -> float:
            return block["steps"] / block["seconds"]

        with_rates = [rate(b) for b in mine if b["rasd"]]
        without_rates = [rate(b) for b in mine if not b["rasd"]]
        ratios = []
        for i in range(0, len(mine) - 1, 2):  # (with, without), (without, with), ...: each block in one pair
            a, b = mine[i], mine[i + 1]
            w, wo = (a, b) if a["rasd"] else (b, a)
            ratios.append((rate(wo) / rate(w) - 1) * 100)
        slowdown = statistics.median(ratios)
        summary[size] = slowdown
        step_ms[size] = 1000 / statistics.median(without_rates)
        lo, hi = _quartiles(ratios)
        # CPU of rasd's threads during the with-blocks, all ranks: a share of the machine taken from training.
        cpu = sum(b["rasd_cpu"] for d in results.values() for b in d["blocks"] if b["size"] == size and b["rasd"])
        wall = sum(b["seconds"] for b in mine if b["rasd"])
        share = cpu / wall / cpus * 100
        summary[f"cpu_{size}"] = share
        lines.append(
            f"{size:>6}  {len(ratios):>5}  {mine[0]['steps']:>11}  {statistics.median(with_rates):>14.1f}  "
            f"{statistics.median(without_rates):>8.1f}  {slowdown:>+7.2f}%  {lo:>+7.2f}%..{hi:>+6.2f}%  "
            f"{share:>14.3f}%"
        )
    hook_ns = results[0].get("hook_ns", 0.0)
    lines.append("")
    lines.append(
        "slowdown: median over pairs of rate_without/rate_with - 1 (IQR: the middle half of the pairs; "
        "this machine's block-to-block noise)."
    )
    lines.append(
        f"rasd threads CPU: CPU time of rasd's threads in the with-blocks, all {WORLD} ranks, as a share of "
        f"the {cpus} CPUs."
    )
    lines.append(
        f"hook cost: {hook_ns:.0f} ns per counted call = "
        + ", ".join(f"{hook_ns / 1e6 / step_ms[s] * 100:.3f}% of a {s} step ({step_ms[s]:.2f} ms)" for s in step_ms)
    )
    read_ms, ring = results[0].get("record_read_ms"), results[0].get("record_ring_entries")
    if read_ms is not None:
        from rasd.torch.records import FR_READ_EVERY

        lines.append(
            f"records read (RAS thread, GIL held): {read_ms:.1f} ms per Flight Recorder read of {ring} entries; at "
            f"most one per {FR_READ_EVERY:g} s while collectives beneath the hooks move "
            f"({read_ms / 10 / FR_READ_EVERY:.3f}% of the time), once more when a communicator goes quiet"
        )
    delays = []
    for data in results.values():
        for k, s in enumerate(data["stalls"]):
            if s["verdict"] is not None:
                delays.append(s["verdict"] - results[2]["stalls"][k]["started"])
    lines.append("")
    verdict = statistics.median(delays) if delays else None
    lines.append(
        f"stuck verdict: factor {args.factor:g}, stuck limit {args.stuck_limit * args.factor:g} s, sweep "
        f"{5.0 * args.factor:g} s; {args.stalls} stall(s) of rank 2; stall -> COMM_STUCK at each rank: "
        + ", ".join(f"{d:.1f}" for d in sorted(delays))
        + " s"
        + (f" (median {verdict:.1f} s)" if verdict is not None else " (no verdict)")
    )
    details = {s.get("details") for d in results.values() for s in d["stalls"] if s.get("details")}
    for d in sorted(details):
        lines.append(f"  verdict: {d}")
    scraped = results[0].get("scraper")
    server_us = scraper_us = None
    if scraped is not None:
        achieved = scraped["scrapes"] / scraped["seconds"] if scraped["seconds"] else 0.0
        server_cpu = sum(d.get("server_cpu", 0.0) for d in results.values())
        if scraped["scrapes"]:
            server_us = server_cpu / scraped["scrapes"] * 1e6
            scraper_us = scraped["cpu"] / scraped["scrapes"] * 1e6
        lines.append(
            f"scrape arm: 'with' = a scraper at nice 19 (it stands in for a Prometheus on another machine) hitting "
            f"the {WORLD} ranks' /metrics in turn on kept-alive connections, OpenMetrics accepted (asked "
            f"{args.scrape_rate:g}/s): {scraped['scrapes']} scrapes in {scraped['seconds']:.1f} s, {achieved:.0f}/s, "
            f"{scraped['failed']} failed; rasd and its metrics ran in both arms"
        )
        quiet = [b for b in blocks if not b["rasd"]]
        quiet_cpu = sum(b["rasd_cpu"] for d in results.values() for b in d["blocks"] if not b["rasd"])
        quiet_wall = sum(b["seconds"] for b in quiet)
        if quiet_wall:
            lines.append(
                f"  rasd threads CPU in the blocks without the scraper: {quiet_cpu / quiet_wall / cpus * 100:.3f}% "
                "(with it, the table's column: the difference is rendering for the scrapes)"
            )
        if server_us is not None and scraper_us is not None:
            share = server_us * args.scrape_rate / 1e4  # per cent of one core
            lines.append(
                f"  serving: {server_us:.0f} us of CPU per scrape in the metrics server processes (nice 19, outside "
                f"the training processes; {server_cpu:.2f} s in all), {scraper_us:.0f} us in the scraper; on a node "
                f"with free cores, {args.scrape_rate:g} scrapes/s would take {share:.1f} % of one core there"
            )
    doc = {
        "slowdown_pct_small": _round(summary.get("small")),
        "slowdown_pct_1mb": _round(summary.get("1mb")),
        "stuck_verdict_s": round(verdict, 2) if verdict is not None else None,
        "timeout_factor": args.factor,
        "stuck_limit_s": args.stuck_limit * args.factor,
        "sweep_s": 5.0 * args.factor,
        "hook_ns_per_call": round(hook_ns, 1),
        "hook_pct_of_1ms_collective": _round(hook_ns / 1e6 * 100, 3),
        "record_read_ms": _round(read_ms) if read_ms is not None else None,
        "record_ring_entries": ring,
        "rasd_cpu_pct": _round(statistics.mean([v for k, v in summary.items() if k.startswith("cpu_")]), 3),
        "arm": args.arm,
    }
    if scraped is not None:
        doc["scrapes_per_s"] = _round(scraped["scrapes"] / scraped["seconds"] if scraped["seconds"] else 0.0, 1)
        doc["scrapes_failed"] = scraped["failed"]
        doc["server_cpu_us_per_scrape"] = _round(server_us, 1)
        doc["scraper_cpu_us_per_scrape"] = _round(scraper_us, 1)
    return lines, doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds-per-size", type=float, default=100.0, help="time for with/without pairs per size")
    ap.add_argument("--steps-small", type=int, default=400, help="steps per block, 4-float tensor")
    ap.add_argument("--steps-1mb", type=int, default=150, help="steps per block, 1 MiB tensor")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--settle", type=float, default=0.3, help="seconds before each block (mesh connect)")
    ap.add_argument("--stalls", type=int, default=2)
    ap.add_argument("--sizes", default="small,1mb", help="tensor sizes to measure (small, 1mb)")
    ap.add_argument(
        "--arm",
        choices=("full", "hooks", "scrape"),
        default="full",
        help="what 'with' adds: full (hooks and node, the default), hooks (the node runs in both arms), or scrape "
        "(rasd and its Prometheus metrics run in both arms; 'with' is a scraper at --scrape-rate, at nice 19)",
    )
    ap.add_argument("--scrape-rate", type=float, default=1000.0, help="scrapes a second in the scrape arm")
    ap.add_argument("--metrics-base", type=int, default=29640, help="the scrape arm's metrics port of rank 0")
    ap.add_argument("--factor", type=float, default=1.0, help="TORCHRAS_TIMEOUT_FACTOR (scales stuck and sweep)")
    ap.add_argument("--stuck-limit", type=float, default=20.0, help="TORCHRAS_STUCK_LIMIT before scaling")
    ap.add_argument("--port", type=int, default=28940, help="client port (TORCHRAS_ADDR), below 32768")
    ap.add_argument("--timeout", type=float, default=420.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scraper", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.scraper:
        return scraper(args)
    lines, doc = summarize(run(args), args)
    print("\n".join(lines))
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
