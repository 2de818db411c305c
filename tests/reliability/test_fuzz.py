"""Fuzzing both ports (issue 14, item 2): hypothesis properties, raw and mutated frames, and a live port scan.

The library is tests/reliability/fuzz.py; bench/faults.py runs the same targets at a million inputs per port.
"""

from __future__ import annotations

import json
import random
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ras_client import ask, free_port_from

import fuzz
from rasd.core import client_session
from rasd.swarm import Swarm

CORPUS = fuzz.corpus()
frames_from_corpus = st.sampled_from(CORPUS)
hostile = st.one_of(
    st.binary(max_size=300),
    st.tuples(frames_from_corpus, st.integers(0, 2**31), st.randoms(use_true_random=False)).map(
        lambda t: fuzz.mutate(t[2], t[0], CORPUS)),
    st.lists(frames_from_corpus, min_size=1, max_size=4).map(b"".join),
)


@pytest.fixture(scope="module")
def target() -> fuzz.MeshTarget:
    """One meshed victim for many examples: it must come out of each with the beliefs it went in with."""
    return fuzz.MeshTarget()


SHARED = settings(max_examples=100, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _clean(findings: fuzz.Findings) -> None:
    assert findings.crashes == [] and findings.hangs == [] and findings.verdict_changes == []


@SHARED
@given(data=hostile, seed=st.integers(0, 2**16))
def test_no_input_before_authentication_changes_a_node_or_raises(target, data, seed):
    out = fuzz.Findings()
    target.preauth(random.Random(seed), data, out)
    _clean(out)
    assert target.beliefs() == target.baseline


@SHARED
@given(data=hostile, seed=st.integers(0, 2**16))
def test_garbage_from_an_authenticated_peer_changes_nothing_and_raises_nothing(target, data, seed):
    out = fuzz.Findings()
    target.postauth(random.Random(seed), data, out)
    _clean(out)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=2000), st.lists(st.sampled_from(fuzz.CLIENT_COMMANDS)).map(b"".join)))
def test_the_client_protocol_answers_any_bytes_with_replies_a_status_or_a_close(target, data):
    _clean(fuzz.client(random.Random(0), iter([data]), 1, target))


def test_a_huge_client_timeout_is_refused_and_a_long_one_reaches_the_wire_clamped():
    # Found by this fuzzer: "TIMEOUT <400 digits>" raised OverflowError in the session, and "TIMEOUT 5000000"
    # (more milliseconds than the wire's u32) made start_gather raise, leaving the client without a report.
    session = client_session.ClientSession()
    assert session.feed(b"TIMEOUT " + b"9" * 400 + b"\n")[0].text.startswith("ERROR: Invalid timeout value")
    _clean(fuzz.client(random.Random(0), iter([b"TIMEOUT 5000000\nSTATUS\n"]), 1))


@pytest.mark.parametrize("target", ["frames", "preauth", "postauth", "client"])
def test_thousands_of_random_and_mutated_inputs(target):
    rng = random.Random(14)
    count = 2000
    if target == "frames":
        out = fuzz.frames(rng, fuzz.inputs(rng, CORPUS), count)
    elif target == "client":
        out = fuzz.client(rng, fuzz.client_inputs(rng), count)
    else:
        out = fuzz.mesh(rng, fuzz.inputs(rng, CORPUS), count, authenticated=target == "postauth")
    assert out.inputs == count
    _clean(out)


# ----------------------------------------------------------------------------------------------------------------
# A live job




def _rss(pids: list[int]) -> int:
    return sum(psutil.Process(p).memory_info().rss for p in pids)


@pytest.mark.slow
def test_a_port_scan_of_a_live_job_changes_no_verdict_and_no_answer(tmp_path):
    port = free_port_from(29800)
    env = {"TORCHRAS_DEFAULT_ADDR": f"localhost:{port}", "TORCHRAS_RUN_DIR": str(tmp_path / "endpoints"),
           "TORCHRAS_SWARM_STEP_S": "0", "TORCHRAS_TIMEOUT_FACTOR": "0.2"}
    with Swarm(4, env=env) as sw:
        pids = [m.pid for m in sw.members]
        before = json.loads(ask(port, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
        rss_before = _rss(pids)
        targets = [(m.host, m.port) for m in sw.members[:2]] + [("127.0.0.1", port)]
        result = fuzz.scan(targets, 6.0, random.Random(3), CORPUS)
        assert result.connections > 100
        time.sleep(1.5)  # past the handshake limit (1 s at this factor): every held connection is dropped
        after = json.loads(ask(port, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
        assert all(sw.alive(i) for i in range(sw.n))
        for i in range(sw.n):
            for kind in ("PEER_DEAD", "PEER_UNRESPONSIVE", "PEER_HUNG"):
                assert not sw.events(i, kind), f"member {i}: {kind}"
        assert after["ras"] == {**before["ras"], "collection_time_sec": after["ras"]["collection_time_sec"]}
        assert after["communicators_count"] == before["communicators_count"]
        growth = _rss(pids) / rss_before - 1
        assert growth < 0.25, f"the members' memory grew {growth:.0%} under the scan"
