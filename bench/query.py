"""STATUS and STACKS latency: how long ``echo status | nc localhost 28028`` (and ``echo stacks | nc ...``) takes,
healthy and, for STATUS, right after a hang.

* 16 real processes (``rasd swarm``): 50 STATUS and 50 STACKS queries, interleaved (STATUS first in even pairs,
  STACKS first in odd ones), each connect to last byte as a user asks; medians, p90 and STATUS's p99, and the ratio
  STACKS / STATUS (issue 28's goal: within 2x). Then a member is SIGSTOPped: the first STATUS (which waits for the
  silent leg, reported as a TIMEOUT warning, as NCCL does) and the median of 20 queries after it (which route
  around the silent process).
* 1,024 and 4,096 nodes in the simulator, every hop charged the processing time measured here for one request
  and one response, plus the report build time measured for that many processes. The baseline is NCCL's mesh:
  a ring alone, where a gather is N/2 hops deep (``express_links=False``), in the same run.
* STACKS against STATUS at 1,024 and 4,096 simulated nodes, in one simulation per size, the two asks alternating
  from the same roots. Every node answers STACKS with a synthetic main-thread stack (``synthetic_stack``: 23 to 41
  frames of a DDP training step, seven distinct stacks across the ranks) and its collective counters
  (``synthetic_counters``: the ranks in DDP's all-reduce inside AllReduce 33 for 21 s, the others short of it, so
  that the fold names a collective for every group, issue 42) in the format ``rasd.net.thread_stacks`` writes.
  A STACKS reply is kilobytes per process, so besides the per-hop time (measured per ask: for STACKS with the real
  stacks provider reading a 40-frame stack) each node is charged a time per byte it receives (measured here: a
  relay passing a large reply on). A query's time is the gather's virtual time plus the wall time the root spends
  on the report: ``rasd.report.stacks.fold`` and ``render_text`` on the answers gathered, or STATUS's report build.

Prints a table and, last, one JSON object of the figures. Usage: python bench/query.py [--quick] (``--quick``: a
smoke run, 4 processes, 64 / 256 simulated nodes, fewer queries; its figures are not results).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from rasd.core import node as core, wire
from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.net import thread_stacks
from rasd.report import stacks as report_stacks
from rasd.report.model import build_report
from rasd.report.text import render_tail
from rasd.sim import Simulation
from rasd.swarm import Swarm

PORT = 29877
#: Issue 28's goal: a STACKS query within this factor of a STATUS query in the same run.
GOAL_RATIO = 2.0


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


def query(port: int, command: bytes) -> tuple[float, str]:
    """One client command as a user sends it (``echo CMD | nc``): connect, send, read until the server closes."""
    t0 = time.perf_counter()
    s = _connect(port)
    s.settimeout(30)
    s.sendall(command + b"\n")
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return time.perf_counter() - t0, out.decode()


def status(port: int) -> tuple[float, str]:
    return query(port, b"STATUS")


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by rank (the bench's p99 rule): the value at ``int(q * (n - 1))`` of the sorted values."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def real(n: int = 16, pairs: int = 50, after_hang: int = 20) -> dict[str, float]:
    """STATUS and STACKS on ``n`` real processes, interleaved in the same run, then STATUS around a SIGSTOP."""
    env = {"TORCHRAS_ADDR": f"localhost:{PORT}", "TORCHRAS_SWARM_STEP_S": "0"}
    lat: dict[bytes, list[float]] = {b"STATUS": [], b"STACKS": []}
    stacks_bytes = 0
    with Swarm(n, env=env) as sw:
        time.sleep(1.0)
        for i in range(pairs):
            # Alternate which goes first, so that neither always follows the other's burst of work.
            for command in (b"STATUS", b"STACKS") if i % 2 == 0 else (b"STACKS", b"STATUS"):
                seconds, text = query(PORT, command)
                lat[command].append(seconds)
                if command == b"STACKS":
                    head = f"Stacks of {n} of {n} processes"
                    assert text.startswith(head), f"a STACKS report of every process expected, got {text[:200]!r}"
                    stacks_bytes = len(text.encode())
        native = native_times(PORT)
        victim = n // 3
        sw.pause(victim)
        first, report = status(PORT)
        assert "TIMEOUT" in report, "the first query after a hang should wait for the silent leg"
        after = [status(PORT)[0] for _ in range(after_hang)]
        sw.resume(victim)
    st, sk = lat[b"STATUS"], lat[b"STACKS"]
    return {
        "p50": statistics.median(st),
        "p90": _quantile(st, 0.9),
        "p99": _quantile(st, 0.99),
        "stacks_p50": statistics.median(sk),
        "stacks_p90": _quantile(sk, 0.9),
        "stacks_report_bytes": float(stacks_bytes),
        "first_after_hang": first,
        "after_hang_p50": statistics.median(after),
        **native,
    }


#: A process blocked in a C call with torch loaded: a TCPStore client waiting for a key nobody sets.
_TORCH_BLOCKED = """
import datetime, sys, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=600))
print("ready", flush=True)
store.get("never")
"""


def native_times(port: int, runs: int = 3) -> dict[str, float]:
    """``rascli --stacks --native -f json`` on the swarm, as a user runs it (``runs`` times): the whole command's
    seconds and each process's dump (py-spy); then py-spy's dump of one process with torch loaded, blocked in a C
    call. Empty where py-spy is not installed or cannot read the processes."""
    from rascli import native

    py_spy = native.find_py_spy()
    if py_spy is None:
        return {}
    commands, dumps = [], []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "rascli.main", "-p", str(port), "--stacks", "--native", "-f", "json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        commands.append(time.perf_counter() - started)
        doc = json.loads(done.stdout)
        if any(p["error"] for p in doc["native"]["processes"]):
            return {}
        dumps += [p["seconds"] for p in doc["native"]["processes"]]
    blocked = subprocess.Popen([sys.executable, "-c", _TORCH_BLOCKED], stdout=subprocess.PIPE, text=True)
    try:
        assert blocked.stdout is not None and blocked.stdout.readline().strip() == "ready"
        target = native.Target(0, "localhost", blocked.pid)
        torch_dumps = [native.dump(py_spy, target, all_threads=False) for _ in range(runs)]
    finally:
        blocked.kill()
        blocked.wait()
    return {
        "native_command_p50": statistics.median(commands),
        "native_dump_p50": statistics.median(dumps),
        "native_dump_max": max(dumps),
        "native_dump_torch_p50": statistics.median(d.seconds for d in torch_dumps),
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


# ----------------------------------------------------------------------------------------------------------------
# STACKS in the simulator: synthetic stacks, the costs measured here, STACKS against STATUS

_PY = "/opt/conda/lib/python3.11"
_SITE = f"{_PY}/site-packages"
_TORCH = f"{_SITE}/torch"
_PL = f"{_SITE}/lightning/pytorch"
_APP = "/workspace/llm"
Frames = tuple[tuple[str, int, str], ...]

#: A Lightning fit under the in-process Wrapper, outermost first, down to the optimizer's closure: the frames the
#: forward, backward and optimizer stacks share (the data loader's leaves after the epoch loop's ``advance``).
_FIT: Frames = (
    (f"{_APP}/train.py", 412, "<module>"),
    (f"{_APP}/train.py", 398, "main"),
    (f"{_SITE}/torchras/inprocess/wrap.py", 221, "__call__"),
    (f"{_SITE}/torchras/inprocess/wrap.py", 301, "_run_attempt"),
    (f"{_APP}/train.py", 344, "train"),
    (f"{_PL}/trainer/trainer.py", 538, "fit"),
    (f"{_PL}/trainer/call.py", 47, "_call_and_handle_interrupt"),
    (f"{_PL}/trainer/trainer.py", 574, "_fit_impl"),
    (f"{_PL}/trainer/trainer.py", 981, "_run"),
    (f"{_PL}/trainer/trainer.py", 1025, "_run_stage"),
    (f"{_PL}/loops/fit_loop.py", 205, "run"),
    (f"{_PL}/loops/fit_loop.py", 363, "advance"),
    (f"{_PL}/loops/training_epoch_loop.py", 140, "run"),
    (f"{_PL}/loops/training_epoch_loop.py", 250, "advance"),
)
_STEP: Frames = (
    (f"{_PL}/loops/optimization/automatic.py", 190, "run"),
    (f"{_PL}/loops/optimization/automatic.py", 268, "_optimizer_step"),
    (f"{_PL}/trainer/call.py", 167, "_call_lightning_module_hook"),
    (f"{_PL}/core/module.py", 1306, "optimizer_step"),
    (f"{_PL}/core/optimizer.py", 153, "step"),
    (f"{_PL}/strategies/ddp.py", 270, "optimizer_step"),
    (f"{_PL}/strategies/strategy.py", 238, "optimizer_step"),
    (f"{_PL}/plugins/precision/precision.py", 122, "optimizer_step"),
    (f"{_TORCH}/optim/lr_scheduler.py", 124, "wrapper"),
    (f"{_TORCH}/optim/optimizer.py", 485, "wrapper"),
    (f"{_TORCH}/optim/optimizer.py", 79, "_use_grad"),
    (f"{_TORCH}/optim/adamw.py", 209, "step"),
)
_CLOSURE: Frames = (
    (f"{_PL}/plugins/precision/precision.py", 108, "_wrap_closure"),
    (f"{_PL}/loops/optimization/automatic.py", 144, "__call__"),
    (f"{_PL}/loops/optimization/automatic.py", 129, "closure"),
)
_BACKWARD: Frames = (
    (f"{_PL}/loops/optimization/automatic.py", 246, "backward_fn"),
    (f"{_PL}/trainer/call.py", 319, "_call_strategy_hook"),
    (f"{_PL}/strategies/strategy.py", 212, "backward"),
    (f"{_PL}/plugins/precision/precision.py", 73, "backward"),
    (f"{_PL}/core/module.py", 1101, "backward"),
    (f"{_TORCH}/_tensor.py", 626, "backward"),
    (f"{_TORCH}/autograd/__init__.py", 347, "backward"),
    (f"{_TORCH}/autograd/graph.py", 823, "_engine_run_backward"),
    (f"{_TORCH}/distributed/algorithms/ddp_comm_hooks/default_hooks.py", 86, "allreduce_hook"),
    (f"{_TORCH}/distributed/algorithms/ddp_comm_hooks/default_hooks.py", 29, "_allreduce_fut"),
    (f"{_TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
    (f"{_TORCH}/distributed/distributed_c10d.py", 2806, "all_reduce"),
)
_MODULE: Frames = (
    (f"{_TORCH}/nn/modules/module.py", 1773, "_wrapped_call_impl"),
    (f"{_TORCH}/nn/modules/module.py", 1784, "_call_impl"),
)
_FORWARD: Frames = (
    (f"{_PL}/loops/optimization/automatic.py", 317, "_training_step"),
    (f"{_PL}/strategies/strategy.py", 390, "training_step"),
    *_MODULE,
    (f"{_TORCH}/nn/parallel/distributed.py", 1657, "forward"),
    (f"{_TORCH}/nn/parallel/distributed.py", 1483, "_run_ddp_forward"),
    (f"{_PL}/overrides/base.py", 90, "forward"),
    (f"{_APP}/model/lit.py", 58, "training_step"),
    (f"{_APP}/model/gpt.py", 211, "forward"),
)
_OPTIMIZER: Frames = (
    (f"{_TORCH}/optim/optimizer.py", 150, "maybe_fallback"),
    (f"{_TORCH}/optim/adamw.py", 767, "adamw"),
    (f"{_TORCH}/optim/adamw.py", 601, "_multi_tensor_adamw"),
    (f"{_TORCH}/utils/_contextlib.py", 116, "decorate_context"),
    (f"{_TORCH}/optim/optimizer.py", 540, "_group_tensors_by_device_and_dtype"),
    (f"{_TORCH}/utils/_foreach_utils.py", 38, "_group_tensors_by_device_and_dtype"),
)
_DATALOADER: Frames = (
    (f"{_PL}/loops/fetchers.py", 134, "__next__"),
    (f"{_PL}/loops/fetchers.py", 61, "fetch_next"),
    (f"{_PL}/utilities/combined_loader.py", 341, "__next__"),
    (f"{_TORCH}/utils/data/dataloader.py", 708, "__next__"),
    (f"{_TORCH}/utils/data/dataloader.py", 1448, "_next_data"),
    (f"{_TORCH}/utils/data/dataloader.py", 1412, "_get_data"),
    (f"{_TORCH}/utils/data/dataloader.py", 1243, "_try_get_data"),
    (f"{_PY}/queue.py", 180, "get"),
    (f"{_PY}/threading.py", 331, "wait"),
)


def _attention(layer: int) -> Frames:
    """A transformer block's attention; the block's line says which of four layer kinds the rank is in."""
    return (
        (f"{_APP}/model/gpt.py", 148 + layer, "forward"),
        (f"{_APP}/model/attention.py", 96, "forward"),
        (f"{_TORCH}/nn/functional.py", 6021, "scaled_dot_product_attention"),
    )


def synthetic_stack(rank: int) -> Frames:
    """Rank ``rank``'s main-thread stack, outermost first, where a Lightning DDP step leaves it: of every 16 ranks,
    12 wait in DDP's all-reduce (41 frames), 2 are in a block's attention in the forward pass (one of four lines:
    41 frames), one in AdamW's step (32), one in the data loader (23), and so is rank 7. Seven distinct stacks, the
    largest three quarters of the job: folding has groups to make and stragglers to set apart."""
    kind = rank % 16
    if rank == 7 or kind == 15:
        return (*_FIT, *_DATALOADER)
    if kind == 14:
        return (*_FIT, *_STEP, *_OPTIMIZER)
    if kind in (12, 13):
        return (*_FIT, *_STEP, *_CLOSURE, *_FORWARD, *_attention((rank // 16) % 4))
    return (*_FIT, *_STEP, *_CLOSURE, *_BACKWARD)


ALL_REDUCE = OP_TYPES.index("AllReduce")


def synthetic_counters(rank: int) -> tuple[CommRecord, ...]:
    """Rank ``rank``'s counters of the world communicator where ``synthetic_stack`` leaves it: the ranks in DDP's
    all-reduce inside AllReduce 33 for 21 s, the others short of it (32 launched), so that every answer carries
    counters and the fold names a collective for every group (issue 42)."""
    launched = [0] * N_OPS
    completed = [0] * N_OPS
    reducing = synthetic_stack(rank)[-1][2] == "all_reduce"
    launched[ALL_REDUCE] = 33 if reducing else 32
    completed[ALL_REDUCE] = 32
    record = RankRecord(rank, launched=tuple(launched), completed=tuple(completed), idle_ms=21_000)
    return (CommRecord(0x1234, 0, (record,)),)


def synthetic_answer(info: PeerInfo) -> Callable[[], wire.Answer]:
    """A STACKS provider for a simulated node: the answer ``rasd.net.thread_stacks.answer`` writes, with the node's
    synthetic main-thread stack and its collective counters, encoded at each call as a real process's is."""
    frames = [list(f) for f in synthetic_stack(info.rank)]
    counters = synthetic_counters(info.rank)

    def make() -> wire.Answer:
        carried, stood_s = report_stacks.comms_of(counters)
        threads = [{"thread": "MainThread", "main": True, "frames": frames}]
        own = {"host": info.hostname, "pid": info.pid, "rank": info.rank, "wall": round(time.time(), 3)}
        if stood_s:
            own["stood_s"] = stood_s
        return wire.Answer(report_stacks.encode_shared(threads, carried)[0], report_stacks.encode_own(own))

    return make


def _at_depth(depth: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` called ``depth`` frames below here: a stack as deep as a training step's, for the stacks provider."""
    return fn() if depth <= 0 else _at_depth(depth - 1, fn)


def relay_time(
    ask: wire.Ask, entries: int, rounds: int, data: Callable[[int], ProcessData] | None = None
) -> tuple[float, int]:
    """Seconds a relay spends on one gather of ``ask`` (the request, then the reply of each leg it forwarded to, each
    reply carrying ``entries`` entries), and the bytes of one reply. The frames are encoded beforehand: only the
    relay's work is timed (decoding, its own answer, joining, encoding its reply). Its own STACKS answer comes from
    the real provider (``rasd.net.thread_stacks``) reading the main thread's stack, run ``STACK_DEPTH`` frames deep.
    ``data``: what the relay (1) and the replies' entries (2, 3, ...) contribute to a STATUS gather, by index; by
    default one communicator of 3 ranks, every entry alike."""
    contribution = data or (lambda i: _process_data(3, min(i, 2)))
    sim = Simulation(3, seed=1, local_data=contribution)
    sim.start()
    sim.run_until(2.0)
    a, b = sim.nodes[0].node, sim.nodes[1].node
    b.answers[wire.Ask.STACKS] = thread_stacks.provider(b.me, False, list, lambda: contribution(1).comms)
    (cid,) = [c.id for c in b.conns.values() if c.peer == a.me.addr and c.state is core.ConnState.READY]
    addrs = [Addr("10.9.9.9", j + 1) for j in range(entries)]
    if ask is wire.Ask.STATUS:
        fold = wire.Fold()  # what the leg's relays folded (section 4.1 of docs/architecture.md)
        for j, x in enumerate(addrs):
            fold.add(x, contribution(2 + j))
        raw = fold.encode()
    else:
        answers = wire.Answers()  # every entry in the same place: one shared part, as a leg's relays fold them
        for j, x in enumerate(addrs):
            me = sim.nodes[2].node.me
            answers.add(x, synthetic_answer(dataclasses.replace(me, addr=x, pid=me.pid + j))())
        raw = answers.encode()
    coll_ids = range(10_000, 10_000 + rounds)
    requests = [wire.encode(wire.CollReq(a.me.addr, i, 5000, ask)) for i in coll_ids]
    replies = [wire.encode(wire.CollResp(a.me.addr, i, 0, entries, raw)) for i in coll_ids]

    def run() -> float:
        t0 = time.perf_counter()
        for coll_id, request, reply in zip(coll_ids, requests, replies, strict=True):
            b.received(cid, request, 2.0)
            for leg in sorted(b.gathering.gathers[(a.me.addr, coll_id)].pending):
                b.received(leg, reply, 2.0)
        return time.perf_counter() - t0

    seconds: float = _at_depth(STACK_DEPTH, run)
    return seconds / rounds, len(replies[0])


#: How many frames deeper than the bench the relay runs when its STACKS provider reads the stack: with the
#: bench's, the simulator's and the core's own frames, the provider reads 40 frames, a training step's depth.
STACK_DEPTH = 26


def measured_costs(rounds: int) -> dict[str, float]:
    """The per-hop time of each ask (a reply of one entry) and the time per byte of a reply a relay passes on (the
    slope from replies of one STACKS answer to replies of 256)."""
    hop_status, _ = relay_time(wire.Ask.STATUS, 1, rounds)
    hop_stacks, small = relay_time(wire.Ask.STACKS, 1, rounds)
    big_time, big = relay_time(wire.Ask.STACKS, 256, max(10, rounds // 20))
    return {
        "hop_status_s": hop_status,
        "hop_stacks_s": hop_stacks,
        "byte_s": max(0.0, (big_time - hop_stacks) / (big - small)),
    }


def _expected(snapshot: JobSnapshot) -> list[Addr]:
    """The processes a gather expected answers from (as the client port counts them)."""
    return [p.addr for p in snapshot.peers if p.addr not in snapshot.dead and p.addr not in snapshot.left]


def report_time(snapshot: JobSnapshot) -> float:
    """Wall seconds the root spends turning a gather's snapshot into the text the client reads."""
    t0 = time.perf_counter()
    if snapshot.ask == wire.Ask.STATUS:
        render_tail(build_report(snapshot))
    else:
        folded = report_stacks.fold(snapshot.answers, snapshot.peers, _expected(snapshot), 0.0, False)
        text = report_stacks.render_text(folded)
        assert folded.answered == len(snapshot.peers) and not folded.missing, text[:500]
    return time.perf_counter() - t0


def stacks_against_status(n: int, costs: dict[str, float], queries: int) -> dict[str, float]:
    """STATUS and STACKS gathers in one simulation of ``n`` nodes, alternating from the same random roots, each
    with its ask's per-hop time and every node charged ``costs['byte_s']`` per byte it receives. Every node holds a
    communicator (so STATUS entries are as large as a training job's) and answers STACKS with its synthetic stack.
    The sweeper (which a communicator wakes) is kept out of the measured window: its gathers would load both asks'
    queries alike, and the rows above, whose nodes hold no communicator, never sweep.

    The report times are wall times in this process, which holds the whole simulation: a full collection of its
    heap takes most of a second at 4,096 nodes and, landing in a report now and then, was 0.8 s of one query's time
    in a trial. A rasd process's heap is its one node's; so the simulation is frozen out of the collector once it is
    set up (``gc.freeze``) and a collection runs before each timed report (not timed)."""
    sim = Simulation(
        n,
        seed=n,
        timers=Timers(sweep=3600.0),
        hop_cost=costs["hop_status_s"],
        byte_cost=costs["byte_s"],
        local_data=functools.partial(_process_data, n),
        record=frozenset({Kind.PEER_DEAD}),
    )
    for s in sim.nodes:
        s.node.answers[wire.Ask.STACKS] = synthetic_answer(s.node.me)
    sim.start("quiet")
    sim.run_until(4.0)
    gc.collect()
    gc.freeze()
    rng = random.Random(n)
    hop = {wire.Ask.STATUS: costs["hop_status_s"], wire.Ask.STACKS: costs["hop_stacks_s"]}
    gather: dict[wire.Ask, list[float]] = {wire.Ask.STATUS: [], wire.Ask.STACKS: []}
    report: dict[wire.Ask, list[float]] = {wire.Ask.STATUS: [], wire.Ask.STACKS: []}
    total: dict[wire.Ask, list[float]] = {wire.Ask.STATUS: [], wire.Ask.STACKS: []}
    query_id = 0
    for q in range(queries):
        root = rng.randrange(n)
        for ask in (wire.Ask.STATUS, wire.Ask.STACKS) if q % 2 == 0 else (wire.Ask.STACKS, wire.Ask.STATUS):
            query_id += 1
            sim.hop_cost = hop[ask]
            t0 = sim.now
            sim.gather(root, query_id, ask=ask)
            sim.run_while(functools.partial(_gathering, sim, (root, query_id)), 30.0, step=0.005)
            when, done = sim.gathers_done[(root, query_id)]
            assert not done.snapshot.timeouts, f"a {ask.name} gather at {n} nodes timed out a leg"
            gather[ask].append(when - t0)
            gc.collect()
            report[ask].append(report_time(done.snapshot))
            total[ask].append(gather[ask][-1] + report[ask][-1])
            sim.run_until(sim.now + 0.2)
    gc.unfreeze()
    out = {}
    for ask, name in ((wire.Ask.STATUS, "status"), (wire.Ask.STACKS, "stacks")):
        out[f"{name}_p50"] = statistics.median(total[ask])
        out[f"{name}_p90"] = _quantile(total[ask], 0.9)
        out[f"{name}_gather_p50"] = statistics.median(gather[ask])
        out[f"{name}_report_p50"] = statistics.median(report[ask])
    return out


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


def _goal(ratio: float) -> str:
    return f"ratio {ratio:.2f}x; goal <= {GOAL_RATIO:g}x: {'met' if ratio <= GOAL_RATIO else 'NOT met'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few queries (not results)")
    args = parser.parse_args(argv)
    quick = args.quick
    n_real = 4 if quick else 16
    sizes = (64, 256) if quick else (1024, 4096)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    real_ = real(n_real, pairs=6 if quick else 50, after_hang=3 if quick else 20)
    hop = measured_hop_cost()
    costs = measured_costs(200 if quick else 2000)
    rows = [
        (f"{n_real} real processes: STATUS p50", real_["p50"], "target < 0.05 s"),
        (f"{n_real} real processes: STATUS p90", real_["p90"], ""),
        (f"{n_real} real processes: STATUS p99", real_["p99"], ""),
        (
            f"{n_real} real processes: STACKS p50 (interleaved with STATUS)",
            real_["stacks_p50"],
            _goal(real_["stacks_p50"] / real_["p50"]),
        ),
        (
            f"{n_real} real processes: STACKS p90",
            real_["stacks_p90"],
            f"ratio {real_['stacks_p90'] / real_['p90']:.2f}x to STATUS p90",
        ),
        (
            "first STATUS after a SIGSTOP (waits for the silent leg)",
            real_["first_after_hang"],
            "NCCL bound: <= leg timeout 5 s + 5 s",
        ),
        ("later STATUS after the SIGSTOP, p50", real_["after_hang_p50"], "as fast as healthy"),
    ]
    if "native_command_p50" in real_:
        rows += [
            (f"rascli --stacks --native, {n_real} processes, p50", real_["native_command_p50"], "the whole command"),
            (
                "  py-spy dump --native per process, p50",
                real_["native_dump_p50"],
                f"max {real_['native_dump_max']:.3f} s",
            ),
            ("  the same, a process with torch loaded, p50", real_["native_dump_torch_p50"], "blocked in a C call"),
        ]
    figures: dict[str, float] = {
        f"status_p50_s_{n_real}": real_["p50"],
        f"status_p90_s_{n_real}": real_["p90"],
        f"status_p99_s_{n_real}": real_["p99"],
        f"stacks_p50_s_{n_real}": real_["stacks_p50"],
        f"stacks_p90_s_{n_real}": real_["stacks_p90"],
        f"stacks_ratio_{n_real}": real_["stacks_p50"] / real_["p50"],
        f"stacks_report_bytes_{n_real}": real_["stacks_report_bytes"],
        "first_after_hang_s": real_["first_after_hang"],
        "after_hang_p50_s": real_["after_hang_p50"],
        **{f"{k}_s": v for k, v in real_.items() if k.startswith("native_")},
    }
    goals = {f"stacks_{n_real}": real_["stacks_p50"] / real_["p50"] <= GOAL_RATIO}
    print(
        f"{n_real} real processes: STATUS p50 {real_['p50']:.4f} s, p90 {real_['p90']:.4f} s, p99 "
        f"{real_['p99']:.4f} s; STACKS p50 {real_['stacks_p50']:.4f} s, p90 {real_['stacks_p90']:.4f} s "
        f"({real_['stacks_report_bytes']:.0f}-byte report); after a hang: first {real_['first_after_hang']:.3f} s, "
        f"then p50 {real_['after_hang_p50']:.4f} s",
        flush=True,
    )
    print(
        f"measured per hop: STATUS {costs['hop_status_s'] * 1e6:.0f} us, STACKS {costs['hop_stacks_s'] * 1e6:.0f} us; "
        f"per byte received: {costs['byte_s'] * 1e9:.2f} ns",
        flush=True,
    )
    figures.update(costs)
    for n in sizes:
        build = report_build_time(n)
        ours = simulated(n, hop, express=True, queries=4 if quick else 10) + build
        # The ring's gather is N/2 hops deep and every hop re-reads the growing reply: slow to simulate, so fewer
        # queries (its spread is small: the depth does not depend on the root).
        ring = simulated(n, hop, express=False, queries=1 if quick else 2) + build
        print(f"sim {n}: {ours:.4f} s with express links, {ring:.4f} s with the ring alone", flush=True)
        rows.append((f"sim {n} nodes: STATUS p50 (express links)", ours, "target < 1 s at 4,096" if n == 4096 else ""))
        rows.append((f"sim {n} nodes: STATUS p50, NCCL's ring alone", ring, f"ratio {ring / ours:.1f}x"))
        figures[f"status_p50_s_{n}"] = ours
        figures[f"ring_status_p50_s_{n}"] = ring
        vs = stacks_against_status(n, costs, queries=4 if quick else 10)
        ratio = vs["stacks_p50"] / vs["status_p50"]
        print(
            f"sim {n}, STACKS against STATUS: STATUS {vs['status_p50']:.4f} s (gather {vs['status_gather_p50']:.4f} "
            f"+ report {vs['status_report_p50']:.4f}), STACKS {vs['stacks_p50']:.4f} s (gather "
            f"{vs['stacks_gather_p50']:.4f} + fold and text {vs['stacks_report_p50']:.4f})",
            flush=True,
        )
        rows.append((f"sim {n} nodes, per-byte model: STATUS p50 (same run as STACKS)", vs["status_p50"], ""))
        rows.append((f"sim {n} nodes, per-byte model: STACKS p50 (gather + fold)", vs["stacks_p50"], _goal(ratio)))
        rows.append((f"sim {n} nodes, per-byte model: STACKS p90", vs["stacks_p90"], ""))
        figures.update({f"paired_{k}_s_{n}": v for k, v in vs.items()})
        figures[f"stacks_ratio_{n}"] = ratio
        goals[f"stacks_{n}"] = ratio <= GOAL_RATIO
    width = max(len(r[0]) for r in rows)
    print(f"per-hop processing time measured here (the rows above the per-byte model): {hop * 1e6:.0f} us")
    print(f"run started {started}{'; --quick: a smoke run, not results' if quick else ''}")
    print(f"{'figure':<{width}}  {'seconds':>9}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>9.4f}  {note}")
    figures["byte_ns"] = figures.pop("byte_s") * 1e9
    out: dict[str, Any] = {k: round(v, 6 if k.startswith("hop_") else 4) for k, v in figures.items()}
    out["stacks_goal_ratio"] = GOAL_RATIO
    out["stacks_goal_met"] = goals
    out["started"] = started
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
