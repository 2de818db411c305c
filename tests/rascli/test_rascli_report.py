"""Parsing the text report (docs/protocol.md §3) into the model the terminal view is drawn from."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from rascli.render import render_report
from rascli.report import (
    CommRow,
    Item,
    ReportFormatError,
    SummaryNote,
    SummaryTable,
    is_complete_json,
    is_complete_text,
    parse_report,
)
from rascli_helpers import make_console, sample

HEAD = (
    "torchras version 0.1.0 with torch 2.13.0\ngloo backend, CPU only\n\nJob summary\n===========\n\n"
    "  Nodes  Processes         GPUs  Processes     GPUs\n(total)   per node  per process    (total)  (total)\n"
    "      1          2            0          2        0\n\nCommunicators... (0.002s)\n=============\n\n"
    "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
    "    #  in group  per comm  per node  per comm  in group\n"
)


def test_summary_variants() -> None:
    gpus = parse_report(sample("gpus.txt").decode())
    assert gpus.summary == (
        SummaryTable(("Nodes", "Processes\nper node"), (("2", "4"),)),
        SummaryTable(("Processes", "GPUs\nper process"), (("7", "1"), ("1", "2"))),
        SummaryTable(("Nodes\n(total)", "Processes\n(total)", "GPUs\n(total)"), (("2", "8", "9"),)),
    )
    assert gpus.comms is None and gpus.healthy
    outliers = parse_report(sample("outliers.txt").decode())
    assert outliers.summary[-1] == SummaryNote(
        "The outlier node:", ("Node 10.1.0.4 running processes 5101,5102,5103,5104,5105,5106,5107",)
    )
    assert outliers.comms == (CommRow(0, 1, 4, "7-8", 32, 31, "RUNNING", "INCOMPLETE,MISMATCH"),)
    assert outliers.collection_time == "2.051s"


def test_items() -> None:
    dead = parse_report(sample("dead.txt").decode())
    assert [item.header for item in dead.errors] == [
        "DEAD",
        "#0-0 (27a079b828ff1a75) INCOMPLETE",
        "#2-0 (9c41d0e2b7a3f615) INCOMPLETE",
    ]
    assert dead.errors[1] == Item(
        "#0-0 (27a079b828ff1a75) INCOMPLETE",
        "INCOMPLETE",
        "0-0",
        "27a079b828ff1a75",
        ("Missing communicator data from 1 rank", "Rank 3 -- CPU managed by process 41874 on node 127.0.0.1"),
    )
    assert not dead.warnings and not dead.healthy


def test_status_part_without_a_blank_line_and_new_item_kinds() -> None:
    # NCCL prints no blank line after a status-mismatch part; torchras adds items of the same shape.
    text = HEAD + (
        "    0         1         1         2         2         2   RUNNING  MISMATCH\n\nErrors\n======\n\n"
        "#0-0 (00000000000000ab) HUNG\n  Rank 1 -- CPU managed by process 9 on node 127.0.0.1\n\n"
        "Warnings\n========\n\n"
        "#0-0 (00000000000000ab) MISMATCH\n  Communicator ranks have different status\n"
        "  Rank 1 has status INIT -- CPU managed by process 9 on node 127.0.0.1\n"
        "#0-1 (00000000000000ac) MISMATCH\n  Communicator ranks have different status\n"
        "STRAGGLER\n  Rank 0 is 3 operations behind\n\n"
    )
    report = parse_report(text)
    assert [item.word for item in report.errors] == ["HUNG"]
    assert [item.header for item in report.warnings] == [
        "#0-0 (00000000000000ab) MISMATCH",
        "#0-1 (00000000000000ac) MISMATCH",
        "STRAGGLER",
    ]
    assert report.warnings[0].details[1].startswith("Rank 1 has status INIT")


@pytest.mark.parametrize(
    "name", ["healthy.txt", "mismatch.txt", "dead.txt", "outliers.txt", "gpus.txt", "restarts.txt"]
)
def test_a_report_cut_short_is_refused(name: str) -> None:
    # (A cut exactly after an item's last detail line cannot be told from the text: an item may end without its
    # blank line. The client knows a report is complete from the job closing the connection.)
    text = sample(name).decode()
    parse_report(text)
    assert is_complete_text(text)
    cuts = sorted({text.index("Errors") - 1, text.index("Warnings") + 3, len(text) // 3, len(text) - 2})
    for cut in cuts:
        with pytest.raises(ReportFormatError):
            parse_report(text[:cut])


def test_completeness() -> None:
    json_text = sample("healthy.json").decode()
    assert is_complete_json(json_text)
    assert not is_complete_json(json_text[:-3])
    assert not is_complete_json(json_text[: json_text.index("missing_ranks") + 40])
    assert not is_complete_text(sample("healthy.txt").decode()[:100])


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "hello\n",
        "SERVER PROTOCOL 2\n",
        HEAD + "    0         1         1         2         2         2   RUNNING\n"
        "\nErrors\n======\n\nWarnings\n========\n\n",
        HEAD + "    0         1         1         2         2         2   RUNNING  OK\n\nErrors\n======\n\n  stray\n",
    ],
)
def test_malformed(text: str) -> None:
    with pytest.raises(ReportFormatError):
        parse_report(text)


WORDS = st.sampled_from(["INCOMPLETE", "DEAD", "ERROR", "MISMATCH", "TIMEOUT", "HUNG"])
ROWS = st.builds(
    CommRow,
    st.integers(0, 99),
    st.integers(1, 9999),
    st.integers(1, 999),
    st.sampled_from(["1", "7-8"]),
    st.integers(1, 99999),
    st.integers(1, 99999),
    st.sampled_from(["RUNNING", "INIT", "FINALIZE", "ABORT", "NOCOMM"]),
    st.sampled_from(["OK", "MISMATCH", "INCOMPLETE,ERROR,MISMATCH"]),
)
DETAIL = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 ,.()\-]{0,50}", fullmatch=True)
COMM = st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 2**64 - 1))
ITEMS = st.lists(st.tuples(st.one_of(st.none(), COMM), WORDS, st.lists(DETAIL, max_size=4)), max_size=4)


def _format(rows: list[CommRow], errors: list, warnings: list) -> str:
    """The layout of docs/protocol.md §3.1-3.2 (the table rows as printf would print them)."""
    text = HEAD + "".join(
        f"{r.group:5d}  {r.comms:8d}  {r.nodes:8d}  {r.ranks_per_node:>8s}  {r.ranks_per_comm:8d}  "
        f"{r.ranks_in_group:8d}  {r.status:>8s}  {r.errors:>6s}\n"
        for r in rows
    )
    text += "\nErrors\n======\n\n"
    for section, items in (("", errors), ("Warnings\n========\n\n", warnings)):
        text += section
        for comm, word, details in items:
            header = word if comm is None else f"#{comm[0]}-{comm[1]} ({comm[2]:016x}) {word}"
            text += header + "\n" + "".join(f"  {line}\n" for line in details) + "\n"
    return text


@settings(max_examples=60, deadline=None)
@given(st.lists(ROWS, min_size=1, max_size=5), ITEMS, ITEMS)
def test_parse_what_the_layout_prints(rows: list[CommRow], errors: list, warnings: list) -> None:
    report = parse_report(_format(rows, errors, warnings))
    assert report.comms == tuple(rows)
    for parsed, (comm, word, details) in zip(report.errors + report.warnings, errors + warnings, strict=True):
        assert parsed.word == word and parsed.details == tuple(details)
        assert parsed.comm == (None if comm is None else f"{comm[0]}-{comm[1]}")
    assert len(report.errors) == len(errors) and len(report.warnings) == len(warnings)
    assert report.healthy == (not errors and not warnings)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["healthy.txt", "dead.txt", "outliers.txt", "gpus.txt", "rasd_faulty_2x4.txt", "restarts.txt"]),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 40), st.text(max_size=12)), max_size=4),
)
def test_damaged_reports_parse_or_are_refused_cleanly(name: str, edits: list) -> None:
    """Whatever arrives, the parser gives a report or ReportFormatError, and a report it gives can be drawn."""
    text = sample(name).decode()
    for at, cut, insert in edits:
        at %= len(text) + 1
        text = text[:at] + insert + text[at + cut :]
    try:
        report = parse_report(text)
    except ReportFormatError:
        return
    make_console(80).print(render_report(report))
