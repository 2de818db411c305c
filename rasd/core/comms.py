"""What one process contributes to a status report: its communicators and their per-rank counters.

A communicator is one process group. Every member computes the same 64-bit hash for it. A process holds one or more
of its ranks; for each it reports the status bits NCCL reports, and per op type the operations it has *launched*
and the ones that have *completed* (our addition: it tells a rank that never issued an operation from one stuck
inside it).

Op types are NCCL's five, in NCCL's order, then ours. Only the first five take part in NCCL-compatible output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .frames import Position

OP_TYPES: tuple[str, ...] = (
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "AllToAll",
    "Gather",
    "Scatter",
    "Barrier",
    "Send",
    "Recv",
    "Other",  # a collective whose type torch's records do not tell (rasd.torch.records)
)
N_OPS = len(OP_TYPES)

# init_state / async_error codes (NCCL's ncclResult_t): 0 success, 7 in progress, anything else an error.
RESULT_SUCCESS = 0
RESULT_IN_PROGRESS = 7


@dataclass(frozen=True, slots=True)
class RankRecord:
    """One rank of a communicator, as held by the reporting process."""

    comm_rank: int
    init_state: int = RESULT_SUCCESS
    async_error: int = RESULT_SUCCESS
    finalize_called: bool = False
    destroy_flag: bool = False
    abort_flag: bool = False
    device: int = -1  # CUDA device of this rank, -1 on the CPU
    launched: tuple[int, ...] = (0,) * N_OPS
    completed: tuple[int, ...] = (0,) * N_OPS
    #: Milliseconds since this rank's counters last changed (an age, so clocks of different hosts never meet).
    idle_ms: int = 0


@dataclass(frozen=True, slots=True)
class CommRecord:
    """One communicator as seen by one process."""

    comm_hash: int  # unsigned 64-bit
    size: int
    ranks: tuple[RankRecord, ...]
    #: Communicator rank -> global rank, as runs ``(first_global, count, step)``: rank r of the communicator is the
    #: r-th element of the concatenated runs. Lets the report name the process of a missing rank. Empty: unknown.
    rank_map: tuple[tuple[int, int, int], ...] = ()

    def global_rank(self, comm_rank: int) -> int | None:
        return mapped_rank(self.rank_map, comm_rank)


def mapped_rank(rank_map: tuple[tuple[int, int, int], ...], comm_rank: int) -> int | None:
    """The global rank of ``comm_rank`` by ``rank_map`` (runs ``(first_global, count, step)``); None past its end."""
    r = comm_rank
    for first, count, step in rank_map:
        if r < count:
            return first + r * step
        r -= count
    return None


@dataclass(frozen=True, slots=True)
class RestartRecord:
    """This process's in-process restarts, as ``inprocess.Wrapper`` reports them (``rasd.record_restart``).

    The node keeps the latest one and contributes it to every gather, so the report can tell the job's current
    iteration, how many restarts it has had and what caused the last one (docs/protocol.md section 3.5).
    """

    #: The restart iteration this process runs now (the Wrapper's iteration counter).
    iteration: int
    #: How many restarts this process has been through.
    restarts: int
    #: What caused the last restart, as the Wrapper words it (e.g. ``PEER_DEAD of rank 2 (pid 4242)``).
    cause: str = ""
    #: The ranks the last restart terminated (the Wrapper's initial ranks), ascending.
    terminated: tuple[int, ...] = ()
    #: Seconds of training the last restart cost, from the fault to training again.
    seconds_lost: float = 0.0

    def outcome(self) -> str:
        """``rank 2 terminated, 0.412s lost``: who was left behind and what it cost."""
        if not self.terminated:
            who = "no rank terminated"
        else:
            noun = "rank" if len(self.terminated) == 1 else "ranks"
            who = f"{noun} {','.join(str(r) for r in self.terminated)} terminated"
        return f"{who}, {self.seconds_lost:.3f}s lost"

    def describe(self) -> str:
        """The RESTART event's details: ``restart 2 (iteration 5) after <cause>: rank 2 terminated, 0.412s lost``."""
        after = f" after {self.cause}" if self.cause else ""
        return f"restart {self.restarts} (iteration {self.iteration}){after}: {self.outcome()}"


@dataclass(frozen=True, slots=True)
class ProcessData:
    """Everything one process contributes to a gather."""

    comms: tuple[CommRecord, ...] = ()
    #: Its in-process restarts, once it has had one (None: it never restarted, or runs no restart Wrapper).
    restart: RestartRecord | None = None
    #: It is in the mesh but not yet in training: a process that joined a running job and waits to be admitted
    #: at the next rendezvous round (inprocess.elastic, docs/elastic.md §5).
    waiting: bool = False
    #: Where its main thread was when it answered (frames.py): filled in a sweep's gather only (``wire.Ask.SWEEP``),
    #: so that a COMM_STUCK verdict can name where each rank behind is.
    where: Position = ()
    #: Whether it is working, and the phase it declared (work.py): filled in a sweep's gather only, so that a rank
    #: behind that is busy (a checkpoint, an evaluation) is told from one wedged idle. None: not measured.
    work: Work | None = None


@dataclass(frozen=True, slots=True)
class Work:
    """What a process sends of its work with a sweep (work.py), as ages so that clocks never meet: milliseconds
    since it last worked (0: working now), and the phase its code declared (``rasd.phase``; "" for none) with the
    phase's limit and how long it has lasted."""

    idle_ms: int = 0
    phase: str = ""
    phase_limit_ms: int = 0
    phase_ms: int = 0


#: The wire carries a cause of at most this many UTF-8 bytes (a longer one is cut at a character boundary).
MAX_CAUSE_BYTES = 255
_MAX_COUNT = 0xFFFFFFFF


def next_restart(
    previous: RestartRecord | None, iteration: int, cause: str, terminated: tuple[int, ...], seconds_lost: float
) -> RestartRecord | None:
    """The record after one more restart, or None when the notification repeats the last one (the same
    iteration: a Wrapper that reports a restart twice does not count it twice).

    Whatever the caller passes becomes a record the wire can carry: the cause on one line and cut to
    ``MAX_CAUSE_BYTES``, ranks non-negative 32-bit, unique and ascending, counts clamped to 32 bits, and a time lost
    that is not a finite non-negative number counts as 0.
    """
    iteration = min(max(int(iteration), 0), _MAX_COUNT)
    if previous is not None and previous.iteration == iteration:
        return None
    text = " ".join(str(cause).split())
    clipped = text
    if len(text.encode("utf-8")) > MAX_CAUSE_BYTES:  # cut, and marked as cut
        clipped = text.encode("utf-8")[: MAX_CAUSE_BYTES - 3].decode("utf-8", "ignore") + "..."
    ranks = tuple(sorted({int(r) for r in terminated if 0 <= int(r) < 2**31}))
    lost = float(seconds_lost)
    if not math.isfinite(lost) or lost < 0:
        lost = 0.0
    restarts = min((previous.restarts if previous is not None else 0) + 1, _MAX_COUNT)
    return RestartRecord(iteration=iteration, restarts=restarts, cause=clipped, terminated=ranks, seconds_lost=lost)


def runs_of(global_ranks: list[int] | tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """Compress a rank list into arithmetic runs for ``CommRecord.rank_map``."""
    runs: list[tuple[int, int, int]] = []
    i, n = 0, len(global_ranks)
    while i < n:
        first = global_ranks[i]
        if i + 1 < n:
            step = global_ranks[i + 1] - first
            j = i + 1
            while j + 1 < n and global_ranks[j + 1] - global_ranks[j] == step:
                j += 1
            count = j - i + 1
            if count == 2 and step <= 0:
                count, step = 1, 1
            runs.append((first, count, step))
            i += count
        else:
            runs.append((first, 1, 1))
            i += 1
    return tuple(runs)
