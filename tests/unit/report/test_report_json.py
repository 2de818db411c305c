"""The JSON report (docs/protocol.md §4): NCCL's layout, valid and escaped, with our additions."""

import json
from pathlib import Path

from rasd.core.comms import OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.report import build_report, render_json
from report_builders import comm_records, launched, make_peers, make_snapshot

GOLDEN = Path(__file__).parent / "golden"


def dump(snapshot, **versions):
    versions.setdefault("torchras_version", "0.1.0")
    versions.setdefault("torch_version", "2.13.0+cpu")
    return render_json(build_report(snapshot), timestamp=0.0, **versions)


def two_comms():
    peers = make_peers([2])
    return make_snapshot(
        peers,
        comm_records(
            peers, 0xABC, per_rank={1: {"launched": launched(AllReduce=2, Send=1), "completed": launched(AllReduce=1)}}
        ),
        comm_records(peers, 0x5, holders=[0]),
        timeouts=1,
        collection_time=0.0123,
    )


def test_layout_byte_for_byte(utc):
    assert dump(two_comms()) == (GOLDEN / "two_comms.json").read_text()


def test_parses_and_says_what_the_text_says(utc):
    doc = json.loads(dump(two_comms(), nccl_version="2.30.7", cuda_runtime_version=13000, cuda_driver_version=13010))
    assert list(doc) == [
        "nccl_version",
        "cuda_runtime_version",
        "cuda_driver_version",
        "torchras_version",
        "torch_version",
        "timestamp",
        "communicators_count",
        "communicators",
        "restarts",
        "ras",
    ]
    assert (doc["nccl_version"], doc["cuda_runtime_version"], doc["cuda_driver_version"]) == ("2.30.7", 13000, 13010)
    assert doc["timestamp"] == "1970-01-01 00:00:00"
    assert doc["communicators_count"] == 2
    first, second = doc["communicators"]
    assert (first["hash"], second["hash"]) == ("0x5", "0xabc")  # merged-id order, not table order
    assert first["missing_ranks"][0]["status"] == {"unresponsive": False, "considered_dead": False, "left": False}
    rank = second["ranks"][1]
    assert list(rank["collective_counts"]) == list(OP_TYPES)
    assert rank["collective_counts"]["AllReduce"] == 2 and rank["completed_counts"]["AllReduce"] == 1
    assert rank["incarnation"] == 0xABC001
    assert doc["ras"] == {
        "collection_time_sec": 0.012,
        "timeouts_count": 1,
        "dead_count": 0,
        "left_count": 0,
        "waiting_count": 0,
        "missing_processes_count": 0,
    }


def test_empty_arrays_keep_nccl_layout(utc):
    out = dump(make_snapshot(make_peers([1])))
    assert '  "communicators": [\n\n  ],\n' in out
    assert json.loads(out)["communicators"] == []


def test_odd_hostname_and_versions_are_escaped():
    odd = 'we"ird\\host\n\t\u00e9\u2603'
    peer = PeerInfo(Addr("10.0.0.1", 1), 7, odd, 42, (0,), 0)
    snapshot = JobSnapshot(
        peers=(peer,), responses={peer.addr: ProcessData((CommRecord(0x1, 1, (RankRecord(0, device=0),)),))}
    )
    out = dump(snapshot, torch_version='2.13"\n', nccl_version="\\")
    doc = json.loads(out)
    assert doc["communicators"][0]["ranks"][0]["hostname"] == odd
    assert (doc["torch_version"], doc["nccl_version"]) == ('2.13"\n', "\\")
    assert all(ord(c) < 128 for c in out)


def test_missing_ranks_dead_silent_left_and_unknown():
    peers = make_peers([4], gpus=0)
    snapshot = make_snapshot(peers, comm_records(peers, 0x9, holders=[0]), dead=[1], silent=[2], left=[3])
    doc = json.loads(dump(snapshot))
    missing = {m["rank"]: (m["status"], m["pid"], m["cuda_dev"]) for m in doc["communicators"][0]["missing_ranks"]}
    assert missing == {
        1: ({"unresponsive": True, "considered_dead": True, "left": False}, 1001, -1),
        2: ({"unresponsive": True, "considered_dead": False, "left": False}, 1002, -1),
        3: ({"unresponsive": False, "considered_dead": False, "left": True}, 1003, -1),
    }
    assert doc["ras"]["dead_count"] == 1 and doc["ras"]["left_count"] == 1
    assert doc["ras"]["missing_processes_count"] == 1

    orphan = JobSnapshot(
        peers=peers[:1], responses={peers[0].addr: ProcessData((CommRecord(0x9, 2, (RankRecord(0),)),))}
    )
    entry = json.loads(dump(orphan))["communicators"][0]["missing_ranks"][0]
    assert (entry["host"], entry["pid"], entry["incarnation"]) == ("unknown", -1, None)


def test_collection_time_that_is_not_a_number_still_parses():
    snapshot = make_snapshot(make_peers([1]), collection_time=float("nan"))
    assert json.loads(dump(snapshot))["ras"]["collection_time_sec"] == 0.0
