"""``rascli --journal DIR``: the verdict journals of a job's processes as one timeline (docs/cli.md, the format in
docs/operations.md §11). Journal files are written here by hand, as rasd writes them, and once by rasd's own writer
(the contract between the two)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rascli.errors import Exit, RasCliError
from rascli.journal import read_journals, when
from rascli.options import parse
from rascli_helpers import run_cli

T0 = 1_795_765_554.0


def line(record: str, epoch: float, pid: int, rank: int, **fields: object) -> dict:
    return {
        "v": 1,
        "time": "",
        "epoch": epoch,
        "host": "node1",
        "pid": pid,
        "rank": rank,
        "iteration": fields.pop("iteration", 0),
        "record": record,
        **fields,
    }


def hang(epoch: float, pid: int, rank: int) -> dict:
    return line(
        "verdict",
        epoch,
        pid,
        rank,
        kind="PEER_HUNG",
        subject={"host": "node2", "addr": "10.0.0.2:4002", "pid": 4711, "rank": 2, "incarnation": 9},
        details="peer silent for 2s",
        comm_hash=None,
        ranks=[],
        positions=[{"rank": 2, "frames": [{"file": "train.py", "line": 31, "function": "step"}]}],
        evidence={
            "comms": [
                {
                    "comm_hash": "8761d7000d0a92ca",
                    "size": 3,
                    "ranks": [
                        {
                            "comm_rank": rank,
                            "global_rank": rank,
                            "status": "RUNNING",
                            "launched": {"AllReduce": 5},
                            "completed": {"AllReduce": 4},
                            "idle_ms": 1642,
                        }
                    ],
                }
            ],
            "flight_recorder": [
                {
                    "comm_hash": "8761d7000d0a92ca",
                    "group": "0",
                    "entries": [
                        {
                            "collective_seq_id": 5,
                            "profiling_name": "gloo:all_reduce",
                            "state": "scheduled",
                            "retired": False,
                        }
                    ],
                }
            ],
        },
    )


def restart(epoch: float, pid: int, rank: int) -> dict:
    return line(
        "restart",
        epoch,
        pid,
        rank,
        iteration=1,
        kind="RESTART",
        restart={
            "iteration": 1,
            "restarts": 1,
            "cause": "PEER_HUNG of rank 2",
            "terminated": [2],
            "seconds_lost": 0.126,
        },
    )


def write(path: Path, lines: list[dict], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in lines) + tail)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """Two survivors (rank 0's journal rotated once) and the hung rank, which wrote its start only."""
    write(tmp_path / "journal-node1-100-rank0.jsonl.1", [line("start", T0, 100, 0, mesh="10.0.0.1:4000")])
    write(tmp_path / "journal-node1-100-rank0.jsonl", [hang(T0 + 2.2, 100, 0), restart(T0 + 2.4, 100, 0)])
    write(tmp_path / "journal-node1-101-rank1.jsonl", [line("start", T0 + 0.1, 101, 1), hang(T0 + 2.1, 101, 1)])
    write(tmp_path / "journal-node2-4711-rank2.jsonl", [line("start", T0 + 0.05, 4711, 2)])
    return tmp_path


def test_the_journals_are_merged_by_time_rotated_files_included(job):
    result = run_cli(["--journal", str(job)])
    assert result.code == Exit.OK and result.err == ""
    shown = result.out.decode().splitlines()
    heads = [text for text in shown if not text.startswith(" ")]
    assert [(text.split()[4], text.split()[9]) for text in heads] == [
        ("100", "START"),
        ("4711", "START"),
        ("101", "START"),
        ("101", "PEER_HUNG"),
        ("100", "PEER_HUNG"),
        ("100", "RESTART"),
    ], shown
    assert " ".join(heads[0].split()[:10]) == f"{when(T0)} node1 pid 100 rank 0 iter 0 START"
    assert heads[0].endswith("journal started (mesh 10.0.0.1:4000)")
    assert heads[4].endswith("PEER_HUNG  rank 2 (pid 4711 on node2, 10.0.0.2:4002): peer silent for 2s")
    assert (
        "iter 1  RESTART    restart 1 (iteration 1) after PEER_HUNG of rank 2: rank 2 terminated, 0.126s lost"
        in heads[5]
    )
    # Each verdict's evidence below it: where the process was, this process's counts, the Flight Recorder counted.
    evidence = shown[shown.index(heads[4]) + 1 : shown.index(heads[5])]
    assert evidence == [
        "      rank 2 at train.py:31 (step)",
        "      communicator 8761d7000d0a92ca rank 0 of 3 (global 0) RUNNING: launched AllReduce 5, "
        "completed AllReduce 4, idle 1.6s",
        "      Flight Recorder: 1 entries of 1 group",
    ]


def test_verbose_shows_the_flight_recorder_entries(job):
    shown = run_cli(["--journal", str(job), "-v"]).out.decode()
    assert "      Flight Recorder 8761d7000d0a92ca #5 gloo:all_reduce scheduled, not retired" in shown


def test_json_is_the_records_as_written_in_time_order(job):
    result = run_cli(["--journal", str(job), "-f", "json"])
    records = json.loads(result.out)
    assert [(r["pid"], r["record"]) for r in records] == [
        (100, "start"),
        (4711, "start"),
        (101, "start"),
        (101, "verdict"),
        (100, "verdict"),
        (100, "restart"),
    ]
    assert records[4] == hang(T0 + 2.2, 100, 0)


def test_on_a_terminal_a_table(job):
    result = run_cli(["--journal", str(job)], tty=True, width=160)
    assert result.code == Exit.OK
    assert f"Verdict journal of 3 processes in {job}" in result.screen
    for word in ("TIME", "PROCESS", "ITER", "EVENT", "WHAT", "PEER_HUNG", "rank 2 (pid 4711 on node2"):
        assert word in result.screen, result.screen


def test_torn_lines_foreign_files_and_other_versions_are_skipped_with_a_note(job):
    rank1 = job / "journal-node1-101-rank1.jsonl"
    write(rank1, [line("start", T0 + 0.1, 101, 1), hang(T0 + 2.1, 101, 1)], tail=b'{"v":1,"epoch":17957655')
    (job / "notes.txt").write_text("an operator's notes\n")
    (job / "journal-node3-7-rank3.jsonl").write_text(
        json.dumps(dict(line("start", T0, 7, 3), v=2))
        + "\n"
        + "not json\n"
        + json.dumps([1, 2])
        + "\n"
        + json.dumps(line("start", T0 + 9, 7, 3))
        + "\n"
    )
    result = run_cli(["--journal", str(job)])
    assert result.code == Exit.OK
    assert result.err.splitlines() == [
        f"rascli: skipped the last line of {rank1}: it is incomplete (being written, or cut short by a crash)",
        f"rascli: skipped lines 2, 3 of {job / 'journal-node3-7-rank3.jsonl'}: not journal lines",
        f"rascli: skipped line 1 of {job / 'journal-node3-7-rank3.jsonl'}: schema version 2 (this rascli reads 1)",
        f"rascli: skipped {job / 'notes.txt'}: not a journal file",
    ]
    shown = result.out.decode()
    assert shown.count("PEER_HUNG  rank 2 (pid 4711") == 2 and "pid 7 rank 3" in shown


def test_an_empty_directory_and_a_missing_one(tmp_path):
    result = run_cli(["--journal", str(tmp_path)])
    assert result.code == Exit.OK and result.out == b"" and "No journal lines in" in result.err
    assert json.loads(run_cli(["--journal", str(tmp_path), "-f", "json"]).out) == []
    missing = run_cli(["--journal", str(tmp_path / "nowhere")])
    assert missing.code == Exit.USAGE
    assert (
        missing.err == f"rascli: cannot read the journal directory {tmp_path / 'nowhere'} (No such file or directory)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--journal"], "option '--journal' requires an argument"),
        (["--journal="], "option '--journal' requires a directory"),
        (["--journal=d", "--list"], "--list and --journal cannot be used together"),
        (["--journal=d", "-m"], "--monitor and --journal cannot be used together"),
    ],
)
def test_usage(argv, message):
    with pytest.raises(RasCliError) as error:
        parse(argv, {})
    assert message in error.value.message


def test_what_rasd_writes_is_what_rascli_reads(tmp_path):
    """The contract: rasd's writer and rascli's reader share nothing but docs/operations.md §11."""
    from rasd.core.comms import RestartRecord
    from rasd.core.events import Event, Kind
    from rasd.core.frames import Frame
    from rasd.core.peers import Addr, PeerInfo
    from rasd.services.journal import Journal

    me = PeerInfo(Addr("10.0.0.1", 4001), pid=4242, hostname="node1", incarnation=7, rank=1)
    peer = PeerInfo(Addr("10.0.0.2", 4002), pid=4711, hostname="node2", incarnation=9, rank=2)
    journal = Journal(str(tmp_path), me, flight_recorder=lambda: None)
    journal.start()
    now = time.monotonic()
    journal.on_event(
        Event(
            kind=Kind.PEER_HUNG,
            at=now,
            peer=peer,
            details="peer silent for 2s",
            positions=((2, (Frame("train.py", 31, "step"),)),),
        )
    )
    record = RestartRecord(iteration=1, restarts=1, cause="PEER_HUNG of rank 2", terminated=(2,), seconds_lost=0.5)
    journal.on_event(Event(kind=Kind.RESTART, at=now + 0.001, peer=me, restart=record))
    assert journal.sync(30)
    journal.close(30)
    entries, notes = read_journals(tmp_path)
    assert notes == [] and [e.kind for e in entries] == ["START", "PEER_HUNG", "RESTART"]
    shown = run_cli(["--journal", str(tmp_path)]).out.decode()
    assert "PEER_HUNG  rank 2 (pid 4711 on node2, 10.0.0.2:4002): peer silent for 2s" in shown
    assert "      rank 2 at train.py:31 (step)" in shown
    assert "restart 1 (iteration 1) after PEER_HUNG of rank 2: rank 2 terminated, 0.500s lost" in shown
