"""This process's communicators and their counters: what it contributes to a status report.

Written by the training thread (``rasd.torch``'s hooks, or the swarm's synthetic job), read by the RAS thread when
a gather asks. The hot path, ``launch`` and ``complete``, is one list-item increment and one float store each (the
caller passes the time, so that this module reads no clock). Readers take a
snapshot without locks: under the GIL a reader sees each counter either before or after an increment, and a
report taken mid-collective is allowed to be a step stale.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .comms import N_OPS, RESULT_SUCCESS, CommRecord, ProcessData, RankRecord

#: How many sequence ids of recent hooked calls a communicator remembers: more than the Flight Recorder's ring
#: holds between two reads (rasd.torch.records).
HOOKED_SEQS = 8192


@dataclass
class LocalComm:
    """One communicator rank held by this process."""

    comm_hash: int
    size: int
    rank: int
    rank_map: tuple[tuple[int, int, int], ...] = ()
    device: int = -1
    init_state: int = RESULT_SUCCESS
    async_error: int = RESULT_SUCCESS
    finalize_called: bool = False
    destroy_flag: bool = False
    abort_flag: bool = False
    launched: list[int] = field(default_factory=lambda: [0] * N_OPS)
    completed: list[int] = field(default_factory=lambda: [0] * N_OPS)
    last_change: float = 0.0  # when a counter last moved (the caller's monotonic clock)
    # Counting from torch's own records (rasd.torch.records, docs/operations.md "What is counted"): the hooks
    # count the calls they see in ``launched``/``completed``; what the process group performed beneath them
    # (DDP's buckets, functional collectives) is added from its sequence number and Flight Recorder.
    #: Sequence numbers the hooked calls consumed (plus the group's number when counting began).
    hooked_seq: int = 0
    #: The group's sequence number when the hooked call now in flight began; -1 when none is.
    hooked_from: int = -1
    #: The sequence ids the most recent hooked calls consumed (their Flight Recorder entries are not beneath).
    hooked_seqs: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=HOOKED_SEQS))
    beneath_launched: list[int] = field(default_factory=lambda: [0] * N_OPS)
    beneath_completed: list[int] = field(default_factory=lambda: [0] * N_OPS)
    #: Collectives beneath the hooks whose Flight Recorder entry was not read yet, counted under
    #: ``beneath_unread_op``: launched, and completed only when ``beneath_unread_completed`` (no recorder to tell).
    beneath_unread: int = 0
    beneath_unread_op: int = 0
    beneath_unread_completed: bool = False

    def launch(self, op: int, now: float = 0.0) -> int:
        """Count one operation of type ``op`` as launched; return its sequence number (1-based, per op type)."""
        self.launched[op] += 1
        self.last_change = now
        return self.launched[op]

    def complete(self, op: int, now: float = 0.0) -> None:
        self.completed[op] += 1
        self.last_change = now

    def counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(launched, completed) per op type: the hooks' counts plus those beneath them."""
        launched = [a + b for a, b in zip(self.launched, self.beneath_launched, strict=True)]
        completed = [a + b for a, b in zip(self.completed, self.beneath_completed, strict=True)]
        unread = self.beneath_unread
        if unread > 0:
            launched[self.beneath_unread_op] += unread
            if self.beneath_unread_completed:
                completed[self.beneath_unread_op] += unread
        return tuple(launched), tuple(completed)

    def record(self, now: float = 0.0) -> RankRecord:
        launched, completed = self.counts()
        return RankRecord(
            comm_rank=self.rank,
            init_state=self.init_state,
            async_error=self.async_error,
            finalize_called=self.finalize_called,
            destroy_flag=self.destroy_flag,
            abort_flag=self.abort_flag,
            device=self.device,
            launched=launched,
            completed=completed,
            idle_ms=max(0, min(int((now - self.last_change) * 1000), 0xFFFFFFFF)),
        )


class CommRegistry:
    def __init__(self) -> None:
        self._comms: dict[tuple[int, int], LocalComm] = {}

    def register(self, comm: LocalComm) -> LocalComm:
        self._comms[(comm.comm_hash, comm.rank)] = comm
        return comm

    def unregister(self, comm: LocalComm) -> None:
        self._comms.pop((comm.comm_hash, comm.rank), None)

    def comms(self) -> list[LocalComm]:
        return list(self._comms.values())

    def snapshot(self, now: float = 0.0) -> ProcessData:
        by_hash: dict[tuple[int, int], list[LocalComm]] = {}
        for c in list(self._comms.values()):
            by_hash.setdefault((c.comm_hash, c.size), []).append(c)
        return ProcessData(
            comms=tuple(
                CommRecord(
                    comm_hash=h,
                    size=size,
                    ranks=tuple(c.record(now) for c in sorted(cs, key=lambda c: c.rank)),
                    rank_map=cs[0].rank_map,
                )
                for (h, size), cs in sorted(by_hash.items())
            )
        )
