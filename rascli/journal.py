"""``--journal DIR``: the verdict journals of a job's processes (``TORCHRAS_JOURNAL_DIR``) as one timeline.

rasd writes one file per process, ``journal-<host>-<pid>[-rank<r>].jsonl`` (rotated once to ``.jsonl.1``), one JSON
object per line. docs/operations.md §11 is the format; ``torchras_formats.journal_lines`` encodes (rasd) and decodes
(here) its lines, so writer and reader share one implementation while rascli imports nothing of rasd. Every journal
file of the directory is read, rotated ones too, and the lines of all processes are merged by time (``epoch``).

What cannot be read is skipped, with a note on stderr, and the rest is shown: a last line cut short (its process
was writing it, or was killed mid-line), a line that is not a journal line, a line of a schema version this reader
does not know, a file that is not a journal.

On a terminal the timeline is a rich table; in a pipe, plain lines (one per record, its evidence indented below
it); with ``-f json``, a JSON array of the records as they were written. ``-v`` adds the Flight Recorder entries.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from torchras_formats.journal_lines import JOURNAL_FILE, SCHEMA, decode

from .errors import Exit, RasCliError
from .monitor import EVENT_STYLES
from .options import Options
from .output import Streams

#: How many entries of each kind of problem a note names before it just counts them.
NOTED_LINES = 3
INDENT = "      "


@dataclass(frozen=True)
class Entry:
    """One journal line as read: the object itself, and where it came from (for a stable order)."""

    line: dict[str, Any]
    source: str
    #: 0 for a rotated file (older), 1 for a current one; then the line's number in its file.
    generation: int
    number: int

    @property
    def epoch(self) -> float:
        return float(self.line["epoch"])

    @property
    def record(self) -> str:
        return str(self.line["record"])

    @property
    def kind(self) -> str:
        return str(self.line.get("kind") or self.record.upper())

    def sort_key(self) -> tuple[float, str, int, int, int]:
        return (self.epoch, str(self.line.get("host", "")), _int(self.line.get("pid")), self.generation, self.number)


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_journals(directory: Path) -> tuple[list[Entry], list[str]]:
    """Every journal line in ``directory``, in time order, and the notes on what was skipped."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        why = error.strerror or str(error)
        raise RasCliError(f"cannot read the journal directory {directory} ({why})", Exit.USAGE) from None
    entries: list[Entry] = []
    notes: list[str] = []
    for name in names:
        path = directory / name
        match = JOURNAL_FILE.fullmatch(name)
        if match is None or not path.is_file():
            notes.append(f"skipped {path}: not a journal file")
            continue
        try:
            data = path.read_bytes()
        except OSError as error:
            notes.append(f"skipped {path}: {error.strerror or error}")
            continue
        entries += _parse(data, name, 0 if match.group("rotated") else 1, path, notes)
    entries.sort(key=Entry.sort_key)
    return entries, notes


def _parse(data: bytes, name: str, generation: int, path: Path, notes: list[str]) -> list[Entry]:
    lines = data.split(b"\n")
    torn = lines.pop()  # empty when the file ends with a newline, as every complete line does
    entries = []
    bad: list[int] = []
    versions: dict[int, list[int]] = {}
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        line = decode(raw)
        if line is None:
            bad.append(number)
        elif line["v"] != SCHEMA:
            versions.setdefault(line["v"], []).append(number)
        else:
            entries.append(Entry(line, name, generation, number))
    if torn.strip():
        notes.append(f"skipped the last line of {path}: it is incomplete (being written, or cut short by a crash)")
    if bad:
        notes.append(f"skipped {_lines(bad)} of {path}: not {'journal lines' if len(bad) > 1 else 'a journal line'}")
    for version, numbers in sorted(versions.items()):
        notes.append(f"skipped {_lines(numbers)} of {path}: schema version {version} (this rascli reads {SCHEMA})")
    return entries


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:NOTED_LINES])
    more = f" and {len(numbers) - NOTED_LINES} more" if len(numbers) > NOTED_LINES else ""
    return f"line{'s' if len(numbers) > 1 else ''} {shown}{more}"


# ----------------------------------------------------------------------------------------------------------------
# What a line says


def when(epoch: float) -> str:
    """Local time with milliseconds, as the job's logs usually show it: ``2026-11-21 11:45:03.123``."""
    seconds = int(epoch)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{int((epoch - seconds) * 1000):03d}"


def process_text(line: dict[str, Any]) -> str:
    """``node1 pid 4242 rank 1``: the process that wrote the line."""
    rank = _int(line.get("rank"), -1)
    return f"{line.get('host', '?')} pid {line.get('pid', '?')}" + (f" rank {rank}" if rank >= 0 else "")


def headline(line: dict[str, Any]) -> str:
    """What happened, in one line."""
    record = line.get("record")
    if record == "verdict":
        text = _about(line)
        details = str(line.get("details") or "").strip()
        text = f"{text}: {details}" if text and details else text or details
    elif record == "restart":
        text = _restart_text(line.get("restart") or {})
    elif record == "start":
        text = f"journal started (mesh {line.get('mesh', '?')})"
    elif record == "dropped":
        text = f"{line.get('count', '?')} records lost: the journal's writer fell behind"
    else:
        text = f"a {record} record"
    return text + (" [evidence cut to fit one line]" if line.get("truncated") else "")


def _about(line: dict[str, Any]) -> str:
    subject = line.get("subject")
    if isinstance(subject, dict):
        rank = _int(subject.get("rank"), -1)
        where = ", ".join(str(subject[k]) for k in ("host", "addr") if subject.get(k))
        pid = subject.get("pid")
        process = f"pid {pid} on {where}" if pid is not None else where
        return f"rank {rank} ({process})" if rank >= 0 else process
    if line.get("comm_hash"):
        ranks = line.get("ranks") or []
        return f"communicator {line['comm_hash']}" + (f", ranks {_ranks(ranks)}" if ranks else "")
    return ""


def _restart_text(restart: dict[str, Any]) -> str:
    """``restart 2 (iteration 5) after <cause>: rank 2 terminated, 0.412s lost`` (the words of the RESTART event)."""
    terminated = restart.get("terminated") or []
    if terminated:
        who = f"{'rank' if len(terminated) == 1 else 'ranks'} {_ranks(terminated)} terminated"
    else:
        who = "no rank terminated"
    cause = f" after {restart['cause']}" if restart.get("cause") else ""
    lost = restart.get("seconds_lost")
    spent = f", {lost:.3f}s lost" if isinstance(lost, (int, float)) else ""
    return f"restart {restart.get('restarts', '?')} (iteration {restart.get('iteration', '?')}){cause}: {who}{spent}"


def evidence_lines(line: dict[str, Any], verbose: bool) -> list[str]:
    """Where the processes were, this process's counts, and (``verbose``) the Flight Recorder's entries."""
    out = []
    for position in _dicts(line.get("positions")):
        rank = _int(position.get("rank"), -1)
        frames = " -> ".join(_frame_text(f) for f in _dicts(position.get("frames")))
        out.append(f"{'rank ' + str(rank) if rank >= 0 else 'the process'} at {frames or '(no frames)'}")
    found = line.get("evidence")
    evidence: dict[str, Any] = found if isinstance(found, dict) else {}
    for comm in _dicts(evidence.get("comms")):
        for held in _dicts(comm.get("ranks")):
            global_rank = held.get("global_rank")
            who = f"rank {held.get('comm_rank', '?')} of {comm.get('size', '?')}"
            who += f" (global {global_rank})" if global_rank is not None else ""
            idle = _int(held.get("idle_ms")) / 1000
            out.append(
                f"communicator {comm.get('comm_hash', '?')} {who} {held.get('status', '?')}: "
                f"launched {_counts(held.get('launched'))}, completed {_counts(held.get('completed'))}, "
                f"idle {idle:.1f}s"
            )
    recorders = list(_dicts(evidence.get("flight_recorder")))
    entries = sum(len(list(_dicts(r.get("entries")))) for r in recorders)
    if recorders and not verbose:
        out.append(f"Flight Recorder: {entries} entries of {len(recorders)} group{'s' if len(recorders) > 1 else ''}")
    if verbose:
        for recorder in recorders:
            for entry in _dicts(recorder.get("entries")):
                out.append(f"Flight Recorder {recorder.get('comm_hash', '?')} {_entry_text(entry)}")
    return out


def _frame_text(frame: dict[str, Any]) -> str:
    """``train.py:31 (next_batch)``, as rasd writes a frame in its logs and reports."""
    return f"{frame.get('file', '?')}:{frame.get('line', '?')} ({frame.get('function', '?')})"


def _entry_text(entry: dict[str, Any]) -> str:
    seq = entry.get("collective_seq_id") or entry.get("p2p_seq_id")
    # NCCL's entries tell their state (scheduled, started, completed); gloo's say "scheduled" and whether retired.
    retired = entry.get("retired")
    retirement = ("retired" if retired else "not retired") if isinstance(retired, bool) else ""
    parts = [str(entry.get("state") or ""), retirement]
    state = ", ".join(part for part in parts if part)
    created = entry.get("time_created_ns")
    at = f", created {when(created / 1e9)[11:]}" if isinstance(created, int) else ""
    return f"#{seq} {entry.get('profiling_name', '?')} {state or 'state unknown'}{at}"


def _counts(counts: object) -> str:
    if not isinstance(counts, dict) or not counts:
        return "nothing"
    return ", ".join(f"{op} {n}" for op, n in counts.items())


def _ranks(ranks: Iterable[object]) -> str:
    return ",".join(str(r) for r in ranks)


def _dicts(items: object) -> Iterable[dict[str, Any]]:
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _int(value: object, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# ----------------------------------------------------------------------------------------------------------------
# Rendering


def plain_timeline(entries: list[Entry], verbose: bool) -> str:
    """One line per record (time, process, iteration, kind, what happened), its evidence indented below it."""
    rows = [(when(e.epoch), process_text(e.line), f"iter {_int(e.line.get('iteration'))}", e.kind) for e in entries]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    out = []
    for entry, row in zip(entries, rows, strict=True):
        cells = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.append(f"{cells}  {headline(entry.line)}\n")
        out += [f"{INDENT}{text}\n" for text in evidence_lines(entry.line, verbose)]
    return "".join(out)


def rich_timeline(entries: list[Entry], verbose: bool, directory: Path) -> Table:
    processes = len({(e.line.get("host"), e.line.get("pid")) for e in entries})
    table = Table(
        box=box.SIMPLE_HEAD,
        title=f"Verdict journal of {processes} process{'es' if processes != 1 else ''} in {directory}",
        title_justify="left",
        title_style="bold",
    )
    for name in ("TIME", "PROCESS", "ITER", "EVENT", "WHAT"):
        table.add_column(name, justify="right" if name == "ITER" else "left", overflow="fold")
    for entry in entries:
        what = Text(headline(entry.line))
        for text in evidence_lines(entry.line, verbose):
            what.append("\n" + text, style="dim")
        table.add_row(
            Text(when(entry.epoch), style="dim"),
            Text(process_text(entry.line)),
            Text(str(_int(entry.line.get("iteration")))),
            Text(entry.kind, style=EVENT_STYLES.get(entry.kind, "dim" if entry.record != "verdict" else "bold")),
            what,
        )
    return table


def run(options: Options, streams: Streams) -> int:
    """``rascli --journal DIR``: the timeline, or with ``-f json`` the records as a JSON array."""
    directory = Path(options.journal or ".")
    entries, notes = read_journals(directory)
    for note in notes:
        streams.error(note)
    if options.json:
        streams.write((json.dumps([e.line for e in entries], indent=2) + "\n").encode())
    elif not entries:
        streams.message(
            f"No journal lines in {directory}: rasd writes journal-*.jsonl where TORCHRAS_JOURNAL_DIR says."
        )
    elif streams.console is not None:
        streams.console.print(rich_timeline(entries, options.verbose, directory))
    else:
        streams.write(plain_timeline(entries, options.verbose).encode())
    return Exit.OK
