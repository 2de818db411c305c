"""Where a process is in its code: Python stack frames as the mesh carries them (issue 28, docs/operations.md §10).

Belongs here: ``Frame`` (file, line, function), a ``Position`` (a thread's innermost frames, outermost first, as a
traceback lists them), their text (``train.py:31 (next_batch) -> queue.get``) and the bounds the wire holds them to.
Reading a live stack is the runtime's (``rasd.net.thread_stacks``); the core only carries and compares positions.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How many innermost frames a position keeps when it travels with a gather or a verdict.
POSITION_FRAMES = 4
#: A file or function name is cut to this many characters (from the left for a file: its end says the most).
NAME_MAX = 96


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


Position = tuple[Frame, ...]
#: A position per rank, as a verdict carries the positions of the ranks it blames (rank -1: a process's own).
Positions = tuple[tuple[int, Position], ...]


def clipped(file: str, line: int, function: str) -> Frame:
    """A frame within the wire's bounds: the file's last ``NAME_MAX`` characters (at most 255 UTF-8 bytes), the
    function's first, and a line within 0..2**32-1."""
    usual = len(file) <= NAME_MAX and len(function) <= NAME_MAX and file.isascii() and function.isascii()
    if usual and 0 <= line <= 0xFFFFFFFF:
        return Frame(file, line, function)  # within every bound already
    if len(file) > NAME_MAX:
        file = "..." + file[-(NAME_MAX - 3) :]
    if len(function) > NAME_MAX:
        function = function[: NAME_MAX - 3] + "..."
    # The wire holds a name in 255 UTF-8 bytes: wider ones are cut at a character boundary.
    file = file.encode("utf-8")[-255:].decode("utf-8", "ignore")
    function = function.encode("utf-8")[:255].decode("utf-8", "ignore")
    return Frame(file, min(max(int(line), 0), 0xFFFFFFFF), function)


def position_text(position: Position, short: bool = False) -> str:
    """``/src/train.py:31 (next_batch) -> /usr/lib/python3.11/queue.py:171 (get)``: outermost first, the innermost
    frame last; ``short``: file names without their folders (``train.py:31 (next_batch) -> queue.py:171 (get)``),
    as a verdict's one line says it."""
    if not position:
        return "(no frames)"
    if short:
        return " -> ".join(f"{f.file.rsplit('/', 1)[-1]}:{f.line} ({f.function})" for f in position)
    return " -> ".join(str(f) for f in position)
