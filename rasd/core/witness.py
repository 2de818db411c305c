"""Training as a witness: a collective that needs every process of the job completed here, so none of them is hung.

Belongs here: the samples of this process's communicators (``Witness.tick``) and the one question the silence
verdicts ask of them (``Witness.moved``). The liveness ladder (liveness.py) reads a peer's *RAS thread*: its
keepalives. A process whose RAS thread is silent while its main thread trains is not hung, and restarting it would
cost a healthy job its work (issue 39, "first, do no harm"). The two can part: the RAS thread blocked in a write
(its log line to a pipe nobody drains, a stalled disk), in a name lookup, or stopped by a bug of its own, while the
training goes on. What the main thread does is seen here without hearing the peer at all: an all-reduce,
all-gather, reduce-scatter, all-to-all or barrier completes on a rank only after every member of its communicator
took part. So when such a collective completed here, on a communicator that holds every live process of the job,
after a peer went silent, that peer's training ran after its silence began: the PEER_HUNG verdict waits (links.py,
floods.py), and the event says why. (A process whose every thread stopped is hung, and the witness does not speak
for it: nothing completes with it. The PEER_HUNG verdicts seen at the end of bench/false_verdicts.py's DDP soaks
were such hangs, torch's own gloo teardown deadlocking a rank for ever: rasd/torch/hooks.py now prevents it.)

Which processes a communicator holds is known here only by its size: its ranks are numbered in the current
iteration of training, which renumbers them after a restart, while the peer table knows each process by its first
rank. So the witness speaks only for a communicator whose size is the count of live processes in the table: then
every live process is a member (one rank each), the silent peer included. A process that a restart left out of
training, or a newcomer still waiting, makes the counts differ, and the verdicts read the keepalives alone, as
before. Where the job's collectives are slow or rare (a checkpoint, an evaluation), nothing completes and nothing
is vouched for either: the witness only ever withholds a verdict that the work itself refutes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from .comms import OP_TYPES, CommRecord, ProcessData

#: The collectives that complete on a rank only after every member of the communicator took part.
EVERY_MEMBER_OPS: tuple[int, ...] = tuple(
    OP_TYPES.index(name) for name in ("AllGather", "ReduceScatter", "AllReduce", "AllToAll", "Barrier")
)
#: Seconds between two samples of this process's communicators (the RAS thread reads its counters; the metrics
#: read them as often), at the default timers; never more than an eighth of the hang limit (``Witness.for_hang``).
SAMPLE_S = 1.0
#: Samples kept: two minutes at SAMPLE_S (120 eighths of the hang limit where that is shorter), longer than any
#: silence the ladder judges before its dead limit.
KEPT = 120
#: A collective that completed within this long after the peer was last heard may have had the peer's part sent
#: before its silence began: it proves nothing. Never more than a quarter of the hang limit.
MARGIN_S = 1.0


class Sample(NamedTuple):
    at: float
    #: communicator hash -> (its size, the every-member collectives completed on this process's ranks of it)
    counts: dict[int, tuple[int, int]]


def every_member_completed(comm: CommRecord) -> int:
    return sum(rank.completed[op] for rank in comm.ranks for op in EVERY_MEMBER_OPS)


def sample(at: float, comms: tuple[CommRecord, ...] | list[CommRecord]) -> Sample:
    return Sample(at, {c.comm_hash: (c.size, every_member_completed(c)) for c in comms if c.ranks})


class Witness:
    """Owned by the node: ``local_data`` reads this process's communicators, ``live_count`` says how many processes
    of the table are neither dead nor departed."""

    def __init__(
        self,
        local_data: Callable[[], ProcessData],
        live_count: Callable[[], int],
        every: float = SAMPLE_S,
        margin: float = MARGIN_S,
    ) -> None:
        self.local_data = local_data
        self.live_count = live_count
        self.every = every
        self.margin = margin
        self.samples: deque[Sample] = deque(maxlen=KEPT)
        self._next = 0.0

    @classmethod
    def for_hang(cls, local_data: Callable[[], ProcessData], live_count: Callable[[], int], hang: float) -> Witness:
        """A witness whose samples fit the hang limit: a sample must fall between the margin after the silence
        began and the verdict, or there is no base to count from. With the timers scaled down (hang 2 s at a factor
        of 0.2), a one-second sample and a one-second margin left one second for a sample a loaded machine's RAS
        thread sometimes took late, and a silent RAS thread of a rank that trained was declared hung."""
        return cls(local_data, live_count, every=min(SAMPLE_S, hang / 8), margin=min(MARGIN_S, hang / 4))

    def tick(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + self.every
        taken = self._take(now)
        if taken is not None and taken.counts:
            self.samples.append(taken)

    def _take(self, now: float) -> Sample | None:
        try:
            return sample(now, self.local_data().comms)
        except Exception:  # noqa: BLE001 - a witness is evidence; without it the verdicts read keepalives alone
            return None

    def moved(self, silent_since: float, now: float) -> tuple[int, int | None]:
        """How many every-member collectives completed here, later than the margin after ``silent_since``, on a
        communicator that holds every live process of the job; and that communicator (the one with the most).
        ``(0, None)`` when none did, or when no sample is old enough to tell."""
        since = silent_since + self.margin
        base = next((s for s in self.samples if s.at >= since), None)
        current = self._take(now)
        if base is None or current is None:
            return 0, None
        live = self.live_count()
        best, best_hash = 0, None
        for comm_hash, (size, completed) in current.counts.items():
            before = base.counts.get(comm_hash)
            if before is None or size != live or before[0] != size:
                continue
            if completed - before[1] > best:
                best, best_hash = completed - before[1], comm_hash
        return best, best_hash


def withheld(silence: float, moved: int, comm_hash: int | None) -> str:
    """The event's details when the witness withholds a PEER_HUNG verdict."""
    comm = f" on communicator {comm_hash:016x}" if comm_hash is not None else ""
    return (
        f"peer silent for {int(silence)}s, but {moved} collectives that need it completed here since{comm}: "
        "its training runs, no verdict"
    )
