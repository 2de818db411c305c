"""bench/store_rate.py's counting: the operations and payload bytes of the real bootstrap, on a FileStore (no server).

The real servers (a TCPStore master, etcd) run in the ``slow`` tests and in the benchmark itself.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rasd.core import wire
from rasd.net.bootstrap import FileStore

PATH = Path(__file__).resolve().parents[2] / "bench" / "store_rate.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("store_rate_under_test", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def run(bench, store, n: int) -> list[dict]:
    rows = []
    for i in range(1, n + 1):
        counting = bench.CountingStore(store)
        bench.join(counting, "job", bench.peer(i))
        rows.append(counting.snapshot())
    return rows


def test_counts_and_payload_of_each_process(bench, tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    rows = run(bench, FileStore(tmp_path), 4)
    assert [r["ops"] for r in rows] == [3, 5, 6, 6]
    assert rows[3]["by_op"] == {"add": 1, "compare_set": 1, "get": 2, "set": 1, "wait": 1}
    entry = [len(wire.encode_peer(bench.peer(i))) for i in range(1, 5)]
    key = len("job/peer/1")
    # compare_set: key, empty expected, 64-byte offer -> the secret; add: key and an int64 -> an int64;
    # set: key and entry; wait: both keys; get: a key -> an entry, twice.
    assert (
        rows[3]["payload_sent"]
        == (len("job/secret") + 64) + (len("job/joined") + 8) + (key + entry[3]) + 2 * key + 2 * key
    )
    assert rows[3]["payload_received"] == 64 + 8 + entry[1] + entry[2]
    assert rows[0]["payload_received"] == 64 + 8


def test_the_environment_secret_leaves_the_secret_out(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHRAS_SECRET", "s")
    assert [r["ops"] for r in run(bench, FileStore(tmp_path), 3)] == [2, 4, 5]


def test_the_wrapper_offers_only_what_the_store_has(bench):
    class Minimal:
        def get(self, key):
            return b"v"

    counting = bench.CountingStore(Minimal())
    assert not hasattr(counting, "compare_set")
    assert counting.get("k") == b"v" and counting.snapshot()["by_op"] == {"get": 1}


@pytest.mark.slow
def test_a_real_tcpstore_counts_requests_and_bytes(bench, monkeypatch):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    server = bench.TCPServer()
    try:
        counts = bench.ops_per_process(server, 4)
        rate = bench.throughput(server, 2, 0.5)
    finally:
        server.close()
    other = counts["other"]
    assert other["ops"] == 6 and other["wire_requests"] == 8  # a get is WAIT then GET on the wire
    assert other["wire_sent"] > other["payload_sent"] and other["wire_received"] > other["payload_received"]
    assert counts["first_env"]["ops"] == 2
    assert rate["ops_per_s"] > 0 and rate["cpu_s_per_op"] > 0
