"""Rich renderables for a parsed report: what is wrong first, then the communicators, then the job summary.

Pure functions from the model (``report.py``) to renderables; the caller prints them to a console. Tests render
them to a recorded fixed-width console and read the text.
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .changes import NO_CHANGES, Changes
from .report import CommRow, Item, Report, SummaryTable

STATUS_STYLES = {"RUNNING": "green", "INIT": "yellow", "FINALIZE": "cyan", "ABORT": "bold red", "NOCOMM": "magenta"}
ERROR_WORDS = {"INCOMPLETE", "ERROR", "DEAD", "ABORT"}
#: Parts of detail lines worth finding at a glance: who (rank, process, node) and which device.
DETAIL_HIGHLIGHTS = (
    (r"\bRanks? [0-9][0-9,\-]*", "bold"),
    (r"\bprocess(?:es)? [0-9][0-9,]*", "bold cyan"),
    (r"\bProcess [0-9]+", "bold cyan"),
    (r"\bnode \S+", "cyan"),
    (r"\bNode \S+", "cyan"),
    (r"\b(?:GPUs?|CPU)\b(?: [0-9][0-9,]*)?(?: \(NVML [0-9,]+\))?", "magenta"),
    (r"\bstatus [A-Z]+", "bold"),
)
#: The Restarts section: the iteration and counts at a glance, and the verdict that caused the last restart.
RESTART_HIGHLIGHTS = (
    (r"^Iteration [0-9]+", "bold"),
    (r"\b[0-9]+ restarts?\b", "bold"),
    (r"\b(?:PEER|COMM)_[A-Z_]+\b", "bold"),
    (r"\branks? [0-9][0-9,]* terminated", "yellow"),
    (r"\bno rank terminated", "green"),
    (r"\b[0-9.]+s lost", "bold"),
)
RESTARTS_STYLE = "cyan"


def headline(report: Report) -> Text:
    text = Text()
    if report.healthy:
        text.append("✔ healthy", style="bold green")
        text.append(": no errors, no warnings", style="green")
    else:
        text.append("✘ ", style="bold red")
        parts = []
        if report.errors:
            parts.append((_count(len(report.errors), "error"), "bold red"))
        if report.warnings:
            parts.append((_count(len(report.warnings), "warning"), "bold yellow"))
        for i, (part, style) in enumerate(parts):
            text.append((", " if i else "") + part, style=style)
    if report.restart_summary:
        text.append(f"  ({report.restart_summary})", style=RESTARTS_STYLE)
    return text


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def detail_text(line: str) -> Text:
    text = Text(line)
    for pattern, style in DETAIL_HIGHLIGHTS:
        text.highlight_regex(pattern, style)
    return text


def item_renderable(item: Item, style: str, new: bool) -> RenderableType:
    header = Text()
    if item.comm is not None:
        header.append(f"#{item.comm} ", style="bold")
        header.append(f"({item.comm_hash}) ", style="dim")
        header.append(item.word, style=f"bold {style}")
    else:
        header.append(item.header, style=f"bold {style}")
    if new:
        header.append("  NEW", style="bold reverse")
    lines = [header] + [Text("  ").append_text(detail_text(line)) for line in item.details]
    return Group(*lines)


def items_panel(title: str, items: tuple[Item, ...], style: str, changes: Changes) -> RenderableType:
    body: list[RenderableType] = []
    for i, item in enumerate(items):
        if i:
            body.append(Text(""))
        body.append(item_renderable(item, style, item.header in changes.new_items))
    return Panel(
        Group(*body),
        title=f"[bold {style}]{title}[/] ({len(items)})",
        title_align="left",
        border_style=style,
        box=box.ROUNDED,
    )


def restarts_panel(report: Report, changes: Changes) -> RenderableType:
    """The job restarted in place: its iteration, its restarts and the last one (not a fault: cyan, not red)."""
    lines = []
    for line in report.restarts:
        text = detail_text(line)
        for pattern, style in RESTART_HIGHLIGHTS:
            text.highlight_regex(pattern, style)
        lines.append(text)
    title = f"[bold {RESTARTS_STYLE}]Restarts[/]" + ("  [bold reverse]CHANGED[/]" if changes.restarts_changed else "")
    return Panel(Group(*lines), title=title, title_align="left", border_style=RESTARTS_STYLE, box=box.ROUNDED)


def errors_style(errors: str) -> str:
    if errors == "OK":
        return "green"
    words = set(errors.split(","))
    return "bold red" if words & ERROR_WORDS else "bold yellow"


def comm_table(report: Report, changes: Changes) -> RenderableType:
    title = "Communicators" + (f" (gathered in {report.collection_time})" if report.collection_time else "")
    if report.comms is None:
        return Panel(
            Text("No communicator data collected!", style="yellow"),
            title=Text(title),
            title_align="left",
            box=box.ROUNDED,
        )
    table = Table(title=Text(title), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD)
    for name in (
        "Group\n#",
        "Comms\nin group",
        "Nodes\nper comm",
        "Ranks\nper node",
        "Ranks\nper comm",
        "Ranks\nin group",
    ):
        table.add_column(name, justify="right")
    table.add_column("\nStatus", justify="left")
    table.add_column("\nErrors", justify="left")
    for i, row in enumerate(report.comms):
        table.add_row(*_comm_cells(row), style="reverse" if i in changes.changed_rows else None)
    return table


def _comm_cells(row: CommRow) -> list[RenderableType]:
    return [
        Text(str(row.group), style="bold"),
        str(row.comms),
        str(row.nodes),
        Text(row.ranks_per_node),
        str(row.ranks_per_comm),
        str(row.ranks_in_group),
        Text(row.status, style=STATUS_STYLES.get(row.status, "bold")),
        Text(row.errors, style=errors_style(row.errors)),
    ]


def summary_renderables(report: Report, changes: Changes) -> list[RenderableType]:
    out: list[RenderableType] = []
    title = "Job summary" + ("  CHANGED" if changes.summary_changed else "")
    for i, block in enumerate(report.summary):
        if isinstance(block, SummaryTable):
            table = Table(
                title=title if i == 0 else None, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD
            )
            for column in block.columns:
                table.add_column(Text(column), justify="right")
            for row in block.rows:
                table.add_row(*(Text(cell) for cell in row))
            out.append(table)
        else:
            note = Group(
                Text(block.title, style="bold yellow"),
                *(Text("  ").append_text(detail_text(line)) for line in block.lines),
            )
            out.append(note if i else Group(Text(title, style="bold"), note))
    return out


def render_report(report: Report, changes: Changes = NO_CHANGES) -> RenderableType:
    parts: list[RenderableType] = [headline(report), Text("")]
    if report.errors:
        parts.append(items_panel("Errors", report.errors, "red", changes))
    if report.warnings:
        parts.append(items_panel("Warnings", report.warnings, "yellow", changes))
    if report.restarts:
        parts.append(restarts_panel(report, changes))
    if changes.resolved_items:
        resolved = Text("Resolved since the last report: ", style="bold green")
        resolved.append(", ".join(changes.resolved_items), style="green")
        parts.append(resolved)
    parts.append(comm_table(report, changes))
    parts.extend(summary_renderables(report, changes))
    parts.append(Text("\n".join(report.version_lines), style="dim"))
    return Group(*parts)
