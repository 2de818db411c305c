"""Stuck collectives: which communicators' counters disagree and have stopped moving, and who is to blame.

Every sweep the job's sweeper (its lowest-address live process) gathers every process's counters and feeds them
here. A communicator is *stuck* when its ranks disagree (some launched fewer operations than others, or some
launched an operation they have not completed) and nothing has changed for the stuck limit. The verdict names the
first op type (in NCCL's order, then ours) where they disagree and attributes the stall, which NCCL's launch-only
counts cannot do::

    AllReduce launched/completed:   rank 0: 57/56   rank 1: 57/56   rank 2: 56/56   rank 3: 57/56
    -> operation 57 is stuck; rank 2 is behind (never launched it); ranks 0, 1, 3 are inside it

A verdict clears as soon as the counters move or agree again. Pure: snapshots and times in, verdicts out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .comms import OP_TYPES, CommRecord, RankRecord
from .snapshot import JobSnapshot


@dataclass(frozen=True)
class StuckVerdict:
    comm_hash: int
    op: int  # index into OP_TYPES
    seq: int  # the operation the most advanced ranks launched
    behind: tuple[int, ...]  # communicator ranks that launched fewer operations of this type
    inside: tuple[int, ...]  # communicator ranks that launched an operation of this type and did not complete it
    global_behind: tuple[int, ...] = ()  # the same ranks as global ranks, where the rank map tells
    global_inside: tuple[int, ...] = ()

    def describe(self) -> str:
        op = OP_TYPES[self.op]
        parts = [f"{op} operation {self.seq} stuck"]
        if self.behind:
            parts.append(f"{_ranks(self.behind)} behind (not launched)")
        if self.inside:
            parts.append(f"{_ranks(self.inside)} inside it (launched, not completed)")
        return "; ".join(parts)

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.global_behind + self.global_inside))


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def merged_comms(snapshot: JobSnapshot) -> dict[int, tuple[CommRecord, dict[int, RankRecord]]]:
    """Every communicator of the snapshot with its present ranks (first report of a rank wins)."""
    out: dict[int, tuple[CommRecord, dict[int, RankRecord]]] = {}
    for data in snapshot.responses.values():
        for comm in data.comms:
            _, ranks = out.setdefault(comm.comm_hash, (comm, {}))
            for r in comm.ranks:
                ranks.setdefault(r.comm_rank, r)
    return out


def attribute(comm: CommRecord, ranks: dict[int, RankRecord]) -> StuckVerdict | None:
    """The first op type whose counters disagree, and who is behind or inside it; None when they agree."""
    records = [ranks[k] for k in sorted(ranks)]
    for op in range(len(OP_TYPES)):
        launched = [r.launched[op] for r in records]
        top = max(launched)
        behind = tuple(r.comm_rank for r in records if r.launched[op] < top)
        inside = tuple(r.comm_rank for r in records if r.launched[op] > r.completed[op])
        if behind or inside:
            to_global = lambda rs: tuple(g for g in (comm.global_rank(r) for r in rs) if g is not None)  # noqa: E731
            return StuckVerdict(comm.comm_hash, op, top, behind, inside, to_global(behind), to_global(inside))
    return None


@dataclass
class _Watch:
    signature: tuple
    since: float
    verdict: StuckVerdict | None = None


@dataclass
class StuckDetector:
    limit: float
    _watches: dict[int, _Watch] = field(default_factory=dict)

    def observe(self, snapshot: JobSnapshot, now: float) -> tuple[list[StuckVerdict], list[StuckVerdict]]:
        """Feed one sweep; return (verdicts that are new, verdicts that cleared)."""
        new: list[StuckVerdict] = []
        cleared: list[StuckVerdict] = []
        seen = set()
        for comm_hash, (comm, ranks) in merged_comms(snapshot).items():
            seen.add(comm_hash)
            signature = tuple((k, r.launched, r.completed) for k, r in sorted(ranks.items()))
            watch = self._watches.get(comm_hash)
            if watch is None or watch.signature != signature:
                if watch is not None and watch.verdict is not None:
                    cleared.append(watch.verdict)
                self._watches[comm_hash] = _Watch(signature, now)
                continue
            if watch.verdict is None and now - watch.since >= self.limit:
                watch.verdict = attribute(comm, ranks)
                if watch.verdict is not None:
                    new.append(watch.verdict)
        for comm_hash in list(self._watches):
            if comm_hash not in seen:
                watch = self._watches.pop(comm_hash)
                if watch.verdict is not None:
                    cleared.append(watch.verdict)
        return new, cleared

    def active(self) -> list[StuckVerdict]:
        return [w.verdict for w in self._watches.values() if w.verdict is not None]
