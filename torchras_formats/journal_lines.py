"""The verdict journal's lines (docs/operations.md §11): rasd's journal (``rasd.services.journal``) writes them,
``rascli --journal`` (``rascli/journal.py``) reads them. Here: the files' names, the schema version, how a record
becomes a line (``encode``) and what a reader takes for a line (``decode``). What a record holds is rasd's journal's
(``Journal.record_of``); the reader shows whatever fields it finds.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: The line format's version. A reader skips lines of a version it does not know.
SCHEMA = 1
#: A journal file's name (``file_name``), or its rotated previous file (``.1``).
JOURNAL_FILE = re.compile(r"journal-.+\.jsonl(?P<rotated>\.1)?")


def file_name(host: str, pid: int, rank: int) -> str:
    """``journal-<host>-<pid>-rank<rank>.jsonl`` (no rank part while the rank is unknown): who wrote it, at a glance."""
    safe = re.sub(r"[^A-Za-z0-9._]", "_", host) or "host"
    return f"journal-{safe}-{pid}" + (f"-rank{rank}" if rank >= 0 else "") + ".jsonl"


def encode(record: dict[str, Any]) -> bytes:
    """One line: compact JSON, ASCII only (so no byte of it is a line break but the last), ending in a newline."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=True, default=str).encode("ascii") + b"\n"


def decode(raw: bytes) -> dict[str, Any] | None:
    """A journal line's object, or None: JSON, an object, an integer ``v``; at version ``SCHEMA`` also a number
    ``epoch`` and a text ``record``. A line of another version is returned as it is: the reader says it skipped it."""
    try:
        line = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(line, dict):
        return None
    version, epoch = line.get("v"), line.get("epoch")
    if not isinstance(version, int) or isinstance(version, bool):
        return None
    if version == SCHEMA and (
        not isinstance(epoch, (int, float)) or isinstance(epoch, bool) or not isinstance(line.get("record"), str)
    ):
        return None
    return line
