"""What the verdict journal (``TORCHRAS_JOURNAL_DIR``, docs/operations.md §11) costs a restart, in one run.

A real node of this process (a mesh of one, on loopback) keeps its journal in a temporary directory. Each sample
gives the RAS thread a PEER_DEAD with evidence (one communicator's counts, as a training process holds them), then
times ``rasd.sync_journal(verdict=True)`` at once, as the Wrapper's monitor thread calls it before a restart acts:
the RAS thread's hand-over, the wait for the verdict, the writer encoding and appending it. Arms:

    on        the journal on a local directory
    off       no journal: the call the monitor thread makes all the same
    stalled   every write of the journal blocks (a disk that stopped answering): the wait ends at the budget

    .venv/bin/python bench/journal.py                  # about 10 s
    .venv/bin/python bench/journal.py --samples 2000

Prints a line per arm, then, as its last line, one JSON object: ``{arm}_{median,p99,max}_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

import rasd
from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.services import journal

DEAD = PeerInfo(Addr("10.0.0.2", 4002), pid=4711, hostname="node2", incarnation=9, rank=2)


def local_data() -> ProcessData:
    counts = tuple(1000 if op == 4 else 0 for op in range(N_OPS))
    held = RankRecord(comm_rank=0, launched=counts, completed=counts, idle_ms=10)
    return ProcessData(comms=(CommRecord(comm_hash=0xA7CC1AE375C5C684, size=4, ranks=(held,), rank_map=((0, 4, 1),)),))


def arm(name: str, samples: int, directory: str | None, stall: threading.Event | None = None) -> list[float]:
    if directory is None:
        os.environ.pop(journal.ENV, None)
    else:
        os.environ[journal.ENV] = directory
    handle = rasd.start(secret=b"bench", host="127.0.0.1", local_data=local_data)
    assert handle is not None
    runtime = rasd.api._runtime
    kept = journal.of(runtime) if runtime is not None else None
    if directory is not None:
        deadline = time.monotonic() + 30
        while kept is None and time.monotonic() < deadline:
            time.sleep(0.01)
            kept = journal.of(runtime) if runtime is not None else None
        assert kept is not None and kept.sync(30), "the journal did not start"
        if stall is not None:
            kept.write = lambda fd, data: (stall.wait(), os.write(fd, data))[1]
    took = []
    for _ in range(samples):
        if kept is not None and runtime is not None:
            runtime.call(lambda: kept.on_event(Event(kind=Kind.PEER_DEAD, at=time.monotonic(), peer=DEAD)))
        began = time.perf_counter()
        rasd.sync_journal(verdict=True)
        took.append(time.perf_counter() - began)
        time.sleep(0.002)
    if stall is not None:
        stall.set()
    rasd.stop()
    took.sort()
    median, p99, most = statistics.median(took) * 1e3, took[int(len(took) * 0.99)] * 1e3, took[-1] * 1e3
    print(f"{name:8} sync median {median:8.3f} ms   p99 {p99:8.3f} ms   max {most:8.3f} ms   ({samples} samples)")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=500)
    args = parser.parse_args()
    os.environ["TORCHRAS_ADDR"] = "off"
    summary: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        results = {
            "on": arm("on", args.samples, os.path.join(directory, "on")),
            "off": arm("off", args.samples, None),
            "stalled": arm(
                "stalled", max(5, args.samples // 50), os.path.join(directory, "stalled"), threading.Event()
            ),
        }
    for name, took in results.items():
        summary[f"{name}_median_ms"] = round(statistics.median(took) * 1e3, 4)
        summary[f"{name}_p99_ms"] = round(took[int(len(took) * 0.99)] * 1e3, 4)
        summary[f"{name}_max_ms"] = round(took[-1] * 1e3, 4)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
