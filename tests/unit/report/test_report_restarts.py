"""The job's in-process restarts in the report (docs/protocol.md 3.5 and 4.1) and the RESTART event (section 5).

A restart is not a fault: the Restarts section sits between the communicator table and Errors, appears only once a
process has restarted, and adds nothing to Errors or Warnings.
"""

import dataclasses
import json
from pathlib import Path

from rasd.core.comms import RestartRecord, next_restart
from rasd.core.events import Event, Group, Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.report import build_report, format_event_json, format_event_text, render_json, render_text
from report_builders import RUNTIME_LINE, VERSION_LINE, comm_records, make_peers, make_snapshot, section

GOLDEN = Path(__file__).parent / "golden"
WHEN = 1766149627.0  # 2025-12-19 13:07:07 UTC
LAST = RestartRecord(
    iteration=5, restarts=2, cause="PEER_DEAD of rank 2 (pid 1002)", terminated=(2,), seconds_lost=0.4125
)


def text(snapshot, verbose=False):
    return render_text(build_report(snapshot), version_line=VERSION_LINE, runtime_line=RUNTIME_LINE, verbose=verbose)


def dump(snapshot):
    return render_json(build_report(snapshot), timestamp=0.0, torchras_version="0.1.0", torch_version="2.13.0+cpu")


def with_restarts(snapshot, records: dict[int, RestartRecord]):
    """The snapshot with process i (index into its peers) reporting ``records[i]``."""
    responses = dict(snapshot.responses)
    for i, record in records.items():
        addr = snapshot.peers[i].addr
        responses[addr] = dataclasses.replace(responses[addr], restart=record)
    return dataclasses.replace(snapshot, responses=responses)


def job(records: dict[int, RestartRecord], **kwargs):
    """Four processes of one node (then dead 3 terminated ranks, the others restarted); comm over the live ones."""
    peers = make_peers([4])
    return with_restarts(
        make_snapshot(peers, comm_records(peers, 0x27A079B828FF1A75, members=[0, 1, 3]), **kwargs), records
    )


def test_a_job_that_restarted_byte_for_byte():
    # Process 2 was killed; the three others restarted twice and now run iteration 5.
    snapshot = job({0: LAST, 1: LAST, 3: LAST}, dead=[2])
    assert text(snapshot) == (GOLDEN / "restarts_1x4.txt").read_text()


def test_the_section_is_only_an_insertion_and_changes_no_verdict():
    plain = job({}, dead=[2])
    restarted = job({0: LAST, 1: LAST, 3: LAST}, dead=[2])
    before, after = text(plain, verbose=True), text(restarted, verbose=True)
    block = (
        "\nRestarts\n========\n\n  Iteration 5 after 2 restarts\n"
        "  Last restart: PEER_DEAD of rank 2 (pid 1002); rank 2 terminated, 0.412s lost\n"
    )
    assert block in after and after.replace(block, "") == before
    assert after.index("Group     Comms") < after.index("Restarts") < after.index("\nErrors\n")
    assert section(after, "Errors") == section(before, "Errors")
    assert section(after, "Warnings") == section(before, "Warnings") == ""


def test_no_restart_no_section_and_json_null():
    snapshot = job({})
    assert "Restarts" not in text(snapshot, verbose=True)
    doc = json.loads(dump(snapshot))
    assert doc["restarts"] is None
    assert build_report(snapshot).restarts is None


def test_one_restart_nobody_terminated_no_cause():
    record = RestartRecord(iteration=1, restarts=1, cause="", terminated=(), seconds_lost=0.0)
    out = text(job({0: record, 1: record, 3: record}))
    assert "  Iteration 1 after 1 restart\n  Last restart: no rank terminated, 0.000s lost\n" in out


def test_the_job_iteration_is_the_highest_and_older_ones_are_listed():
    # Process 3 missed the last restart (still at iteration 4); process 0 has seen the most restarts.
    older = dataclasses.replace(LAST, iteration=4, restarts=1, cause="COMM_STUCK")
    most = dataclasses.replace(LAST, restarts=3, cause="PEER_HUNG of rank 3")
    report = build_report(job({0: most, 1: LAST, 3: older}))
    summary = report.restarts
    assert (summary.iteration, summary.restarts, summary.reporting, summary.behind_count) == (5, 3, 3, 1)
    assert summary.last == most  # first in process order at the job's iteration
    assert [(peer.pid, iteration) for peer, iteration in summary.behind] == [(1003, 4)]
    out = text(job({0: most, 1: LAST, 3: older}))
    assert (
        "  Iteration 5 after 3 restarts\n"
        "  Last restart: PEER_HUNG of rank 3; rank 2 terminated, 0.412s lost\n"
        "  1 job process is at an older iteration\n"
        "  Process 1003 on node 10.0.0.1 managing GPU 3 at iteration 4\n\nErrors\n"
    ) in out


def test_processes_behind_follow_the_outlier_rule():
    peers = make_peers([12])
    older = dataclasses.replace(LAST, iteration=4)
    records = {i: (older if i >= 8 else LAST) for i in range(12)}
    snapshot = with_restarts(make_snapshot(peers, comm_records(peers, 0x1)), records)
    # 4 of 12 behind: more than a quarter, so only counted; verbose (fewer than half) lists them.
    assert "  4 job processes are at an older iteration\n\nErrors" in text(snapshot)
    verbose = text(snapshot, verbose=True)
    assert "  4 job processes are at an older iteration\n  Process 1008 on node 10.0.0.1 managing GPU 8" in verbose
    assert verbose.count(" at iteration 4\n") == 4


def test_a_process_behind_that_the_table_does_not_know_is_counted():
    peers = make_peers([2])
    snapshot = with_restarts(make_snapshot(peers, comm_records(peers, 0x1)), {0: LAST})
    stranger = Addr("10.9.9.9", 1)
    responses = {
        **snapshot.responses,
        stranger: dataclasses.replace(
            snapshot.responses[peers[1].addr], restart=dataclasses.replace(LAST, iteration=1)
        ),
    }
    out = text(dataclasses.replace(snapshot, responses=responses))
    assert "  1 job process is at an older iteration\n  [could not find information on 1 process]\n" in out


def test_a_cause_with_line_breaks_stays_on_one_line():
    record = dataclasses.replace(LAST, cause="first\nsecond\r\nthird")
    assert "  Last restart: first second third; rank 2 terminated" in text(job({0: record}))


def test_json_fields():
    older = dataclasses.replace(LAST, iteration=4)
    two = dataclasses.replace(LAST, terminated=(2, 7), cause='say "hi"')
    out = dump(job({0: two, 1: LAST, 3: older}))
    assert (
        '  "restarts": {\n    "iteration": 5,\n    "restarts_count": 2,\n'
        '    "last_cause": "say \\"hi\\"",\n    "last_terminated_ranks": [2,7],\n'
        '    "last_seconds_lost": 0.412,\n    "processes_behind": [\n      {\n'
        '        "host": "10.0.0.1",\n        "pid": 1003,\n        "iteration": 4\n      }\n    ]\n'
        '  },\n  "ras": {\n'
    ) in out
    doc = json.loads(out)
    assert list(doc)[-2:] == ["restarts", "ras"]
    assert doc["restarts"] == {
        "iteration": 5,
        "restarts_count": 2,
        "last_cause": 'say "hi"',
        "last_terminated_ranks": [2, 7],
        "last_seconds_lost": 0.412,
        "processes_behind": [{"host": "10.0.0.1", "pid": 1003, "iteration": 4}],
    }
    nobody_behind = dump(job({0: LAST}))
    assert '    "processes_behind": [\n\n    ]\n  },\n' in nobody_behind
    assert json.loads(nobody_behind)["restarts"]["processes_behind"] == []


# --- the RESTART event (MONITOR) ---------------------------------------------------------------------------------

ME = PeerInfo(Addr("127.0.0.1", 40001), 4243, "vm", 99, (), 1)


def restart_event(record: RestartRecord) -> Event:
    return Event(
        Kind.RESTART, at=0.0, addr=ME.addr, peer=ME, details=record.describe(), ranks=record.terminated, restart=record
    )


def test_restart_is_a_lifecycle_event():
    assert Kind.RESTART.value == "RESTART" and restart_event(LAST).group == Group.LIFECYCLE


def test_restart_event_text_is_nccls_line(utc):
    assert format_event_text(restart_event(LAST), wall_time=WHEN) == (
        "[2025-12-19 13:07:07] RESTART: Process 4243 on node 127.0.0.1 managing CPU "
        "restart 2 (iteration 5) after PEER_DEAD of rank 2 (pid 1002): rank 2 terminated, 0.412s lost\n"
    )
    quiet = RestartRecord(iteration=1, restarts=1, terminated=(0, 3))
    assert format_event_text(restart_event(quiet), wall_time=WHEN).endswith(
        "managing CPU restart 1 (iteration 1): ranks 0,3 terminated, 0.000s lost\n"
    )


def test_restart_event_json_adds_fields_after_details(utc):
    out = format_event_json(restart_event(LAST), wall_time=WHEN)
    assert out.endswith(
        '  "details": "restart 2 (iteration 5) after PEER_DEAD of rank 2 (pid 1002): rank 2 terminated, '
        '0.412s lost",\n  "iteration": 5,\n  "restarts_count": 2,\n'
        '  "cause": "PEER_DEAD of rank 2 (pid 1002)",\n  "terminated_ranks": [2],\n  "seconds_lost": 0.412\n}\n'
    )
    doc = json.loads(out)
    assert list(doc) == [
        "timestamp",
        "group",
        "event",
        "peer",
        "details",
        "iteration",
        "restarts_count",
        "cause",
        "terminated_ranks",
        "seconds_lost",
    ]
    assert (doc["group"], doc["event"], doc["peer"]["pid"]) == ("LIFECYCLE", "RESTART", 4243)


def test_event_of_a_record_the_node_made_from_odd_input(utc):
    record = next_restart(None, 2, "PEER_DEAD\nof rank 1", (3, 1, 3, -4), float("nan"))
    assert record == RestartRecord(
        iteration=2, restarts=1, cause="PEER_DEAD of rank 1", terminated=(1, 3), seconds_lost=0.0
    )
    assert json.loads(format_event_json(restart_event(record), wall_time=WHEN))["terminated_ranks"] == [1, 3]
