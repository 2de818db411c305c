"""Where this process is in its code, read by the RAS thread: its position for the sweeps and its stacks for a
STACKS gather (docs/protocol.md §2.6, docs/operations.md "A job is stuck: what to run").

The RAS thread reads ``sys._current_frames()``, the interpreter's own table of every thread's current frame: the
training thread is not interrupted, signalled or asked anything, so this costs it nothing but the GIL for the read
(tens of microseconds for a deep stack). A thread blocked in C (``time.sleep``, ``queue.get``, a socket read, an
all-reduce) shows the Python frame that made the call, which is where it waits. A process whose RAS thread cannot
run (a GIL hog, SIGSTOP) cannot answer at all; the process that serves the request lists it from what the mesh last
saw of it (``last_seen``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from rasd.core.comms import CommRecord
from rasd.core.frames import POSITION_FRAMES, Frame, Position, clipped
from rasd.core.peers import PeerInfo
from rasd.core.wire import MAX_ANSWER_BYTES, Answer
from rasd.report import stacks as report

from . import work

log = logging.getLogger("rasd")

#: A thread's stack keeps at most this many innermost frames.
STACK_FRAMES = 64


def _frames(frame: Any, limit: int) -> list[Frame]:
    """The innermost ``limit`` frames up from ``frame``, outermost first. Read from the frame objects themselves:
    ``traceback.extract_stack`` also looks each file up to cache its source lines, six times the cost."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append(clipped(code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    out.reverse()
    return out


def main_position() -> Position:
    """The main thread's innermost frames, as a sweep carries them (empty when there is none to read)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    return tuple(_frames(frame, POSITION_FRAMES)) if frame is not None else ()


def thread_stacks(all_threads: bool) -> list[dict[str, Any]]:
    """The main thread's stack, or every thread's (main first, then by name): name, whether it is the main thread,
    frames."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if ident != main and not all_threads:
            continue
        frames = _frames(frame, STACK_FRAMES)
        out.append(
            {
                "thread": names.get(ident, f"thread {ident}"),
                "main": ident == main,
                "frames": [[f.file, f.line, f.function] for f in frames],
            }
        )
    out.sort(key=lambda t: (not t["main"], t["thread"]))  # the same order in every process: shared parts alike
    return out


def answer(
    me: PeerInfo,
    all_threads: bool,
    last_seen: Iterable[dict[str, Any]] = (),
    comms: Iterable[CommRecord] = (),
) -> Answer:
    """This process's STACKS answer: its threads' stacks and where its collectives stand (``comms``: the records a
    status gather takes, so that the report says which collective each main thread is in), shared byte for byte with
    every process in the same place; and its own part: who it is, how long its collectives have stood, and the last
    positions it holds of processes it hears nothing from. Within ``MAX_ANSWER_BYTES``: the outermost frames go
    first, then the positions of others."""
    threads = thread_stacks(all_threads)
    declared = work.declared_phase()
    carried, stood_s = report.comms_of(comms)
    # The own part of every process travels whole to the root: what is empty is left out.
    own: dict[str, Any] = {"host": me.hostname, "pid": me.pid, "rank": me.rank, "wall": round(time.time(), 3)}
    if stood_s:
        own["stood_s"] = round(stood_s, 3)
    if declared is not None:
        own["phase"] = {"name": declared.name, "seconds": time.monotonic() - declared.started, "limit": declared.limit}
    own_part = report.encode_own(own)
    positions = list(last_seen)
    if positions:
        with_positions = report.encode_own({**own, "last_seen": positions})
        if len(with_positions) <= MAX_ANSWER_BYTES // 2:  # the stacks come first
            own_part = with_positions
    shared, size = report.encode_shared(threads, carried)
    while len(shared) + len(own_part) > MAX_ANSWER_BYTES or size > report.MAX_DECODED:
        longest = max(threads, key=lambda t: len(t["frames"]), default=None)
        if longest is None or len(longest["frames"]) <= 1:
            threads[:] = threads[:1]
            shared, size = report.encode_shared(threads, carried)
            fits = len(shared) + len(own_part) <= MAX_ANSWER_BYTES and size <= report.MAX_DECODED
            return Answer(shared, own_part) if fits else Answer()
        del longest["frames"][: max(1, len(longest["frames"]) // 4)]
        longest["cut"] = True
        shared, size = report.encode_shared(threads, carried)
    return Answer(shared, own_part)


def provider(
    me: PeerInfo,
    all_threads: bool,
    last_seen: Callable[[], list[dict[str, Any]]],
    comms: Callable[[], Iterable[CommRecord]] = tuple,
) -> Callable[[], Answer]:
    """What the node calls for a STACKS gather (``Node.answers``); never raises."""

    def make() -> Answer:
        try:
            return answer(me, all_threads, last_seen(), comms())
        except Exception:  # an empty answer: the root lists this process as not answering
            log.warning("rasd: could not read this process's stacks", exc_info=True)
            return Answer()

    return make
