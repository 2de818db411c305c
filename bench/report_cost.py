"""The root's CPU cost of a STATUS report, stage by stage, from 1,024 to 100,000 processes (issue 30: the report is
built in time linear in the processes, with a small constant; STATUS within 2 s at 100,000 processes).

The job is a DDP + tensor-parallel job of N processes, 8 per host (host h is ``10.x.y.z`` for h = 1.., its processes
ports 29500..29507, each one GPU, global rank = 8 h + local index). Every process holds three communicators, as
torch's DDP + TP jobs do: the world group (size N), its host's tensor-parallel group (size 8) and its data-parallel
group (the processes with its local index on every host, size N / 8), each with its rank map, launch and completion
counts of a training step (all ranks agree: a healthy job) and an idle time. The entries reach the root in ``LEGS``
replies (``CollResp`` frames, one per leg), each a fold (``wire.Fold``: ranks by state, as the leg's relays fold
them) of a contiguous range of the table, each arriving in 256 KiB reads (asyncio's read size). Contiguous: a gather's
legs are regions of the ring (ring neighbours relay their neighbours), so a host's tensor-parallel group mostly
arrives in one leg; in the simulator at 4,096 nodes, the root's 4 legs brought 578 states of the 521 distinct ones.

Measured per N, process CPU time (``time.process_time``), the median of ``repeats`` runs of each stage; before each
timed stage a full collection runs (not timed). The collector is paused for every stage, as in a rasd process
(``rasd/net/gc_pause.py``): the node handles what a connection brings with it paused (the decoding of each leg's
fold, and the sweeper's stuck detector, which runs when a sweep's last leg answers), and the client port builds and
renders the report with it paused. ``--collector-on`` measures the decode and the stuck detector with it on, as
they ran before (the figure the collector's pause is measured against):

* ``decode``: the root reads the reply frames off its connections (``FrameReader.feed``, read by read), decodes each
  leg's fold (``Fold.decoded``) as ``Gathering.on_collresp`` does, and puts the parts together into one response per
  address and the states (``gather.responses_of``, as ``Gathering._snapshot`` does);
* ``snapshot``: the root makes the ``JobSnapshot`` of them, with what it works out once per snapshot and the merge
  and the report read (its table in order, each address's position, each responder's place: a fresh snapshot each
  time, as every gather gives one); ``merge``: the merge of its communicators (``merge_communicators``) on its own.
  The merge runs again inside ``build_report``: it is part of that figure too, and the total counts it once, there;
* ``build``: ``build_report(snapshot)``;
* ``text``: what the client port writes for ``status``: the job summary and head (``build_job_summary``,
  ``render_head``) and ``render_tail``; ``text_verbose``: the same for ``verbose status``; ``head`` and ``tail``: the
  two parts of ``text`` on their own (the client port writes the head once the gather's request is out, while the
  answers travel; the tail after the last answer);
* ``json``: ``render_json`` (``status json``);
* ``stuck``: the sweeper's stuck detector on the snapshot (``StuckDetector.observe``: the merge and each
  communicator's signature), after a first sweep of the same counters;
* ``total``: one text STATUS at the root: decode + the snapshot's assembly + build + text;
* ``after``: what of it the root spends once the gather is over, with the head written while it ran: decode +
  the snapshot's assembly + build + tail (the decode of the legs that answered before the last is counted too);
* ``sweep``: what the sweeper's root spends on each sweep: decode + the snapshot's assembly + stuck.

Prints per N the seconds and microseconds per process of each stage, the linearity check (microseconds per process
at the largest N over those at the smallest) and, last, one JSON object of the figures.

    python bench/report_cost.py            # 1,024 / 4,096 / 16,384 / 65,536 / 100,000 processes, 3 repeats
    python bench/report_cost.py --quick    # up to 16,384, 2 repeats: under a minute

``measure(sizes, repeats)`` returns ``{N: {stage: seconds}}`` for other benchmarks (bench/scale.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rasd.core import gather, wire
from rasd.core.comms import OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.fold import RankState, States
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot, merge_communicators
from rasd.core.stuck import StuckDetector
from rasd.net.gc_pause import collector_paused
from rasd.report.json_format import render_json
from rasd.report.model import Report, build_report
from rasd.report.summary import build_job_summary
from rasd.report.text import render_head, render_tail

SIZES = (1024, 4096, 16384, 65536, 100_000)
QUICK_SIZES = (1024, 4096, 16384)
PER_HOST = 8
#: Replies the root receives: one per connection it forwarded the request on (ring neighbours and express links).
LEGS = 8
#: Bytes per read off a connection (asyncio's selector transports read at most this much at a time).
READ_BYTES = 256 * 1024
STAGES = ("decode", "snapshot", "merge", "build", "text", "head", "tail", "text_verbose", "json", "stuck")
#: Issue 30's budget for the root's CPU per STATUS at 100,000 processes ("well under" the 2 s of the whole query).
GOAL_S = 1.0
VERSION_LINE = "torchras version 0.1.0 with torch 2.13.0+cpu"
RUNTIME_LINE = "nccl backend, CUDA 12.4"


def _counts(**by_name: int) -> tuple[int, ...]:
    return tuple(by_name.get(op, 0) for op in OP_TYPES)


#: Launch counts of a training step's communicators (equal on every rank: a healthy job).
WORLD_COUNTS = _counts(Broadcast=3, AllReduce=12, Barrier=5)
TP_COUNTS = _counts(AllReduce=1_843_200, AllGather=460_800, ReduceScatter=460_800)
DP_COUNTS = _counts(AllReduce=38_400, Broadcast=2, AllGather=600)


def _host(h: int) -> str:
    return f"10.{(h >> 16) & 255}.{(h >> 8) & 255}.{h & 255}"


def peers(n: int) -> tuple[PeerInfo, ...]:
    """The peer table of a job of ``n`` processes, ``PER_HOST`` per host."""
    return tuple(
        PeerInfo(
            addr=Addr(_host(1 + i // PER_HOST), 29500 + i % PER_HOST),
            pid=4000 + i % PER_HOST,
            hostname=f"node{1 + i // PER_HOST:05d}",
            incarnation=(1_760_000_000_000 << 22) + i,
            devices=(i % PER_HOST,),
            rank=i,
        )
        for i in range(n)
    )


def _rank(comm_rank: int, device: int, counts: tuple[int, ...], idle_ms: int) -> RankRecord:
    return RankRecord(comm_rank, device=device, launched=counts, completed=counts, idle_ms=idle_ms)


def process_data(n: int, hashes: dict[str, int], i: int, rng: random.Random) -> ProcessData:
    """What global rank ``i`` of an ``n``-process DDP + TP job contributes to a gather: three communicators."""
    host, local = divmod(i, PER_HOST)
    hosts = -(-n // PER_HOST)
    tp_size = min(PER_HOST, n - host * PER_HOST)
    dp_size = hosts - (1 if local >= n - (hosts - 1) * PER_HOST else 0)
    world = CommRecord(hashes["world"], n, (_rank(i, local, WORLD_COUNTS, rng.randrange(400)),), ((0, n, 1),))
    tp = CommRecord(
        hashes[f"tp{host}"],
        tp_size,
        (_rank(local, local, TP_COUNTS, rng.randrange(50)),),
        ((host * PER_HOST, tp_size, 1),),
    )
    dp = CommRecord(
        hashes[f"dp{local}"],
        dp_size,
        (_rank(host, local, DP_COUNTS, rng.randrange(400)),),
        ((local, dp_size, PER_HOST),),
    )
    return ProcessData(comms=(world, tp, dp))


@dataclass
class Job:
    """One job's inputs: its peer table and the reply frames its root receives, in reads."""

    n: int
    peers: tuple[PeerInfo, ...]
    root: Addr
    reads: list[list[bytes]]  # per leg, the reads that carry its reply frame


def make_job(n: int, seed: int = 30) -> Job:
    """A job of ``n`` processes and the replies its root (the first process) receives, encoded beforehand."""
    rng = random.Random(seed)
    table = peers(n)
    names = ["world", *(f"tp{h}" for h in range(-(-n // PER_HOST))), *(f"dp{j}" for j in range(PER_HOST))]
    hashes = {name: rng.getrandbits(64) for name in names}
    root = table[0].addr
    data = [process_data(n, hashes, p.rank, rng) for p in table]
    reads: list[list[bytes]] = []
    for leg in range(LEGS):
        # What the leg's relays fold on the way up (wire.Fold), as one fold: the same bytes.
        fold = wire.Fold()
        for i in range(leg * n // LEGS, (leg + 1) * n // LEGS):
            fold.add(table[i].addr, data[i])
        frame = wire.encode(wire.CollResp(root, 1, 0, fold.count, fold.encode()))
        reads.append([frame[k : k + READ_BYTES] for k in range(0, len(frame), READ_BYTES)])
    return Job(n, table, root, reads)


def decode(job: Job) -> tuple[dict[Addr, ProcessData], States]:
    """The root's reading of every reply: frames reassembled read by read, each leg's fold decoded as it arrives
    (``Gathering.on_collresp``), then the parts put together into responses and states (``gather.responses_of``)."""
    parts: list[wire.Decoded] = []
    known: dict[bytes, RankState] = {}
    for reads in job.reads:
        reader = wire.FrameReader(wire.MAX_FRAME)
        for data in reads:
            for msg in reader.feed(data):
                assert isinstance(msg, wire.CollResp)
                parts.append(msg.fold.decoded(known))
    return gather.responses_of(parts)


def snapshot(job: Job, decoded: tuple[dict[Addr, ProcessData], States]) -> JobSnapshot:
    """The snapshot the root makes of a gather that every process answered (``Gathering._snapshot``'s steps)."""
    responses, states = decoded
    return JobSnapshot(
        peers=job.peers, responses=responses, states=states, collection_time=0.25, in_flight_grace=2.0, ordered=True
    )


def assembled(job: Job, decoded: tuple[dict[Addr, ProcessData], States]) -> JobSnapshot:
    """``snapshot``, with what it works out on first use for the merge and the report (each snapshot once)."""
    snap = snapshot(job, decoded)
    assert len(snap.table_order) == len(snap.positions) == len(snap.process_ranks) == job.n
    return snap


def text(snap: JobSnapshot, report: Report, verbose: bool) -> str:
    """What the client port writes for a text STATUS: the head (from the peer table) and the tail."""
    summary = build_job_summary(snap.peers, snap.left, ordered=True)  # the client port's: from its ordered table
    head = render_head(summary, version_line=VERSION_LINE, runtime_line=RUNTIME_LINE, verbose=verbose)
    return head + render_tail(report, verbose=verbose)


def _cpu(fn: Callable[[], object], repeats: int, paused: bool = False) -> tuple[float, object]:
    """The median process CPU time of ``repeats`` calls of ``fn``, and the last call's result. ``paused``: with the
    collector paused, as the client port builds and renders a report (``rasd.net.gc_pause``)."""
    times = []
    result: object = None
    for _ in range(repeats):
        result = None
        gc.collect()
        t0 = time.process_time()
        if paused:
            with collector_paused():
                result = fn()
        else:
            result = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), result


def measure_one(n: int, repeats: int, collector_on: bool = False) -> dict[str, float]:
    """Each stage's median CPU seconds for a job of ``n`` processes (see the module's docstring). ``collector_on``:
    the decode and the stuck detector with the collector on."""
    job = make_job(n)
    out: dict[str, float] = {}
    out["decode"], decoded = _cpu(lambda: decode(job), repeats, paused=not collector_on)
    assert isinstance(decoded, tuple) and len(decoded[0]) == n
    out["snapshot"], snap = _cpu(lambda: assembled(job, decoded), repeats, paused=True)
    assert isinstance(snap, JobSnapshot)
    out["merge"], merged = _cpu(lambda: merge_communicators(snap), repeats)
    assert isinstance(merged, list) and len(merged) == 1 + -(-n // PER_HOST) + PER_HOST
    out["build"], report = _cpu(lambda: build_report(snap), repeats, paused=True)
    assert isinstance(report, Report)
    out["text"], _ = _cpu(lambda: text(snap, report, False), repeats, paused=True)
    summary = lambda: build_job_summary(snap.peers, snap.left, ordered=True)  # noqa: E731
    out["head"], _ = _cpu(lambda: render_head(summary(), version_line=VERSION_LINE, runtime_line=RUNTIME_LINE), repeats)
    out["tail"], _ = _cpu(lambda: render_tail(report, verbose=False), repeats, paused=True)
    out["text_verbose"], _ = _cpu(lambda: text(snap, report, True), repeats, paused=True)
    json_text = lambda: render_json(report, timestamp=0.0, torchras_version="0", torch_version="0")  # noqa: E731
    out["json"], _ = _cpu(json_text, repeats, paused=True)
    detector = StuckDetector(limit=60.0)
    detector.observe(snap, 0.0)  # the previous sweep: the one timed compares with it
    out["stuck"], _ = _cpu(lambda: detector.observe(snap, 5.0), repeats, paused=not collector_on)
    out["total"] = out["decode"] + out["snapshot"] + out["build"] + out["text"]
    out["after"] = out["decode"] + out["snapshot"] + out["build"] + out["tail"]
    out["sweep"] = out["decode"] + out["snapshot"] + out["stuck"]
    return out


def measure(sizes: Iterable[int] = SIZES, repeats: int = 3, collector_on: bool = False) -> dict[int, dict[str, float]]:
    """``{N: {stage: median CPU seconds}}`` for each size; stages ``STAGES`` and ``total`` (module docstring)."""
    return {n: measure_one(n, repeats, collector_on) for n in sizes}


def figures(results: dict[int, dict[str, float]]) -> dict[str, float]:
    """The flat figures of the JSON line: seconds and microseconds per process of each stage at each N, and per
    stage the ratio of microseconds per process at the largest N to those at the smallest (1.0: linear)."""
    out: dict[str, float] = {}
    for n, stages in results.items():
        for stage, seconds in stages.items():
            out[f"{stage}_s_{n}"] = round(seconds, 4)
            out[f"{stage}_us_per_process_{n}"] = round(seconds / n * 1e6, 3)
    small, large = min(results), max(results)
    for stage in (*STAGES, "total", "after", "sweep"):
        per_small = results[small][stage] / small
        out[f"{stage}_linearity_{large}_vs_{small}"] = round((results[large][stage] / large) / per_small, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="sizes up to 16,384, 2 repeats (under a minute)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each stage (median); default 3, quick 2")
    parser.add_argument(
        "--collector-on", action="store_true", help="decode and stuck with the collector on (as before it was paused)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    repeats = args.repeats or (2 if args.quick else 3)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results: dict[int, dict[str, float]] = {}
    for n in sizes:
        results[n] = measure_one(n, repeats, args.collector_on)
        cells = "  ".join(f"{s} {results[n][s]:.3f}" for s in (*STAGES, "total", "after", "sweep"))
        print(f"{n} processes: {cells} (CPU s)", flush=True)
    columns = (*STAGES, "total", "after", "sweep")
    print(f"\nrun started {started}; median of {repeats}; CPU seconds, then microseconds per process")
    print(f"{'processes':>9}  " + "  ".join(f"{c:>12}" for c in columns))
    for n, stages in results.items():
        print(f"{n:>9}  " + "  ".join(f"{stages[c]:>11.3f}s" for c in columns))
        print(f"{'':>9}  " + "  ".join(f"{stages[c] / n * 1e6:>10.2f}us" for c in columns))
    small, large = min(results), max(results)
    ratios = "  ".join(f"{c} {(results[large][c] / large) / (results[small][c] / small):.2f}x" for c in columns)
    print(f"linearity (us per process at {large:,} / at {small:,}; 1.00 is linear): {ratios}")
    total = results[large]["total"]
    print(f"root CPU for one text STATUS at {large:,}: {total:.3f} s (goal at 100,000: well under {GOAL_S:g} s)")
    out: dict[str, Any] = figures(results)
    out["repeats"] = repeats
    out["started"] = started
    out["quick"] = args.quick
    out["collector_on"] = args.collector_on
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
