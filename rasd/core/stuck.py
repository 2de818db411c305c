"""Stuck collectives: which communicators' counters disagree and have stopped moving, and who is to blame.

Every sweep the job's sweeper (its lowest-address live process) gathers every process's counters and feeds them
here. A communicator is *stuck* when its ranks disagree (some launched fewer operations than others, or some
launched an operation they have not completed) and nothing has changed for the stuck limit. The verdict names the
first op type (in NCCL's order, then ours) where they disagree and attributes the stall, which NCCL's launch-only
counts cannot do::

    AllReduce launched/completed:   rank 0: 57/56   rank 1: 57/56   rank 2: 56/56   rank 3: 57/56
    -> operation 57 is stuck; rank 2 is behind (never launched it); ranks 0, 1, 3 are inside it

A verdict clears as soon as a rank behind launches more or the counters agree again (the others moving alone
continue the stand). Pure: snapshots and times in, verdicts out. The snapshot is merged by
``snapshot.merge_communicators``, the same merge the report uses. The verdict itself, ``StuckVerdict``, is a value
of its own module (``stuck_verdict.py``), which the snapshot carries; it is importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from .comms import OP_TYPES
from .peers import Addr
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


#: An idle limit learned from a communicator is this multiple of the longest idle stand it ended by itself.
CADENCE_FACTOR = 3.0
#: How many of a communicator's recent idle stands the learned limit remembers.
CADENCE_MEMORY = 16


@dataclass
class _Watch:
    signature: Signature
    since: float  # when the counters took these values
    disagree: bool = False  # the ranks disagree: a verdict is due at ``since`` + the limit if nothing moves
    verdict: StuckVerdict | None = None
    #: The longest a rank behind was seen idle (not working, in no phase, waiting on nothing else) while these
    #: counters stood: what the communicator's cadence learns when they move again without a verdict.
    idle_seen: float = 0.0
    #: When a verdict can next fall due, as the last sweep judged the ranks behind (None: at ``since`` + the limit).
    due: float | None = None
    #: The ranks behind as the last sweep judged them, with how many operations each had launched in all: the stand
    #: ended by itself only when one of them launched more (others launching more, a DDP rank its next bucket's
    #: all-reduce while the rank behind stays wedged, ends nothing).
    behind: dict[int, int] = field(default_factory=dict)


@dataclass
class _Cadence:
    """What one communicator has shown of itself: the idle stands it ended by itself, most recent last."""

    stands: deque[float] = field(default_factory=lambda: deque(maxlen=CADENCE_MEMORY))

    def limit(self, floor: float, ceiling: float) -> float:
        return min(max(CADENCE_FACTOR * max(self.stands, default=0.0), floor), max(floor, ceiling))


@dataclass(frozen=True)
class _Rank:
    """How one rank behind stands: ``holding`` it holds the communicator with no reason the rules accept."""

    comm_rank: int
    holding: bool
    idle: float  # seconds idle while behind (0 in a phase or waiting elsewhere), for the cadence
    working: bool = False
    phase: str = ""
    #: Seconds since its process last worked, however long before the stand (the stand's length where unknown).
    free: float = 0.0


@dataclass
class StuckDetector:
    """COMM_STUCK and SLOW verdicts from successive sweeps (docs/architecture.md §4.2):

    * a communicator whose ranks disagree and whose counters have stood for its *idle limit* (``floor``, raised by
      what the communicator's own cadence has shown, never past ``ceiling``) is judged by its ranks behind;
    * a rank behind that has been idle that long (its process neither working nor in a declared phase, nor waiting
      in another communicator's operation) makes the verdict COMM_STUCK: a restart;
    * ranks behind that are working, in a phase, or waiting elsewhere make it SLOW: shown, never a restart, until
      ``busy_limit`` (a phase: its own limit), when it becomes COMM_STUCK;
    * a communicator with no rank behind (some ranks inside an operation the others completed) is COMM_STUCK at the
      idle limit, as before."""

    limit: float
    ceiling: float = 60.0
    busy_limit: float = 300.0
    _watches: dict[tuple[int, int], _Watch] = field(default_factory=dict)  # by (hash, size), as merged
    _cadences: dict[tuple[int, int], _Cadence] = field(default_factory=dict)

    def idle_limit(self, key: tuple[int, int]) -> float:
        cadence = self._cadences.get(key)
        return self.limit if cadence is None else cadence.limit(self.limit, self.ceiling)

    def observe(self, snapshot: JobSnapshot, now: float) -> tuple[list[StuckVerdict], list[StuckVerdict]]:
        """Feed one sweep; return (verdicts that are new or changed from SLOW to STUCK, verdicts that cleared)."""
        new: list[StuckVerdict] = []
        cleared: list[StuckVerdict] = []
        seen = set()
        standing: dict[tuple[int, int], tuple[MergedCommunicator, StuckVerdict]] = {}
        merged = merge_communicators(snapshot)
        for comm in merged:
            key = (comm.comm_hash, comm.size)
            seen.add(key)
            seen_now = signature(comm)
            watch = self._watches.get(key)
            if watch is None or watch.signature != seen_now:
                # The counters took these values when the most recently moved rank last moved: its idle time dates
                # the change to within the ranks' own resolution, not to this sweep (up to a sweep later).
                idle = min(min(members.idle_ms) for _, members in comm.states) / 1000.0
                since = max(now - idle, watch.since) if watch is not None else now - idle
                carried: tuple[float, StuckVerdict | None] = (0.0, None)
                if watch is not None:
                    if watch.behind and not _moved(watch.behind, comm):
                        # Only others moved (a DDP rank launched its next bucket's all-reduce), the rank behind has
                        # not: the same stand goes on, with its verdict if it has one.
                        since, carried = watch.since, (watch.idle_seen, watch.verdict)
                    elif watch.verdict is not None:
                        cleared.append(watch.verdict)
                    elif watch.idle_seen > 0:
                        self._cadences.setdefault(key, _Cadence()).stands.append(watch.idle_seen)
                watch = _Watch(seen_now, since, attribute(comm) is not None, carried[1], idle_seen=carried[0])
                self._watches[key] = watch
                # Judged at once: ``since`` is what the ranks' own counters say, not when this sweep first saw them,
                # so a stand older than this sweep may be due now (a sweep that first sees a wedge 4 s old names it
                # then, not a sweep later).
            verdict = attribute(comm) if watch.disagree else None
            if verdict is not None:
                standing[key] = (comm, verdict)
        judge = _Judge(self, snapshot, now, standing, _inside_by_process(merged))
        silent = _Silent(snapshot)
        for key, (comm, verdict) in standing.items():
            watch = self._watches[key]
            if watch.verdict is not None and not watch.verdict.slow:
                continue  # COMM_STUCK already: it stands until the counters move
            if silent.holds(comm):
                watch.due = math.inf  # no early sweep for it: the regular sweeps judge it again
                continue  # a rank's process did not answer (stopped, starved): the liveness verdicts judge it
            stood, limit = now - watch.since, self.idle_limit(key)
            ranks = judge.ranks(key)
            watch.idle_seen = max([watch.idle_seen] + [r.idle for r in ranks])
            watch.behind = _launched(comm, verdict.behind)
            # A rank behind that has done nothing for the limit holds a communicator the others have waited on for
            # half of it: stuck (a wedged rank is named the limit after it stopped, not after the slowest of the
            # others reached the collective). A rank idle for less is due once idle for the limit, if nothing moves.
            early = stood >= limit / 2 and any(r.holding for r in ranks)
            watch.due = max(
                watch.since + limit / 2, min((now + limit - r.free for r in ranks), default=watch.since + limit)
            )
            if stood < limit and not early:
                continue
            stuck = not ranks or any(r.holding for r in ranks)
            made = dataclasses.replace(
                located(verdict, comm, snapshot) or verdict,
                slow=not stuck,
                busy=tuple(r.comm_rank for r in ranks if r.working),
                phase=next((r.phase for r in ranks if r.phase), ""),
                stood_ms=int(stood * 1000),
                limit_ms=int(limit * 1000),
            )
            if watch.verdict is None or (watch.verdict.slow and stuck):
                new.append(made)
            watch.verdict = made
        for key in list(self._watches):
            if key not in seen:
                watch = self._watches.pop(key)
                if watch.verdict is not None:
                    cleared.append(watch.verdict)
        return new, cleared

    def due(self) -> float | None:
        """When the next verdict falls due if nothing moves: the earliest ``since + limit`` of a communicator whose
        ranks disagree and that has no verdict yet, or later where the last sweep found its ranks behind idle for
        less than the limit (a rank that worked until a moment ago: due once idle for the limit). The sweeper sweeps
        then, so a verdict lands at the limit rather than up to a sweep after it."""
        times = [
            w.since + self.idle_limit(key) if w.due is None else w.due
            for key, w in self._watches.items()
            if w.disagree and (w.verdict is None or w.verdict.slow)
        ]
        due = min(times, default=math.inf)
        return None if math.isinf(due) else due

    def active(self) -> list[StuckVerdict]:
        return [w.verdict for w in self._watches.values() if w.verdict is not None]


class _Silent:
    """Whether a communicator has a rank whose process is in the job but did not answer this sweep (SIGSTOP, its RAS
    thread starved of the GIL): such a communicator is not judged stuck, since its counters cannot tell where that
    rank is, and the hang limit (10 s) makes the verdict that names the process (PEER_HUNG, which terminates it,
    where COMM_STUCK would restart every rank, the silent one too)."""

    def __init__(self, snapshot: JobSnapshot) -> None:
        self.snapshot = snapshot
        self._by_rank: dict[int, Addr] | None = None

    def holds(self, comm: MergedCommunicator) -> bool:
        missing = set(range(comm.size)) - comm.present
        if not missing:
            return False
        s = self.snapshot
        if self._by_rank is None:
            self._by_rank = {p.rank: p.addr for p in s.peers if p.rank >= 0}
        for rank in missing:
            g = comm.global_rank(rank)
            addr = self._by_rank.get(g) if g is not None else None
            if addr is not None and addr not in s.responses and addr not in s.dead and addr not in s.left:
                return True
        return False


def _launched(comm: MergedCommunicator, ranks: Iterable[int]) -> dict[int, int]:
    """How many operations each of ``ranks`` (communicator ranks) has launched in all."""
    wanted = set(ranks)
    return {r: sum(s.launched) for s, m in comm.states for r in m.comm_ranks if r in wanted}


def _moved(behind: dict[int, int], comm: MergedCommunicator) -> bool:
    """Whether a rank that was behind has launched more since (or the communicator's ranks agree again): the stand
    ended. A rank no longer in the communicator's answers ends nothing by itself."""
    if attribute(comm) is None:
        return True
    now = _launched(comm, behind)
    return any(now.get(r, total) > total for r, total in behind.items())


def _held(comm: MergedCommunicator, verdict: StuckVerdict) -> list[tuple[int, int]]:
    """(communicator rank, process index) of each rank behind."""
    behind = set(verdict.behind)
    return sorted((r, p) for _, m in comm.states for p, r in zip(m.procs, m.comm_ranks, strict=True) if r in behind)


def _inside_by_process(merged: list[MergedCommunicator]) -> dict[Addr, set[tuple[int, int]]]:
    """The communicators each process holds a rank inside an operation of (launched, not completed)."""
    out: dict[Addr, set[tuple[int, int]]] = {}
    for comm in merged:
        for state, members in comm.states:
            if sum(state.launched) > sum(state.completed):
                for p in members.procs:
                    out.setdefault(comm.responders[p], set()).add((comm.comm_hash, comm.size))
    return out


class _Judge:
    """One sweep's judgement of the ranks behind in the communicators that stand disagreeing (``standing``).

    A rank behind that waits inside another communicator's operation is judged by that communicator: it is waiting
    for a reason while that one moves, or is held by ranks that work, are in a phase, or wait for a reason in turn.
    A chain that comes back to a communicator already on it is a deadlock across groups (rank 1 waits inside the
    pair's all-reduce, its partner inside the world's): nobody in it is waiting for a reason."""

    def __init__(
        self,
        detector: StuckDetector,
        snapshot: JobSnapshot,
        now: float,
        standing: dict[tuple[int, int], tuple[MergedCommunicator, StuckVerdict]],
        inside: dict[Addr, set[tuple[int, int]]],
    ) -> None:
        self.detector, self.snapshot, self.now = detector, snapshot, now
        self.standing, self.inside = standing, inside
        self._ranks: dict[tuple[int, int], list[_Rank]] = {}

    def ranks(self, key: tuple[int, int], chain: frozenset[tuple[int, int]] = frozenset()) -> list[_Rank]:
        known = self._ranks.get(key)
        if known is not None:
            return known
        comm, verdict = self.standing[key]
        out = [self._rank(r, p, key, chain | {key}) for r, p in _held(comm, verdict)]
        if not chain:  # a judgement made inside a chain depends on the chain: kept only at its root
            self._ranks[key] = out
        return out

    def progressing(self, key: tuple[int, int], chain: frozenset[tuple[int, int]]) -> bool:
        """Whether a communicator that a rank waits inside will move without a restart, as far as this sweep
        tells: it is moving, agreeing, or younger than its idle limit, or every rank holding it has a reason."""
        if key in chain:
            return False  # a cycle: a deadlock across groups
        if key not in self.standing:
            return True  # its counters moved since the last sweep, or its ranks agree
        watch = self.detector._watches[key]
        if self.now - watch.since < self.detector.idle_limit(key):
            return True
        ranks = self.ranks(key, chain)
        return bool(ranks) and not any(r.holding for r in ranks)

    def _rank(self, comm_rank: int, proc: int, key: tuple[int, int], chain: frozenset[tuple[int, int]]) -> _Rank:
        """One rank behind, by what its process sent with this sweep (``ProcessData.work``; None: nothing measured,
        so idle, as every rank was before processes measured their work)."""
        d = self.detector
        stood = self.now - d._watches[key].since
        limit = d.idle_limit(key)
        addr = self.snapshot.responders[proc]
        data = self.snapshot.responses.get(addr)
        work = data.work if data is not None else None
        if work is not None and work.phase:
            phase_limit = work.phase_limit_ms / 1000.0 if work.phase_limit_ms else d.busy_limit
            return _Rank(comm_rank, work.phase_ms / 1000.0 >= phase_limit, 0.0, phase=work.phase)
        free = stood if work is None else work.idle_ms / 1000.0
        idle = min(stood, free)
        if free < limit:  # it worked within the limit: working (a stand it ends by itself teaches the cadence)
            return _Rank(comm_rank, stood >= d.busy_limit, idle, working=True, free=free)
        elsewhere = self.inside.get(addr, set()) - {key}
        if any(self.progressing(other, chain) for other in sorted(elsewhere)):
            return _Rank(comm_rank, stood >= d.busy_limit, 0.0)  # waiting inside another's operation, for a reason
        return _Rank(comm_rank, True, idle, free=free)
