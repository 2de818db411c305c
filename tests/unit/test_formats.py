"""torchras_formats (issue 41, item 5): the lines each side wrote before the formats had one home are the lines their
encoders write now, byte for byte, and the decoders read them back."""

from __future__ import annotations

import json

from torchras_formats import journal_lines, launch_events
from torchras_formats.launch_events import LaunchEvent


def _as_before(event: str, at: float, pid: int, **fields: object) -> bytes:
    """How inprocess.launch_events.announce wrote a line before the format moved here."""
    return (json.dumps(dict(fields, event=event, time=at, pid=pid), default=str) + "\n").encode()


def test_launch_event_lines_are_the_same_bytes() -> None:
    records = [
        (launch_events.WrapperStarting(newcomer=False), dict(newcomer=False)),
        (
            launch_events.Wrapper(joining=True, newcomer=False, initial_rank=None),
            dict(joining=True, newcomer=False, initial_rank=None),
        ),
        (launch_events.Joined(rank=3, world_size=4, iteration=2), dict(rank=3, world_size=4, iteration=2)),
        (launch_events.JoinFailed(reason="closed"), dict(reason="closed")),
        (launch_events.Completed(iteration=5), dict(iteration=5)),
        (launch_events.GaveUp(reason="RestartAbort: é"), dict(reason="RestartAbort: é")),
        (launch_events.Iteration(iteration=1, rank=0, world_size=2), dict(iteration=1, rank=0, world_size=2)),
        (launch_events.ProcessGroupStarting(), {}),
        (launch_events.ProcessGroup(rank=1, world_size=2), dict(rank=1, world_size=2)),
    ]
    assert {record.EVENT for record, _ in records} == set(LaunchEvent)
    for record, fields in records:
        line = launch_events.encode(record, 1763722800.25, 4242)
        assert line == _as_before(record.EVENT.value, 1763722800.25, 4242, **fields)
        decoded = launch_events.decode(line.rstrip(b"\n"))
        assert decoded is not None and decoded.get("event") == record.EVENT and decoded.get("pid") == 4242


def test_launch_event_lines_that_are_no_object_are_skipped() -> None:
    for line in (b"{torn", b"[1, 2]", b"\xff\xfe", b"7"):
        assert launch_events.decode(line) is None


def test_journal_lines_round_trip_and_unknown_lines_are_told_apart() -> None:
    record = {"v": journal_lines.SCHEMA, "epoch": 1.5, "record": "verdict", "details": "ünïcode"}
    line = journal_lines.encode(record)
    assert line == b'{"v":1,"epoch":1.5,"record":"verdict","details":"\\u00fcn\\u00efcode"}\n'
    assert journal_lines.decode(line) == record
    assert journal_lines.decode(b'{"v":2}') == {"v": 2}  # another version: the reader notes it and skips it
    for raw in (b"not json", b"[]", b'{"v":true}', b'{"v":1,"epoch":"x","record":"verdict"}', b'{"v":1,"epoch":1}'):
        assert journal_lines.decode(raw) is None
    assert journal_lines.file_name("node 1", 42, 3) == "journal-node_1-42-rank3.jsonl"
    assert journal_lines.JOURNAL_FILE.fullmatch(journal_lines.file_name("n", 1, -1) + ".1")
