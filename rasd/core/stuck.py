"""Stuck collectives: which communicators' counters disagree and have stopped moving, and who is to blame.

Every sweep the job's sweeper (its lowest-address live process) gathers every process's counters and feeds them
here. A communicator is *stuck* when its ranks disagree (some launched fewer operations than others, or some
launched an operation they have not completed) and nothing has changed for the stuck limit. The verdict names the
first op type (in NCCL's order, then ours) where they disagree and attributes the stall, which NCCL's launch-only
counts cannot do::

    AllReduce launched/completed:   rank 0: 57/56   rank 1: 57/56   rank 2: 56/56   rank 3: 57/56
    -> operation 57 is stuck; rank 2 is behind (never launched it); ranks 0, 1, 3 are inside it

A verdict clears as soon as the counters move or agree again. Pure: snapshots and times in, verdicts out. The
snapshot is merged by ``snapshot.merge_communicators``, the same merge the report uses. The verdict itself,
``StuckVerdict``, is a value of its own module (``stuck_verdict.py``), which the snapshot carries; it is importable
from here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from .comms import OP_TYPES
from .snapshot import JobSnapshot, MergedCommunicator, merge_communicators
from .stuck_verdict import StuckVerdict as StuckVerdict  # re-exported: the rest of the core names it from here


def attribute(comm: MergedCommunicator) -> StuckVerdict | None:
    """Who is behind (launched fewer operations in all) or inside one (launched more than completed), and the
    first op type where they differ; None when every rank launched as many as the others and completed them all.

    The ranks are judged on totals over all op types: a total is exact where a split by type may be an estimate
    (collectives that torch issues beneath the Python hooks are typed from the Flight Recorder, rasd.torch.records),
    so a split that differs between ranks alone never makes a verdict. Read per state (fold.py): the ranks of a
    state share their counters."""
    states = [state for state, _ in comm.states]
    top_total = max(sum(s.launched) for s in states)
    behind = sorted(r for s, m in comm.states if sum(s.launched) < top_total for r in m.comm_ranks)
    inside = sorted(r for s, m in comm.states if sum(s.launched) > sum(s.completed) for r in m.comm_ranks)
    if not behind and not inside:
        return None
    op = next(
        (
            op
            for op in range(len(OP_TYPES))
            if len({s.launched[op] for s in states}) > 1 or any(s.launched[op] > s.completed[op] for s in states)
        ),
        len(OP_TYPES) - 1,
    )
    top = max(s.launched[op] for s in states)
    return StuckVerdict(
        comm.comm_hash, op, top, tuple(behind), tuple(inside), _global(comm, behind), _global(comm, inside)
    )


def located(verdict: StuckVerdict | None, comm: MergedCommunicator, snapshot: JobSnapshot) -> StuckVerdict | None:
    """``verdict`` with where each rank behind was in this sweep, as its process sent it (``ProcessData.where``).
    The verdict keeps them while it stands: they say where the ranks were when it was made."""
    if verdict is None:
        return None
    behind = set(verdict.behind)
    held = {r: p for _, m in comm.states for p, r in zip(m.procs, m.comm_ranks, strict=True) if r in behind}
    positions = []
    for rank in verdict.behind:
        data = snapshot.responses.get(snapshot.responders[held[rank]])
        if data is not None and data.where:
            positions.append((rank, data.where))
    return dataclasses.replace(verdict, positions=tuple(positions)) if positions else verdict


def _global(comm: MergedCommunicator, ranks: Iterable[int]) -> tuple[int, ...]:
    """Communicator ranks as global ranks, where the rank map tells."""
    return tuple(g for g in (comm.global_rank(r) for r in ranks) if g is not None)


#: What a sweep saw of one communicator: each distinct (launched, completed) and the communicator ranks that hold
#: it, in order of the counters.
Signature = tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...]


def signature(comm: MergedCommunicator) -> Signature:
    """What changes when any rank's counters move, and only then: the ranks holding each distinct pair of counters
    (states that differ in something else share an entry)."""
    by_counts: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for state, members in comm.states:
        by_counts.setdefault((state.launched, state.completed), []).extend(members.comm_ranks)
    return tuple(sorted((launched, completed, tuple(sorted(r))) for (launched, completed), r in by_counts.items()))


@dataclass
class _Watch:
    signature: Signature
    since: float  # when the counters took these values
    disagree: bool = False  # the ranks disagree: a verdict is due at ``since`` + the limit if nothing moves
    verdict: StuckVerdict | None = None


@dataclass
class StuckDetector:
    limit: float
    _watches: dict[tuple[int, int], _Watch] = field(default_factory=dict)  # by (hash, size), as merged

    def observe(self, snapshot: JobSnapshot, now: float) -> tuple[list[StuckVerdict], list[StuckVerdict]]:
        """Feed one sweep; return (verdicts that are new, verdicts that cleared)."""
        new: list[StuckVerdict] = []
        cleared: list[StuckVerdict] = []
        seen = set()
        for comm in merge_communicators(snapshot):
            key = (comm.comm_hash, comm.size)
            seen.add(key)
            seen_now = signature(comm)
            watch = self._watches.get(key)
            if watch is None or watch.signature != seen_now:
                if watch is not None and watch.verdict is not None:
                    cleared.append(watch.verdict)
                # The counters took these values when the most recently moved rank last moved: its idle time dates
                # the change to within the ranks' own resolution, not to this sweep (up to a sweep later).
                idle = min(min(members.idle_ms) for _, members in comm.states) / 1000.0
                previous = watch.since if watch is not None else float("-inf")
                self._watches[key] = _Watch(seen_now, max(now - idle, previous), attribute(comm) is not None)
                continue
            if watch.verdict is None and now - watch.since >= self.limit:
                watch.verdict = located(attribute(comm), comm, snapshot)
                if watch.verdict is not None:
                    new.append(watch.verdict)
        for key in list(self._watches):
            if key not in seen:
                watch = self._watches.pop(key)
                if watch.verdict is not None:
                    cleared.append(watch.verdict)
        return new, cleared

    def due(self) -> float | None:
        """When the next verdict falls due if nothing moves: the earliest ``since + limit`` of a communicator whose
        ranks disagree and that has no verdict yet. The sweeper sweeps then, so a verdict lands at the limit rather
        than up to a sweep after it."""
        times = [w.since + self.limit for w in self._watches.values() if w.disagree and w.verdict is None]
        return min(times) if times else None

    def active(self) -> list[StuckVerdict]:
        return [w.verdict for w in self._watches.values() if w.verdict is not None]
