"""Where rascli writes: raw bytes to stdout (the job's text and JSON, unchanged), rich renderables to the
terminal's console when there is one, and messages to stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO, TextIO

from rich.console import Console
from rich.text import Text


@dataclass
class Streams:
    out: BinaryIO
    err: TextIO
    #: The terminal, for rich output; ``None`` in a pipe or with --no-color (then everything is raw bytes).
    console: Console | None = None
    #: The text layer over ``out`` (if any): flushed before raw bytes so the two never interleave wrongly.
    text: TextIO | None = None
    #: A terminal on stderr for a transient "waiting" spinner, when both ends are terminals.
    progress: Console | None = None

    def waiting(self, message: str) -> AbstractContextManager[object]:
        """A spinner with ``message`` on the terminal while a slow answer is awaited; nothing elsewhere."""
        return self.progress.status(message) if self.progress is not None else contextlib.nullcontext()

    def write(self, data: bytes) -> None:
        if self.text is not None:
            self.text.flush()
        self.out.write(data)
        self.out.flush()

    def message(self, line: str) -> None:
        if self.progress is not None:  # through the console, so that a spinner on it stays intact
            self.progress.print(Text(line), soft_wrap=True)
            return
        self.err.write(line + "\n")
        self.err.flush()

    def error(self, line: str) -> None:
        self.message(f"rascli: {line}")


def from_sys(no_color: bool) -> Streams:
    rich_output = sys.stdout.isatty() and not no_color and not os.environ.get("NO_COLOR")
    console = Console(highlight=False) if rich_output else None
    progress = Console(stderr=True, highlight=False) if rich_output and sys.stderr.isatty() else None
    return Streams(sys.stdout.buffer, sys.stderr, console, sys.stdout, progress)
