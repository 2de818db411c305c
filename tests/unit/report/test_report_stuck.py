"""Standing COMM_STUCK verdicts appear in the report: a STUCK item in Warnings (the sentence) and a ``stuck`` object
in JSON (the data: op, operation, ranks behind and inside)."""

import dataclasses
import json

from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.frames import Frame
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.core.stuck import StuckVerdict
from rasd.report.json_format import render_json
from rasd.report.model import build_report
from rasd.report.text import render_tail

AR = OP_TYPES.index("AllReduce")


def _snapshot(stuck: dict[int, StuckVerdict]) -> JobSnapshot:
    peers, responses = [], {}
    for r in range(2):
        addr = Addr("10.0.0.1", 5000 + r)
        peers.append(PeerInfo(addr, pid=100 + r, hostname="h", incarnation=r, rank=r))
        launched = [0] * N_OPS
        launched[AR] = 20 - r
        responses[addr] = ProcessData(
            comms=(
                CommRecord(
                    0xAB, 2, (RankRecord(r, launched=tuple(launched), completed=tuple(launched)),), ((0, 2, 1),)
                ),
            )
        )
    return JobSnapshot(peers=tuple(peers), responses=responses, stuck=stuck)


def test_a_stuck_communicator_gets_a_warnings_item_before_its_mismatch():
    why = "AllReduce operation 20 stuck; rank 1 behind (not launched); rank 0 inside it (launched, not completed)"
    verdict = StuckVerdict(0xAB, AR, 20, behind=(1,), inside=(0,), global_behind=(1,), global_inside=(0,))
    tail = render_tail(build_report(_snapshot({0xAB: verdict})))
    warnings = tail.split("Warnings\n========\n\n", 1)[1]
    assert warnings.startswith(f"#0-0 (00000000000000ab) STUCK\n  {why}\n\n#0-0 (00000000000000ab) MISMATCH\n")


def test_the_stuck_item_says_where_each_rank_behind_was():
    where = (Frame("/src/train.py", 31, "next_batch"), Frame("/usr/lib/python3.11/queue.py", 171, "get"))
    verdict = StuckVerdict(0xAB, AR, 20, behind=(1,), inside=(0,), global_behind=(1,), global_inside=(0,))
    verdict = dataclasses.replace(verdict, positions=((1, where),))
    tail = render_tail(build_report(_snapshot({0xAB: verdict})))
    assert (
        "rank 0 inside it (launched, not completed); rank 1 in train.py:31 (next_batch) -> queue.py:171 (get)\n" in tail
    )


def test_json_carries_the_verdict_as_data_or_null():
    where = (Frame("train.py", 31, "next_batch"), Frame("/usr/lib/python3.11/queue.py", 171, "get"))
    verdict = StuckVerdict(
        0xAB, AR, 20, behind=(1,), inside=(), global_behind=(1,), global_inside=(), positions=((1, where),)
    )
    data = {
        "op": "AllReduce",
        "sequence": 20,
        "ranks_behind": [1],
        "ranks_inside": [],
        "global_ranks_behind": [1],
        "global_ranks_inside": [],
        "positions_behind": [
            {
                "rank": 1,
                "frames": [
                    {"file": "train.py", "line": 31, "function": "next_batch"},
                    {"file": "/usr/lib/python3.11/queue.py", "line": 171, "function": "get"},
                ],
            }
        ],
        "state": "STUCK",
        "ranks_working": [],
        "phase": "",
        "seconds_without_progress": 0.0,
        "idle_limit_seconds": 0.0,
    }
    slow = dataclasses.replace(verdict, slow=True, busy=(1,), phase="eval", stood_ms=45_000, limit_ms=5_000)
    slow_data = dict(data, state="SLOW", ranks_working=[1], phase="eval")
    slow_data.update(seconds_without_progress=45.0, idle_limit_seconds=5.0)
    for stuck, expected in (({0xAB: verdict}, data), ({0xAB: slow}, slow_data), ({}, None)):
        doc = json.loads(
            render_json(build_report(_snapshot(stuck)), timestamp=0.0, torchras_version="0", torch_version="0")
        )
        assert doc["communicators"][0]["stuck"] == expected


def test_a_slow_communicator_gets_a_slow_item_naming_the_ranks_that_work():
    """Ranks behind that work (a checkpoint on rank 1) make a SLOW item, never a STUCK one (issue 39)."""
    where = (Frame("/src/train.py", 88, "save"), Frame("/venv/torch/serialization.py", 967, "save"))
    verdict = StuckVerdict(0xAB, AR, 20, behind=(1,), inside=(0,), global_behind=(1,), global_inside=(0,))
    verdict = dataclasses.replace(
        verdict, positions=((1, where),), slow=True, busy=(1,), stood_ms=45_000, limit_ms=5_000
    )
    warnings = render_tail(build_report(_snapshot({0xAB: verdict}))).split("Warnings\n========\n\n", 1)[1]
    assert warnings.startswith(
        "#0-0 (00000000000000ab) SLOW\n  AllReduce operation 20 slow; rank 1 behind (not launched); rank 0 inside it "
        "(launched, not completed); rank 1 working (CPU or I/O moving); no progress for 45 s; rank 1 in "
        "train.py:88 (save) -> serialization.py:967 (save)\n\n"
    )
    assert "STUCK" not in warnings
