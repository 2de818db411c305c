"""The verdict journal (``TORCHRAS_JOURNAL_DIR``, docs/operations.md §11) in the restart path: a verdict that
restarts training is in every survivor's journal before its restart acts, and ``rascli --journal`` shows the job's
timeline.

The real job: 3 gloo ranks under ``inprocess.Wrapper`` (tests/inprocess/inprocess_workload.py), each with the RAS
node its Wrapper starts; rank 2 is stopped (SIGSTOP), and the mesh's PEER_HUNG (2 s at factor 0.2) restarts the
other two in place: nothing else would for a minute (their soft timeout), so the restart is the verdict's, and it
takes the path that waits for a verdict (an external verdict interrupted the iteration). The hook itself
(``monitor_thread._journal_before_restart``) is tested first, against a stand-in for rasd.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from inprocess import monitor_thread
from inprocess.attribution import Interruption, InterruptionRecord
from inprocess_jobs import REPOSITORY, started

JOB_DEADLINE = 300  # seconds for the whole job: start-up alone (torch imports) is slow on 2 loaded cores
LOGS = {"inprocess": "INFO", "rasd": "INFO"}
#: The restart's first line: the monitor thread's, before its abort (the workload's log format: local time).
RESTART_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) inprocess\.monitor_thread restart: ", re.MULTILINE)


class StandIn:
    """``sys.modules["rasd"]`` for the hook: records how it was asked to wait."""

    def __init__(self, fails: bool = False) -> None:
        self.calls: list[bool] = []
        self.fails = fails

    def sync_journal(self, verdict: bool = False) -> bool:
        self.calls.append(verdict)
        if self.fails:
            raise OSError("a broken journal")
        return True


def test_the_restart_waits_for_a_verdict_only_when_an_external_verdict_interrupted(monkeypatch):
    stand_in = StandIn()
    monkeypatch.setitem(sys.modules, "rasd", types.SimpleNamespace(sync_journal=stand_in.sync_journal))
    monitor_thread._journal_before_restart([InterruptionRecord(2, Interruption.EXTERNAL)])
    monitor_thread._journal_before_restart([InterruptionRecord(1, Interruption.EXCEPTION)])
    monitor_thread._journal_before_restart(
        [InterruptionRecord(1, Interruption.EXCEPTION), InterruptionRecord(3, Interruption.EXTERNAL)]
    )
    assert stand_in.calls == [True, False, True]
    broken = StandIn(fails=True)
    monkeypatch.setitem(sys.modules, "rasd", types.SimpleNamespace(sync_journal=broken.sync_journal))
    monitor_thread._journal_before_restart([InterruptionRecord(2, Interruption.EXTERNAL)])  # never raises
    assert broken.calls == [True]
    monkeypatch.delitem(sys.modules, "rasd")
    monitor_thread._journal_before_restart([InterruptionRecord(2, Interruption.EXTERNAL)])  # rasd not loaded


def journal_of(directory: Path, rank: int) -> list[dict]:
    (path,) = directory.glob(f"journal-*-rank{rank}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def time_of_day(epoch: float) -> float:
    moment = datetime.datetime.fromtimestamp(epoch)
    return moment.hour * 3600 + moment.minute * 60 + moment.second + moment.microsecond / 1e6


def first_line(lines: list[str], pattern: str) -> int:
    found = [i for i, text in enumerate(lines) if re.search(pattern, text)]
    assert found, (pattern, lines)
    return found[0]


@pytest.mark.slow
def test_every_survivor_journals_the_verdict_before_its_restart_and_rascli_shows_the_timeline(launch, tmp_path):
    journals = tmp_path / "journals"
    job = launch(
        {
            "steps": 8,
            "env": {"TORCHRAS_TIMEOUT_FACTOR": "0.2", "TORCHRAS_JOURNAL_DIR": str(journals)},
            "log_levels": LOGS,
            "wrapper": {"soft_timeout": 60, "hard_timeout": 90, "barrier_timeout": 200},
            "faults": [{"iteration": 0, "rank": 2, "step": 3, "kind": "stop"}],
        },
        world_size=3,
    )
    codes = job.wait(JOB_DEADLINE, ranks=[0, 1])
    assert codes == [0, 0], job.diagnostics()
    stopped = started(job, 2, 0)["pid"]

    for rank in (0, 1):
        lines = journal_of(journals, rank)
        assert all(line["v"] == 1 and line["rank"] == rank for line in lines), lines
        assert lines[0]["record"] == "start" and lines[0]["pid"] == started(job, rank, 0)["pid"]
        hangs = [
            i
            for i, line in enumerate(lines)
            if line.get("kind") == "PEER_HUNG" and line["subject"]["pid"] == stopped and line["subject"]["rank"] == 2
        ]
        restarts = [i for i, line in enumerate(lines) if line["record"] == "restart"]
        assert len(hangs) == 1 and len(restarts) == 1, lines
        hang, restart = lines[hangs[0]], lines[restarts[0]]
        # In the file, the verdict comes first; its evidence is this process's counts of the hung rank's group.
        assert hangs[0] < restarts[0], lines
        assert hang["iteration"] == 0 and restart["iteration"] == 1
        assert restart["restart"]["terminated"] == [2] and "PEER_HUNG of rank 2" in restart["restart"]["cause"]
        comms = hang["evidence"]["comms"]
        assert comms and all(r["launched"].get("AllReduce", 0) >= 4 for c in comms for r in c["ranks"]), hang
        for recorder in hang["evidence"].get("flight_recorder", []):  # the Flight Recorder, where it is on
            assert all(e["profiling_name"].startswith("gloo:") for e in recorder["entries"]), recorder
        # In time, the verdict was journaled before the restart's first line (the log has milliseconds).
        (first, *_) = RESTART_LINE.findall(job.stderr(rank)) or [None]
        assert first is not None, job.stderr(rank)
        hours, minutes, seconds, millis = (int(part) for part in first)
        logged = hours * 3600 + minutes * 60 + seconds + millis / 1000
        assert time_of_day(hang["epoch"]) < logged + 0.001, (hang, first)
        assert "external verdict PEER_HUNG [2] applied" in "".join(job.stderr(r) for r in (0, 1)), job.diagnostics()

    assert [line["record"] for line in journal_of(journals, 2)] == ["start"]  # stopped: it wrote nothing more

    timeline = subprocess.run(
        [sys.executable, "-m", "rascli", "--journal", str(journals)],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        timeout=60,
    )
    assert timeline.returncode == 0 and timeline.stderr == "", timeline
    shown = timeline.stdout.splitlines()
    for rank in (0, 1):
        hang = first_line(shown, rf"pid \d+ rank {rank} .*PEER_HUNG\s+rank 2 \(pid {stopped} ")
        restart = first_line(shown, rf"pid \d+ rank {rank} .*RESTART\s+restart 1 .*rank 2 terminated")
        assert hang < restart, timeline.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "rascli", "--journal", str(journals), "-f", "json"],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        timeout=60,
    )
    records = json.loads(as_json.stdout)
    assert [r["epoch"] for r in records] == sorted(r["epoch"] for r in records)
    assert {(r["rank"], r["record"]) for r in records} >= {(0, "restart"), (1, "restart"), (2, "start")}
