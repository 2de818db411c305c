"""What one process contributes to a status report: its communicators and their per-rank counters.

A communicator is one process group. Every member computes the same 64-bit hash for it. A process holds one or more
of its ranks; for each it reports the status bits NCCL reports, and per op type the operations it has *launched*
and the ones that have *completed* (our addition: it tells a rank that never issued an operation from one stuck
inside it).

Op types are NCCL's five, in NCCL's order, then ours. Only the first five take part in NCCL-compatible output.
"""

from __future__ import annotations

from dataclasses import dataclass

OP_TYPES: tuple[str, ...] = (
    "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
    "AllToAll", "Gather", "Scatter", "Barrier", "Send", "Recv",
)
NCCL_OP_TYPES = OP_TYPES[:5]
N_OPS = len(OP_TYPES)

# init_state / async_error codes (NCCL's ncclResult_t): 0 success, 7 in progress, anything else an error.
RESULT_SUCCESS = 0
RESULT_IN_PROGRESS = 7


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class CommRecord:
    """One communicator as seen by one process."""

    comm_hash: int  # unsigned 64-bit
    size: int
    ranks: tuple[RankRecord, ...]
    #: Communicator rank -> global rank, as runs ``(first_global, count, step)``: rank r of the communicator is the
    #: r-th element of the concatenated runs. Lets the report name the process of a missing rank. Empty: unknown.
    rank_map: tuple[tuple[int, int, int], ...] = ()

    def global_rank(self, comm_rank: int) -> int | None:
        r = comm_rank
        for first, count, step in self.rank_map:
            if r < count:
                return first + r * step
            r -= count
        return None


@dataclass(frozen=True)
class ProcessData:
    """Everything one process contributes to a gather."""

    comms: tuple[CommRecord, ...] = ()


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
