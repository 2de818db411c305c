"""The verdict journal's writer (``rasd/services/journal.py``): what a line holds, its bounds in size, the budget a
restart waits for it whatever the disk does, and one WARNING when the disk or the directory fails.

The ``Journal`` is driven by hand here (``on_event`` as the RAS thread calls it, ``sync`` as inprocess's monitor
thread does); the last tests run it in a real node of this process (``TORCHRAS_JOURNAL_DIR``)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

import rasd
from polling import wait_for
from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord, RestartRecord
from rasd.core.events import Event, Kind
from rasd.core.frames import Frame
from rasd.core.peers import Addr, PeerInfo
from rasd.services import journal as journal_module
from rasd.services.journal import BUDGET_S, FR_ENTRIES, SCHEMA, Journal

ME = PeerInfo(Addr("10.0.0.1", 4001), pid=4242, hostname="node1", incarnation=7, rank=1)
DEAD = PeerInfo(Addr("10.0.0.2", 4002), pid=4711, hostname="node2", incarnation=9, devices=(3,), rank=2)
COMM = 0xA7CC1AE375C5C684
ALL_REDUCE = OP_TYPES.index("AllReduce")
#: How long a test waits for what must happen (a loaded 2-core machine is slow); never a claim about speed.
PATIENT_S = 30.0


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch):
    """The one WARNING per process, as in a fresh process."""
    monkeypatch.setattr(journal_module, "_warned", threading.Event())


def counts(launched: int, completed: int) -> tuple[int, ...]:
    values = [0] * N_OPS
    values[ALL_REDUCE] = launched
    return tuple(values), tuple([completed if i == ALL_REDUCE else 0 for i in range(N_OPS)])


def local_data() -> ProcessData:
    launched, _ = counts(12, 0)
    _, completed = counts(0, 11)
    held = RankRecord(comm_rank=1, launched=launched, completed=completed, idle_ms=3200)
    other = CommRecord(comm_hash=0x1234, size=2, ranks=(RankRecord(comm_rank=0),), rank_map=((0, 2, 1),))
    return ProcessData(comms=(CommRecord(comm_hash=COMM, size=4, ranks=(held,), rank_map=((0, 4, 1),)), other))


def dead(details: str = "process no longer exists") -> Event:
    return Event(kind=Kind.PEER_DEAD, at=time.monotonic(), addr=DEAD.addr, peer=DEAD, details=details)


def stuck() -> Event:
    position = (Frame("train.py", 31, "step"), Frame("distributed_c10d.py", 2501, "all_reduce"))
    return Event(
        kind=Kind.COMM_STUCK,
        at=time.monotonic(),
        details="AllReduce operation 12 stuck; rank 2 behind (not launched)",
        comm_hash=COMM,
        ranks=(2,),
        positions=((2, position),),
    )


def restart() -> Event:
    record = RestartRecord(iteration=1, restarts=1, cause="PEER_DEAD of rank 2", terminated=(2,), seconds_lost=0.4)
    return Event(kind=Kind.RESTART, at=time.monotonic(), addr=ME.addr, peer=ME, restart=record, ranks=(2,))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def started(directory: Path, **kwargs) -> Journal:
    journal = Journal(str(directory), ME, local_data=local_data, flight_recorder=lambda: None, **kwargs)
    journal.start()
    return journal


def test_a_line_per_verdict_and_restart_with_the_evidence_at_hand(tmp_path):
    journal = started(tmp_path, iteration=lambda: 0)
    before = time.time()
    for event in (dead(), stuck(), Event(kind=Kind.PEER_LEFT, at=time.monotonic(), peer=DEAD), restart()):
        journal.on_event(event)
    journal.on_event(Event(kind=Kind.PEER_CONNECTED, at=time.monotonic(), peer=DEAD))  # a trace event: not journaled
    assert journal.sync(PATIENT_S)
    journal.close(PATIENT_S)

    assert journal.path == str(tmp_path / "journal-node1-4242-rank1.jsonl")
    start, death, stall, left, restarted = lines(Path(journal.path))
    for line in (start, death, stall, left, restarted):
        assert line["v"] == SCHEMA and (line["host"], line["pid"], line["rank"]) == ("node1", 4242, 1)
        assert line["time"].endswith("Z") and line["time"][:19] == time.strftime(
            "%Y-%m-%dT%H:%M:%S", time.gmtime(int(line["epoch"]))
        )
        assert before - 5 < line["epoch"] < time.time() + 1
    assert start["record"] == "start" and start["mesh"] == "10.0.0.1:4001" and start["incarnation"] == 7

    assert (death["record"], death["kind"], death["iteration"]) == ("verdict", "PEER_DEAD", 0)
    assert death["subject"] == {
        "host": "node2",
        "addr": "10.0.0.2:4002",
        "pid": 4711,
        "rank": 2,
        "incarnation": 9,
        "devices": [3],
    }
    assert death["details"] == "process no longer exists" and death["comm_hash"] is None
    # The dead process (rank 2) is a rank of the first communicator only: its counts, as this process holds them.
    (comm,) = death["evidence"]["comms"]
    assert comm["comm_hash"] == f"{COMM:016x}" and comm["size"] == 4
    assert comm["ranks"] == [
        {
            "comm_rank": 1,
            "global_rank": 1,
            "status": "RUNNING",
            "launched": {"AllReduce": 12},
            "completed": {"AllReduce": 11},
            "idle_ms": 3200,
        }
    ]

    assert (stall["kind"], stall["comm_hash"], stall["ranks"], stall["subject"]) == (
        "COMM_STUCK",
        f"{COMM:016x}",
        [2],
        None,
    )
    assert stall["positions"] == [
        {
            "rank": 2,
            "frames": [
                {"file": "train.py", "line": 31, "function": "step"},
                {"file": "distributed_c10d.py", "line": 2501, "function": "all_reduce"},
            ],
        }
    ]
    assert [c["comm_hash"] for c in stall["evidence"]["comms"]] == [f"{COMM:016x}"]
    assert left["kind"] == "PEER_LEFT" and "evidence" not in left  # not a fault: no evidence gathered

    assert (restarted["record"], restarted["kind"], restarted["iteration"]) == ("restart", "RESTART", 1)
    assert restarted["restart"] == {
        "iteration": 1,
        "restarts": 1,
        "cause": "PEER_DEAD of rank 2",
        "terminated": [2],
        "seconds_lost": 0.4,
    }


def test_the_flight_recorder_entries_of_the_communicators_involved(tmp_path):
    """The recent entries of the communicator's group, with the fields kept; another group's are left out."""
    entries = [
        {
            "process_group": ["0" if i % 2 else "1", "default_pg"],
            "collective_seq_id": i,
            "profiling_name": "gloo:all_reduce",
            "retired": i < 38,
            "time_created_ns": 1_000_000 * i,
            "frames": [{"name": "big"}] * 10,  # not kept
        }
        for i in range(40)
    ]
    dumps = []

    def dump() -> str:
        dumps.append(1)
        return json.dumps({"entries": entries})

    journal = Journal(
        str(tmp_path), ME, local_data=local_data, flight_recorder=lambda: (dump, {COMM: ("0",), 0x1234: ("1",)})
    )
    journal.start()
    journal.on_event(stuck())
    journal.on_event(stuck())  # a second verdict within FR_EVERY_S shares the dump
    assert journal.sync(PATIENT_S)
    journal.close(PATIENT_S)
    for line in lines(Path(journal.path))[1:]:
        (recorder,) = line["evidence"]["flight_recorder"]
        assert recorder["comm_hash"] == f"{COMM:016x}" and recorder["group"] == "0"
        kept = recorder["entries"]
        assert [e["collective_seq_id"] for e in kept] == list(range(40 - 2 * FR_ENTRIES + 1, 40, 2))
        assert set(kept[-1]) == {"collective_seq_id", "profiling_name", "retired", "time_created_ns"}
    assert len(dumps) == 1


def test_a_line_never_passes_its_bound_and_says_when_it_was_cut(tmp_path):
    journal = started(tmp_path, max_line_bytes=2000)
    journal.on_event(dead(details="x" * 10_000))
    huge = Event(
        kind=Kind.COMM_STUCK,
        at=time.monotonic(),
        comm_hash=COMM,
        details="stuck",
        positions=tuple((r, tuple(Frame(f"f{i}.py", i, "g") for i in range(4))) for r in range(100)),
    )
    journal.on_event(huge)
    assert journal.sync(PATIENT_S)
    journal.close(PATIENT_S)
    raw = Path(journal.path).read_bytes().splitlines(keepends=True)
    assert all(len(line) <= 2000 for line in raw)
    _, death, stall = (json.loads(line) for line in raw)
    assert death["truncated"] is True and death["kind"] == "PEER_DEAD" and death["details"].startswith("x")
    assert death["subject"]["pid"] == 4711
    assert stall["truncated"] is True and stall["details"] == "stuck" and len(stall["positions"]) <= 8


def test_the_file_is_rotated_once_at_its_size_bound(tmp_path):
    journal = started(tmp_path, max_file_bytes=4000)
    for i in range(60):
        journal.on_event(dead(details=f"death {i}"))
    assert journal.sync(PATIENT_S)
    journal.close(PATIENT_S)
    current, previous = Path(journal.path), Path(journal.path + ".1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [current.name, previous.name]
    assert 0 < current.stat().st_size <= 4000 and 0 < previous.stat().st_size <= 4000
    kept = [line["details"] for line in lines(previous) + lines(current) if line["record"] == "verdict"]
    # The newest lines, in order, without a gap; the older ones went with the file rotated out.
    assert kept[-1] == "death 59"
    assert kept == [f"death {i}" for i in range(60 - len(kept), 60)]


class Stalled:
    """A write that blocks until released: a disk (or a file system) that stopped answering."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, fd: int, data: memoryview) -> int:
        self.entered.set()
        self.release.wait(PATIENT_S)
        return os.write(fd, data)


def test_a_stalled_writer_never_holds_a_restart_past_the_budget(tmp_path):
    stalled = Stalled()
    journal = started(tmp_path, write=stalled, max_queued=50)
    assert stalled.entered.wait(PATIENT_S)  # the writer is stuck in its first write (the start line)
    took = []
    for _ in range(100):  # the RAS thread's side never waits: it queues, and drops beyond the queue's bound
        began = time.monotonic()
        journal.on_event(dead())
        took.append(time.monotonic() - began)
    began = time.monotonic()
    assert journal.sync(BUDGET_S, verdict=True) is False
    waited = time.monotonic() - began
    # It waited for the journal, up to the budget and not much beyond (generous: a loaded machine is slow).
    assert BUDGET_S * 0.9 <= waited < BUDGET_S + 5.0, waited
    assert max(took) < 5.0, max(took)
    stalled.release.set()
    assert journal.sync(PATIENT_S)
    journal.close(PATIENT_S)
    written = lines(Path(journal.path))
    assert [line["record"] for line in written] == ["start"] + ["verdict"] * 50 + ["dropped"]
    assert written[-1]["count"] == 50


def test_sync_waits_for_the_verdict_behind_a_restart(tmp_path):
    """A restart that an external verdict caused waits (within the budget) until such a verdict is journaled."""
    journal = started(tmp_path)
    assert journal.sync(PATIENT_S)
    threading.Timer(0.05, lambda: journal.on_event(dead())).start()
    assert journal.sync(PATIENT_S, verdict=True)
    assert [line["kind"] for line in lines(Path(journal.path))[1:]] == ["PEER_DEAD"]
    # That verdict is spent: the next restart caused by a verdict waits for one of its own, at most the budget.
    journal.on_event(Event(kind=Kind.PEER_LEFT, at=time.monotonic(), peer=DEAD))  # not a cause
    assert journal.sync(0.3, verdict=True) is False
    journal.close(PATIENT_S)


def test_no_space_left_is_one_warning_and_the_journal_is_off(tmp_path, caplog):
    """The journal file is a link to /dev/full: every write fails with ENOSPC."""
    journal = Journal(str(tmp_path), ME, flight_recorder=lambda: None)
    os.symlink("/dev/full", journal.path)
    with caplog.at_level(logging.DEBUG, logger="rasd"):
        journal.start()
        for _ in range(5):
            journal.on_event(dead())
        began = time.monotonic()
        assert journal.sync(PATIENT_S, verdict=True) is False
        assert time.monotonic() - began < PATIENT_S  # it ended because the journal is off, not at the deadline
        journal.on_event(dead())
        assert journal.sync(PATIENT_S) is False
        second = Journal(str(tmp_path), ME, flight_recorder=lambda: None)  # a later node of the same process
        second.start()
        second.close(PATIENT_S)
        journal.close(PATIENT_S)
    assert journal.off and second.off
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        f"rasd: cannot write the verdict journal {journal.path} (No space left on device); "
        "this process keeps no journal"
    ]


def test_a_directory_that_is_a_file_is_one_warning(tmp_path, caplog):
    in_the_way = tmp_path / "journal"
    in_the_way.write_text("not a directory")
    journal = Journal(str(in_the_way), ME, flight_recorder=lambda: None)
    with caplog.at_level(logging.WARNING, logger="rasd"):
        journal.start()
        journal.on_event(dead())
        assert journal.sync(PATIENT_S) is False
        journal.close(PATIENT_S)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and str(in_the_way) in warnings[0] and "(Not a directory)" in warnings[0], warnings
    assert in_the_way.read_text() == "not a directory"


# ----------------------------------------------------------------------------------------------------------------
# In a real node of this process (conftest.py's ``node``: a mesh of one)


@pytest.fixture
def journal_dir(tmp_path, monkeypatch):
    directory = tmp_path / "journal"
    monkeypatch.setenv("TORCHRAS_JOURNAL_DIR", str(directory))
    return directory


@pytest.fixture
def no_journal_dir(monkeypatch):
    monkeypatch.delenv("TORCHRAS_JOURNAL_DIR", raising=False)


def test_a_node_journals_its_restarts_and_rasd_sync_journal_waits_for_them(journal_dir, node):
    rasd.record_restart(3, "PEER_HUNG of rank 0", [0], 1.5)

    def written() -> list[dict]:
        files = list(journal_dir.glob("journal-*.jsonl"))
        return lines(files[0]) if rasd.sync_journal() and len(files) == 1 else []

    start, restarted = wait_for(written, lambda found: len(found) == 2, PATIENT_S, what="the restart's line")
    assert (start["record"], start["pid"], start["rank"]) == ("start", os.getpid(), -1)
    assert restarted["restart"]["cause"] == "PEER_HUNG of rank 0" and restarted["iteration"] == 3


def test_without_the_setting_a_node_keeps_no_journal(no_journal_dir, node, tmp_path):
    assert rasd.sync_journal() is False and rasd.sync_journal(verdict=True) is False
    assert not list(tmp_path.rglob("journal-*"))


def test_sync_journal_without_a_node_is_false():
    rasd.stop(goodbye=False)
    assert rasd.sync_journal() is False
