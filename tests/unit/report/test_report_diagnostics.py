"""The DIAGNOSTICS report from gathered configurations (rasd.report.diagnostics), and what a process answers
(rasd.net.configuration): NCCL 2.31's checks and layout (reference §9.1), without a socket."""

from __future__ import annotations

import dataclasses
import json
import re
import types
from collections.abc import Mapping

from rasd.core.peers import Addr, PeerInfo
from rasd.core.wire import MAX_ANSWER_BYTES, Answer
from rasd.net import configuration
from rasd.report import diagnostics as diag
from rasd.report.diagnostics import Configuration

#: NCCL's parser hint (reference §9.1.5): every line of the text report must match it.
NCCL_LINE = re.compile(r"^(?P<host>[^:]+):(?P<pid>\d+) NCCL DIAG (?:(?P<tag>\[OK\]|\[INFO\]) +)?(?P<msg>.*)$")


def peer(i: int, rank: int | None = None) -> PeerInfo:
    return PeerInfo(Addr("10.0.0.1", 9000 + i), 100 + i, f"node{i // 2}", 1, rank=i if rank is None else rank)


def config(i: int, **changes: object) -> Configuration:
    base = Configuration(
        host=f"node{i // 2}",
        pid=100 + i,
        rank=i,
        wall=1000.0,
        python="3.11.7",
        torch="2.13.0+cpu",
        torchras="0.1.0",
        gpu_note="no CUDA device: a CPU-only torch build",
        settings={"NCCL_ALGO": "Ring", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCHRAS_ADDR": "localhost:28028"},
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def report(configs: Mapping[int, Configuration | bytes], n: int = 4, collection_time: float = 0.01) -> diag.Diagnostics:
    peers = [peer(i) for i in range(n)]
    answers = {peers[i].addr: Answer(own=c if isinstance(c, bytes) else c.encode()) for i, c in configs.items()}
    return diag.check(answers, peers, [p.addr for p in peers], peers[0].addr, collection_time)


def lines(d: diag.Diagnostics) -> list[str]:
    return [line.text for line in d.lines]


def test_a_consistent_cpu_job_is_ok_and_says_why_the_gpu_checks_are_empty():
    d = report({i: config(i) for i in range(4)})
    text = lines(d)
    assert "[INFO] GPU inventory: no CUDA device: a CPU-only torch build across 4 ranks" in text
    assert "[INFO] CUDA driver version: unavailable (no CUDA device: a CPU-only torch build) across 4 ranks" in text
    assert "[OK]   torch version: 2.13.0+cpu consistent across 4 ranks" in text
    assert "[OK]   NCCL environment: NCCL_* env vars consistent across 4 ranks" in text
    assert "[OK]   TORCH environment: TORCH_* env vars consistent across 4 ranks" in text
    assert "[OK]   Hosts: 4 ranks on 2 host(s): node0, node1" in text
    assert not any(t.startswith("[INFO] Processes") for t in text) and d.missing == ()


def test_a_setting_that_differs_names_its_ranks_per_value_as_nccl_does():
    configs = {i: config(i) for i in range(4)}
    for i in (2, 3):
        configs[i] = config(i, settings={**configs[i].settings, "NCCL_ALGO": "Tree", "NCCL_DEBUG": "INFO"})
    text = lines(report(configs))
    at = text.index("[INFO] NCCL environment: mismatch across 4 ranks for NCCL_ALGO")
    assert text[at + 1 : at + 3] == [
        "[INFO] NCCL environment: NCCL_ALGO=Ring on rank(s) {0,1}",
        "[INFO] NCCL environment: NCCL_ALGO=Tree on rank(s) {2,3}",
    ]
    assert "[INFO] NCCL environment: NCCL_DEBUG=(unset) on rank(s) {0,1}" in text
    assert "[INFO] NCCL environment: 2 NCCL_* env var(s) differ across ranks" in text
    assert "[OK]   TORCH environment: TORCH_* env vars consistent across 4 ranks" in text


def test_a_version_outlier_is_named_against_the_lowest_rank():
    configs = {i: config(i) for i in range(4)}
    configs[3] = config(3, torch="2.12.1+cpu")
    text = lines(report(configs))
    assert "[INFO] torch version: mismatch across 4 ranks, rank(s) {3} differ from rank 0 (2.13.0+cpu)" in text
    assert "[INFO] torch version: 2.12.1+cpu on rank(s) {3}" in text


def test_gpus_consistent_and_mismatched():
    gpu = {"gpu_count": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_memory_bytes": 80 * 2**30, "gpu_note": ""}
    configs = {i: config(i, cuda_runtime="12.8", cuda_driver="12080", nccl="2.27.3", **gpu) for i in range(4)}
    text = lines(report(configs))
    assert "[OK]   GPU inventory: 8x NVIDIA H100 80GB HBM3 per node consistent across 4 ranks" in text
    assert "[OK]   GPU memory: 80.0 GiB consistent across 4 ranks" in text
    assert "[OK]   NCCL version: 2.27.3 consistent across 4 ranks" in text
    configs[1] = dataclasses.replace(configs[1], gpu_model="NVIDIA A100-SXM4-80GB")
    text = lines(report(configs))
    assert (
        "[INFO] GPU inventory: model mismatch across 4 ranks, rank(s) {1} differ from rank 0 (NVIDIA H100 80GB HBM3)"
        in text
    )


def test_missing_and_unreadable_answers_make_the_report_incomplete():
    configs: dict[int, Configuration | bytes] = {0: config(0), 1: config(1), 3: b"\xff not json"}
    d = report(configs)
    assert [p.rank for p in d.missing] == [2, 3]
    assert (
        lines(d)[0] == "[INFO] Processes: diagnostics incomplete, gathered 2/4 ranks; no answer from rank 2 node1:102, "
        "rank 3 node1:103"
    )


def test_a_clock_beyond_the_tolerance_and_the_gathers_duration_is_named():
    configs = {i: config(i) for i in range(4)}
    configs[2] = config(2, wall=1000.0 + 0.5)  # within the tolerance
    configs[3] = config(3, wall=1000.0 - 3.25)  # behind: no gather delay explains a clock behind the root's
    text = lines(report(configs, collection_time=0.2))
    assert (
        "[INFO] Clock: rank(s) {3} more than 1 s from rank 0's clock across 4 ranks (worst -3.250 s on rank 3)" in text
    )
    # Ahead by up to the collection time is the gather's own delay, not the clock.
    configs[3] = config(3, wall=1000.0 + 1.15)
    assert any(t.startswith("[OK]   Clock: within 1 s") for t in lines(report(configs, collection_time=0.2)))


def test_rank_sets_follow_nccl_past_eight():
    configs = [config(i) for i in range(12)]
    assert diag.rank_set(configs[:3]) == "{0,1,2}"
    assert diag.rank_set(configs) == "{0,1,2,3,4,5,6,7,...} (N=12)"
    assert diag.rank_set([config(0, rank=-1)]) == "{node0:100}"


def test_keys_and_values_are_printed_as_nccl_prints_them():
    configs = {i: config(i) for i in range(2)}
    configs[1] = config(1, settings={**configs[1].settings, "NCCL_X": "a\tb" + "v" * 300})
    text = lines(report(configs, n=2))
    (shown,) = [t for t in text if t.startswith("[INFO] NCCL environment: NCCL_X=a?b")]
    assert shown.endswith("v... on rank(s) {1}") and len(shown) < 330


def test_the_text_is_nccl_s_layout_and_the_json_carries_the_same_checks():
    d = report({i: config(i) for i in range(4)})
    text = diag.render_text(d, "node0", 100).splitlines()
    assert text[0] == "node0:100 NCCL DIAG === RAS Diagnostics ==="
    assert re.fullmatch(r"node0:100 NCCL DIAG RAS diagnostics completed in 10\.0 ms across 4 RAS peers", text[-1])
    assert all(NCCL_LINE.match(t) for t in text)
    assert [NCCL_LINE.match(t)["tag"] for t in text[1:-1]] == [line.tag.strip() for line in d.lines]  # type: ignore[index]
    doc = json.loads(diag.render_json(d, "node0", 100, 1.0))["diagnostics"]
    assert [(c["tag"], c["check"], c["message"]) for c in doc["checks"]] == [
        (line.tag.strip()[1:-1], line.check, line.message) for line in d.lines
    ]
    assert [p["rank"] for p in doc["processes"]] == [0, 1, 2, 3] and doc["peers_count"] == 4


def test_an_answer_of_another_format_or_shape_is_not_compared():
    good = json.loads(config(0).encode())
    for bad in (
        {**good, "format": 99},
        {**good, "settings": {"A": 1}},
        {**good, "pid": "x"},
        [1, 2],
        {**good, "new": 1},
    ):
        assert Configuration.decode(json.dumps(bad).encode()) is None
    assert Configuration.decode(config(0).encode()) == config(0)


# --- what a process answers ----------------------------------------------------------------------------------------


def test_a_process_answers_its_settings_with_secrets_as_digests():
    environ = {
        "NCCL_ALGO": "Ring",
        "TORCHRAS_SECRET": "hunter2",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HOME": "/root",
        "TORCH_API_KEY": "k",
        "TORCHRAS_LAUNCH_EVENTS": "/tmp/w0/events.jsonl",  # per process by design: not compared
    }
    c = configuration.collect(
        peer(0), environ, torch=types.SimpleNamespace(__version__="2.13.0", version=types.SimpleNamespace(cuda=None))
    )
    assert set(c.settings) == {"NCCL_ALGO", "TORCHRAS_SECRET", "CUDA_VISIBLE_DEVICES", "TORCH_API_KEY"}
    assert "hunter2" not in c.encode().decode() and c.settings["TORCHRAS_SECRET"].startswith("<secret sha256:")
    assert c.settings["TORCHRAS_SECRET"] == configuration.collect(peer(1), environ).settings["TORCHRAS_SECRET"]
    assert (c.torch, c.gpu_note, c.rank, c.pid) == ("2.13.0", "no CUDA device: a CPU-only torch build", 0, 100)


def test_a_torch_whose_cuda_is_not_started_is_not_asked_for_the_gpu():
    def started() -> bool:
        return False

    cuda = types.SimpleNamespace(is_initialized=started)  # nothing else: touching more would raise
    torch = types.SimpleNamespace(__version__="2.13.0", version=types.SimpleNamespace(cuda="12.8"), cuda=cuda)
    c = configuration.collect(peer(0), {}, torch=torch)
    assert (c.cuda_runtime, c.gpu_count, c.gpu_note) == ("12.8", None, "CUDA not started in this process yet")


def test_an_answer_too_large_for_the_wire_drops_the_longest_settings_and_says_so():
    environ = {f"NCCL_V{i}": "x" * 1000 for i in range(100)} | {"NCCL_SHORT": "1"}
    data = configuration.fitted(configuration.collect(peer(0), environ))
    assert 0 < len(data) <= MAX_ANSWER_BYTES
    c = Configuration.decode(data)
    assert c is not None and c.truncated and c.settings["NCCL_SHORT"] == "1" and len(c.settings) < 101


def test_the_provider_never_raises_and_answers_empty_when_it_cannot_describe_the_process(caplog):
    assert Configuration.decode(configuration.provider(peer(0))().own) is not None
    nobody = types.SimpleNamespace()  # no host, pid or rank: collect() fails
    assert configuration.provider(nobody)() == Answer()  # type: ignore[arg-type]
    assert "could not describe this process for diagnostics" in caplog.text
