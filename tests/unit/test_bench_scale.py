"""bench/scale.py's parts on small inputs: the model's fit and predictions, the memory and start-up measurements."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale


def test_the_sqrt_fit_recovers_a_known_law():
    points = [(n, 0.002 + 0.0003 * math.sqrt(n)) for n in (256, 1024, 4096)]
    a, b = scale._fit_sqrt(points)
    assert a == pytest.approx(0.002) and b == pytest.approx(0.0003)


def test_the_model_predicts_from_its_inputs():
    def gather(n: int) -> float:
        return 0.0006 * math.sqrt(n) + 0.0001 * math.sqrt(n) + 2e-6 * n

    after = {1024: 0.01, 4096: 0.04, 100_000: 1.0}  # the root in the simulator took 1.2x at 1,024, 1.5x at 4,096
    runs = {
        n: {
            "death_s": 0.001 + 0.0002 * math.sqrt(n),
            "status_gather_s": gather(n),
            "status_gather_free_s": 0.0006 * math.sqrt(n),
            "status_root_cpu_s": (1.2 if n == 1024 else 1.5) * after[n],
        }
        for n in (1024, 4096)
    }
    starts = {1024: {"entries_per_node_over_n": 12.0, "complete_s": 1.2, "store_busy_until_s": 0.1}}
    inputs = {
        "report_after_s": after,
        "bytes_per_entry": 500.0,
        "store_service_s": 16e-6,
        "etcd_service_s": 1e-3,
        "decode_again_us": 1.0,
        "conn_state_bytes": 8000,
        "rest_msgs_per_node_s": 4.0,
    }
    predicted = scale.model(runs, starts, inputs)
    assert predicted["4096"]["status_gather_s"] == pytest.approx(gather(4096), abs=1e-3)
    out = predicted["100000"]
    assert out["death_s"] == pytest.approx(0.001 + 0.0002 * math.sqrt(100_000), abs=1e-4)
    assert out["status_gather_s"] == pytest.approx(gather(100_000), abs=1e-3)
    assert out["status_s"] == pytest.approx(gather(100_000) + 1.5, abs=1e-3)
    assert out["memory_mb"] == pytest.approx((500.0 * 100_000 + 8000) / 1e6, abs=0.1)
    assert out["startup_s"] == pytest.approx(100_000 * 6 * 16e-6 + 1.1 + 12 * 100_000 * 1e-6, abs=0.01)


def test_the_two_term_fit_recovers_a_known_law():
    points = [(n, 3e-4 * math.sqrt(n) + 2e-6 * n) for n in (1024, 4096, 16384)]
    c, d = scale._fit(points, math.sqrt, float)
    assert c == pytest.approx(3e-4) and d == pytest.approx(2e-6)


def test_table_memory_counts_every_entry_and_restores_the_cache_bound():
    bound = scale.wire.PEER_CACHE_MAX
    m = scale.table_memory(2000)
    assert m["entries"] == 2000 and 100 < m["bytes_per_entry"] < 5000
    assert bound == scale.wire.PEER_CACHE_MAX


def test_a_small_start_through_the_store_completes():
    s = scale.startup(64, service=20e-6, rtt=2e-4, limit=30.0)
    assert s["complete_s"] is not None and s["store_ops_per_process"] <= 6
    assert s["entries_per_node"] >= 63
