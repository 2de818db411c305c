"""The status report as data: parse the server's text report (docs/protocol.md §3) into a small model.

The text is the source of truth: the rich view is drawn from this model, and whenever the text does not parse
(an unknown layout, a future version), the caller prints the text verbatim instead. So the parser is strict about
structure and lenient about content:

    <version line>                        free-form lines up to the first blank line
    <version line>
                                          (blank)
    Job summary / ===========             blocks separated by blank lines: tables of numbers,
    <blocks>                              or notes such as "The outlier nodes:" with their lines
    Communicators... (0.123s) / ======    the communicator table, or "No communicator data collected!"
    Restarts / ========                   (torchras, only once the job restarted in place) lines indented by
                                          two spaces: the job's iteration, its restarts, the last one
    Errors / ======                       items: a header line ("DEAD", "#0-1 (hash) MISMATCH"),
    Warnings / ========                   then detail lines indented by two spaces, then a blank line
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class ReportFormatError(ValueError):
    """The text is not a report this parser understands."""


@dataclass(frozen=True)
class SummaryTable:
    """A table of the job summary: column titles (their header lines joined by newlines) and rows of numbers."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class SummaryNote:
    """A block of the job summary that is not a table, e.g. ``The outlier nodes:`` and a line per node."""

    title: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class CommRow:
    group: int
    comms: int
    nodes: int
    ranks_per_node: str
    ranks_per_comm: int
    ranks_in_group: int
    status: str
    errors: str


@dataclass(frozen=True)
class Item:
    """One item of Errors or Warnings."""

    header: str
    word: str
    #: ``#x-y`` and the communicator hash for a per-communicator item, else ``None``.
    comm: str | None = None
    comm_hash: str | None = None
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    version_lines: tuple[str, ...]
    summary: tuple[SummaryTable | SummaryNote, ...]
    collection_time: str | None
    #: ``None`` when the job reported "No communicator data collected!".
    comms: tuple[CommRow, ...] | None
    errors: tuple[Item, ...] = field(default=())
    warnings: tuple[Item, ...] = field(default=())
    #: The lines of the Restarts section (torchras: the job restarted in place), without their indent; empty when
    #: the report has none. A restart is what the job did about a fault: it does not make the job unhealthy.
    restarts: tuple[str, ...] = field(default=())

    @property
    def healthy(self) -> bool:
        return not self.errors and not self.warnings

    @property
    def restart_summary(self) -> str:
        """The first Restarts line as a phrase (``iteration 2 after 2 restarts``), or "" without restarts."""
        first = self.restarts[0] if self.restarts else ""
        return first[:1].lower() + first[1:]


COMMS_LINE = re.compile(r"Communicators\.\.\.(?: \((?P<time>[0-9.]+s)\))?")
COMM_HEADER = (
    "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors",
    "    #  in group  per comm  per node  per comm  in group",
)
NO_COMMS = "No communicator data collected!"
RESTARTS_HEADER = ("", "Restarts", "========")
ITEM_HEADER = re.compile(r"#(?P<comm>\d+-\d+) \((?P<hash>[0-9a-fA-F]+)\) (?P<word>\S+)")


class _Lines:
    """A cursor over the report's lines."""

    def __init__(self, text: str) -> None:
        if not text.endswith("\n"):
            raise ReportFormatError("the report does not end with a newline")
        self.lines = text[:-1].split("\n")
        self.at = 0

    def done(self) -> bool:
        return self.at >= len(self.lines)

    def peek(self) -> str:
        if self.done():
            raise ReportFormatError("the report ends early")
        return self.lines[self.at]

    def take(self) -> str:
        line = self.peek()
        self.at += 1
        return line

    def expect(self, *lines: str) -> None:
        for line in lines:
            got = self.take()
            if got != line:
                raise ReportFormatError(f"line {self.at}: expected {line!r}, got {got!r}")


def parse_report(text: str) -> Report:
    lines = _Lines(text)
    version_lines = []
    while lines.peek() != "":
        version_lines.append(lines.take())
    if not version_lines:
        raise ReportFormatError("no version lines")
    lines.expect("", "Job summary", "===========", "")

    summary_lines = []
    while not COMMS_LINE.fullmatch(lines.peek()):
        summary_lines.append(lines.take())
    match = COMMS_LINE.fullmatch(lines.take())
    assert match is not None
    lines.expect("=============", "")

    if lines.peek() == NO_COMMS:
        lines.take()
        comms = None
    else:
        lines.expect(*COMM_HEADER)
        rows = []
        while lines.peek() != "":
            rows.append(_comm_row(lines.take()))
        comms = tuple(rows)
    restarts = _restarts(lines)
    lines.expect("", "Errors", "======", "")
    errors = _items(lines, until=("Warnings", "========"))
    lines.expect("Warnings", "========", "")
    warnings = _items(lines, until=None)
    return Report(tuple(version_lines), _summary(summary_lines), match.group("time"), comms, errors, warnings, restarts)


def _restarts(lines: _Lines) -> tuple[str, ...]:
    """The Restarts section, if the report has one: lines indented by two spaces up to a blank line."""
    if tuple(lines.lines[lines.at : lines.at + 3]) != RESTARTS_HEADER:
        return ()
    lines.expect(*RESTARTS_HEADER, "")
    out = []
    while lines.peek() != "":
        line = lines.take()
        if not line.startswith("  ") or not line.strip():
            raise ReportFormatError(f"line {lines.at}: a Restarts line that is not indented: {line!r}")
        out.append(line[2:])
    if not out:
        raise ReportFormatError("an empty Restarts section")
    return tuple(out)


def _summary(lines: list[str]) -> tuple[SummaryTable | SummaryNote, ...]:
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return tuple(_summary_block(block) for block in blocks if block)


def _is_row(line: str) -> bool:
    return all(word.isdigit() for word in line.split())


def _summary_block(block: list[str]) -> SummaryTable | SummaryNote:
    headers = [line for line in block if not _is_row(line)]
    rows = [line for line in block if _is_row(line)]
    if not rows or not headers or block[: len(headers)] != headers:
        return SummaryNote(block[0].strip(), tuple(line.strip() for line in block[1:]))
    columns = _columns(headers)
    table_rows = tuple(tuple(row.split()) for row in rows)
    if any(len(row) != len(columns) for row in table_rows):
        raise ReportFormatError(f"a summary table has {len(columns)} columns but a row does not: {rows}")
    return SummaryTable(columns, table_rows)


def _columns(headers: list[str]) -> tuple[str, ...]:
    """Column titles of a fixed-width header: columns are separated by runs of 2+ blanks on every line."""
    width = max(len(line) for line in headers)
    padded = [line.ljust(width) for line in headers]
    used = [any(line[i] != " " for line in padded) for i in range(width)] + [False, False]
    spans, start, i = [], None, 0
    while i < width:
        if used[i]:
            start = i if start is None else start
            i += 1
        elif start is not None and not used[i + 1]:
            spans.append((start, i))
            start = None
            i += 2
        else:
            i += 1
    if start is not None:
        spans.append((start, width))
    return tuple("\n".join(part for line in padded if (part := line[a:b].strip())) for a, b in spans)


def _comm_row(line: str) -> CommRow:
    words = line.split()
    if len(words) != 8:
        raise ReportFormatError(f"a communicator row has {len(words)} fields, not 8: {line!r}")
    try:
        return CommRow(
            int(words[0]), int(words[1]), int(words[2]), words[3], int(words[4]), int(words[5]), words[6], words[7]
        )
    except ValueError:
        raise ReportFormatError(f"a communicator row is not numeric where it should be: {line!r}") from None


def _items(lines: _Lines, until: tuple[str, str] | None) -> tuple[Item, ...]:
    items: list[Item] = []
    header: str | None = None
    details: list[str] = []

    def finish() -> None:
        if header is not None:
            items.append(_item(header, details))

    while not lines.done():
        if until and lines.lines[lines.at : lines.at + 2] == list(until):
            break
        line = lines.take()
        if not line.strip():
            continue
        if line.startswith(" "):
            if header is None:
                raise ReportFormatError(f"a detail line without an item: {line!r}")
            details.append(line[2:] if line.startswith("  ") else line.lstrip())
        else:
            finish()
            header, details = line, []
    else:
        if until:
            raise ReportFormatError("the report has no Warnings section")
    finish()
    return tuple(items)


def _item(header: str, details: list[str]) -> Item:
    match = ITEM_HEADER.fullmatch(header)
    if match:
        return Item(header, match.group("word"), match.group("comm"), match.group("hash"), tuple(details))
    return Item(header, header.split()[-1], details=tuple(details))


def is_complete_text(text: str) -> bool:
    """Whether a text report arrived whole: the Warnings section is always printed, and it comes last."""
    return "\nWarnings\n========\n" in text and text.endswith("\n")


def is_complete_json(text: str) -> bool:
    """Whether a JSON report arrived whole: its top-level object closes at the start of the last line."""
    stripped = text.rstrip("\n")
    return stripped == "{}" or stripped.endswith("\n}")
