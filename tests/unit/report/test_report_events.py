"""MONITOR mode (docs/protocol.md §5): one event as a text line and as a JSON object."""

import json

from rasd.core.events import Event, Kind
from rasd.core.frames import Frame
from rasd.core.peers import Addr, PeerInfo
from rasd.report import format_event_json, format_event_text, format_timestamp

WHEN = 1766149627.0  # 2025-12-19 13:07:07 UTC
PEER = PeerInfo(Addr("172.16.64.245", 40123), 1524345, "gpu-node-7", 77, (1,), 12)
TWO_GPUS = PeerInfo(Addr("10.0.0.2", 40000), 55, "n2", 78, (0, 1), 3)


def test_timestamp_is_local_time(utc):
    assert format_timestamp(WHEN) == "2025-12-19 13:07:07"


def test_text_with_a_known_peer_keeps_the_blank_before_empty_details(utc):
    event = Event(Kind.PEER_DEAD, at=5.0, addr=PEER.addr, peer=PEER)
    assert format_event_text(event, wall_time=WHEN) == (
        "[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 managing GPU 1 \n"
    )


def test_text_with_details_and_several_gpus(utc):
    event = Event(
        Kind.PEER_UNRESPONSIVE, at=0.0, peer=TWO_GPUS, details="peer not responding for 5s (keepalive warning)"
    )
    assert format_event_text(event, wall_time=WHEN) == (
        "[2025-12-19 13:07:07] PEER_UNRESPONSIVE: Process 55 on node 10.0.0.2 managing GPUs 0,1 "
        "peer not responding for 5s (keepalive warning)\n"
    )


def test_text_with_only_an_address(utc):
    event = Event(Kind.PEER_CONNECTING, at=0.0, addr=Addr("10.1.2.3", 28028))
    assert format_event_text(event, wall_time=WHEN) == "[2025-12-19 13:07:07] PEER_CONNECTING: 10.1.2.3<28028> \n"
    # ... which the peer table can resolve.
    cpu = PeerInfo(Addr("10.1.2.3", 28028), 9, "h", 1, (), 0)
    assert format_event_text(event, wall_time=WHEN, peers={cpu.addr: cpu}) == (
        "[2025-12-19 13:07:07] PEER_CONNECTING: Process 9 on node 10.1.2.3 managing CPU \n"
    )


def test_text_without_a_peer(utc):
    event = Event(Kind.COMM_STUCK, at=0.0, details="AllReduce 17 stuck for 30s", comm_hash=0xAB, ranks=(3, 4))
    assert format_event_text(event, wall_time=WHEN) == (
        "[2025-12-19 13:07:07] COMM_STUCK: AllReduce 17 stuck for 30s\n"
    )


def test_text_is_always_one_line(utc):
    event = Event(Kind.PEER_DISCONNECTED, at=0.0, peer=PEER, details="a\nb\r\nc")
    line = format_event_text(event, wall_time=WHEN)
    assert line.count("\n") == 1 and line.endswith("a b c\n")


def test_json_with_a_known_peer(utc):
    event = Event(Kind.PEER_DEAD, at=5.0, peer=PEER)
    assert format_event_json(event, wall_time=WHEN) == (
        "{\n"
        '  "timestamp": "2025-12-19 13:07:07",\n'
        '  "group": "LIFECYCLE",\n'
        '  "event": "PEER_DEAD",\n'
        '  "peer": {\n'
        '    "host": "172.16.64.245",\n'
        '    "pid": 1524345,\n'
        '    "cuda_devs": [1],\n'
        '    "nvml_devs": [1],\n'
        '    "hostname": "gpu-node-7",\n'
        '    "incarnation": 77\n'
        "  },\n"
        '  "details": ""\n'
        "}\n"
    )


def test_json_trace_event_with_an_unknown_peer_and_cpu_devices(utc):
    event = Event(
        Kind.PEER_KEEPALIVE_TIMEOUT,
        at=0.0,
        addr=Addr("::1", 7),
        details='keepalive timeout after 20s, "terminating" connection',
    )
    assert format_event_json(event, wall_time=WHEN) == (
        "{\n"
        '  "timestamp": "2025-12-19 13:07:07",\n'
        '  "group": "TRACE",\n'
        '  "event": "PEER_KEEPALIVE_TIMEOUT",\n'
        '  "peer": {\n'
        '    "addr": "::1<7>"\n'
        "  },\n"
        '  "details": "keepalive timeout after 20s, \\"terminating\\" connection"\n'
        "}\n"
    )
    cpu = PeerInfo(Addr("::1", 7), 9, "h", 1, (), 0)
    doc = json.loads(format_event_json(event, wall_time=WHEN, peers={cpu.addr: cpu}))
    assert doc["peer"]["cuda_devs"] == [] and doc["peer"]["pid"] == 9


def test_json_communicator_verdict(utc):
    event = Event(
        Kind.COMM_STUCK,
        at=0.0,
        peer=TWO_GPUS,
        details="AllReduce counts differ",
        comm_hash=0x27A079B828FF1A75,
        ranks=(0, 5),
    )
    assert format_event_json(event, wall_time=WHEN) == (
        "{\n"
        '  "timestamp": "2025-12-19 13:07:07",\n'
        '  "group": "LIFECYCLE",\n'
        '  "event": "COMM_STUCK",\n'
        '  "peer": {\n'
        '    "host": "10.0.0.2",\n'
        '    "pid": 55,\n'
        '    "cuda_devs": [0,1],\n'
        '    "nvml_devs": [0,1],\n'
        '    "hostname": "n2",\n'
        '    "incarnation": 78\n'
        "  },\n"
        '  "details": "AllReduce counts differ",\n'
        '  "comm_hash": "0x27a079b828ff1a75",\n'
        '  "ranks": [0,5]\n'
        "}\n"
    )


def test_json_without_a_peer_omits_the_key(utc):
    event = Event(Kind.COMM_STUCK, at=0.0, comm_hash=None)
    doc = json.loads(format_event_json(event, wall_time=WHEN))
    assert doc == {
        "timestamp": "2025-12-19 13:07:07",
        "group": "LIFECYCLE",
        "event": "COMM_STUCK",
        "details": "",
        "comm_hash": None,
        "ranks": [],
    }


# --- positions (frames.py): where a hung process was last seen, where each rank behind a verdict was ---------------

WAITING = (Frame("/src/train.py", 31, "step"), Frame("/usr/lib/python3.11/queue.py", 171, "get"))


def test_a_hung_process_says_where_it_was_last_seen(utc):
    event = Event(Kind.PEER_HUNG, at=0.0, peer=PEER, details="hung for 20s", positions=((12, WAITING),))
    assert format_event_text(event, wall_time=WHEN) == (
        "[2025-12-19 13:07:07] PEER_HUNG: Process 1524345 on node 172.16.64.245 managing GPU 1 "
        "hung for 20s; last seen in train.py:31 (step) -> queue.py:171 (get)\n"
    )
    quiet = Event(Kind.PEER_HUNG, at=0.0, peer=PEER, positions=((12, WAITING),))
    assert format_event_text(quiet, wall_time=WHEN).endswith(
        "GPU 1 last seen in train.py:31 (step) -> queue.py:171 (get)\n"
    )


def test_json_carries_the_positions_last_and_the_details_say_them_too(utc):
    event = Event(Kind.PEER_HUNG, at=0.0, peer=PEER, details="hung for 20s", positions=((12, WAITING),))
    text = format_event_json(event, wall_time=WHEN)
    assert text.endswith(
        '  "details": "hung for 20s; last seen in train.py:31 (step) -> queue.py:171 (get)",\n'
        '  "positions": [{"rank": 12, "frames": [{"file": "/src/train.py", "line": 31, "function": "step"}, '
        '{"file": "/usr/lib/python3.11/queue.py", "line": 171, "function": "get"}]}]\n'
        "}\n"
    )
    doc = json.loads(text)
    assert list(doc)[-2:] == ["details", "positions"]


def test_a_stuck_verdict_keeps_its_keys_and_adds_the_positions_after_them(utc):
    event = Event(
        Kind.COMM_STUCK,
        at=0.0,
        details="Broadcast operation 1 stuck; rank 1 behind (not launched); rank 1 in train.py:31 (step)",
        comm_hash=0xAB,
        ranks=(11,),
        positions=((1, WAITING),),
    )
    doc = json.loads(format_event_json(event, wall_time=WHEN))
    assert list(doc)[-4:] == ["details", "comm_hash", "ranks", "positions"]
    assert doc["details"] == event.details  # a verdict's details already say where: not repeated
    assert doc["positions"] == [
        {
            "rank": 1,
            "frames": [
                {"file": "/src/train.py", "line": 31, "function": "step"},
                {"file": "/usr/lib/python3.11/queue.py", "line": 171, "function": "get"},
            ],
        }
    ]
    assert format_event_text(event, wall_time=WHEN).endswith(f"COMM_STUCK: {event.details}\n")


def test_an_event_without_positions_has_no_positions_key_and_a_hung_one_no_last_seen(utc):
    event = Event(Kind.PEER_HUNG, at=0.0, peer=PEER, details="hung for 20s")
    assert format_event_text(event, wall_time=WHEN).endswith("GPU 1 hung for 20s\n")
    assert format_event_json(event, wall_time=WHEN).endswith('  "details": "hung for 20s"\n}\n')
