"""A fault schedule for the simulator, recorded so the invariants can be checked against it afterwards.

Every fault is applied between ``run_until`` calls, at a virtual time chosen by the test; the record says, for every
node, when it was killed, paused (and for how long) and cut off by a partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rasd.core.events import Kind
from rasd.core.liveness import CONFIRM
from rasd.sim import Simulation


@dataclass
class Record:
    killed: dict[int, float] = field(default_factory=dict)
    paused: dict[int, tuple[float, float]] = field(default_factory=dict)  # node -> (from, to); to = inf if never
    partitions: list[tuple[frozenset[int], frozenset[int], float, float]] = field(default_factory=list)
    # (a partition's smaller side, its start) -> the nodes paused then that a node of the larger side linked to
    watched: dict[tuple[frozenset[int], float], set[int]] = field(default_factory=dict)
    # (a partition's smaller side, its start) -> the nodes paused later, while it held, that no node outside the
    # smaller side linked to then
    unlinked: dict[tuple[frozenset[int], float], set[int]] = field(default_factory=dict)


class Scenario:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.rec = Record()
        self._open: dict[object, tuple[frozenset[int], frozenset[int], float]] = {}

    @property
    def timers(self):
        return self.sim.timers

    def run_until(self, t: float) -> None:
        self.sim.run_until(t)

    def kill(self, nodes) -> None:
        for i in nodes:
            self.sim.kill(i)
            self.rec.killed[i] = self.sim.now

    def pause(self, nodes) -> None:
        for i in nodes:
            for x, y, a in self._open.values():
                small = min(x, y, key=len)
                outside = [s for s in self.sim.nodes if s.index not in small and s.index != i]
                if not any(self.sim.addr(i) in s.node.links.contacts for s in outside if s.alive and not s.paused):
                    self.rec.unlinked.setdefault((small, a), set()).add(i)
            self.sim.pause(i)
            self.rec.paused[i] = (self.sim.now, float("inf"))

    def resume(self, nodes) -> None:
        for i in nodes:
            self.sim.resume(i)
            start, _ = self.rec.paused[i]
            self.rec.paused[i] = (start, self.sim.now)

    def partition(self, a, b):
        p = self.sim.partition(set(a), set(b))
        self._open[p] = (p[0], p[1], self.sim.now)
        small = min(p[0], p[1], key=len)
        outside = [s for s in self.sim.nodes if s.index not in small and s.alive and not s.paused]
        self.rec.watched[(small, self.sim.now)] = {
            i
            for i, (start, end) in self.rec.paused.items()
            if end == float("inf") and any(self.sim.addr(i) in s.node.links.contacts for s in outside)
        }
        return p

    def heal(self, p) -> None:
        self.sim.heal(p)
        a, b, start = self._open.pop(p)
        self.rec.partitions.append((a, b, start, self.sim.now))

    # ------------------------------------------------------------------------------------------------------------
    # What the record implies

    def grace(self) -> float:
        """How long after the dead limit a silence verdict may take to be made: our HUNG verdict standing unrefuted
        (CONFIRM unresponsive limits) and a reachability gather at its hard limit (rasd/core/suspicion.py), plus
        the slack of a keepalive and two ticks. A pause that ends inside it may end either way."""
        t = self.timers
        return CONFIRM * t.unresponsive + t.leg_timeout + t.gather_extra + t.keepalive + 2 * t.tick

    def doomed(self, grace: float = 0.0) -> set[int]:
        """Nodes the job must end up declaring dead: killed, or paused past the time their verdict was due
        (``verdict_due``, with ``grace``)."""
        return set(self.rec.killed) | {i for i, (a, b) in self.rec.paused.items() if b > self.verdict_due(i, grace)}

    def undecided(self, grace: float) -> set[int]:
        """Nodes paused past the dead limit, resumed before their verdict was due: dead everywhere or alive
        everywhere."""
        dead = self.timers.dead
        return {
            i
            for i, (a, b) in self.rec.paused.items()
            if dead < b - a and b <= self.verdict_due(i, grace) and i not in self.rec.killed
        }

    def verdict_due(self, i: int, grace: float) -> float:
        """When the job must have declared paused node ``i`` dead: a dead limit and ``grace`` into its pause, or
        later when a partition cut off its ring neighbours while it was silent and left nobody outside linked to
        it. Its silence then belongs to the partition's run of unreached processes, which is declared only once
        none of the run was heard for the dead limit (rasd/core/suspicion.py, "Why a refutation clears a run"): a
        dead limit into the partition, or at the heal, when it is alone again (sweep seed 5614: paused inside a
        host cut off for 1.4 dead limits, every node linked to it inside the host). A node outside still linked to
        it measures its silence from the pause, whatever the partition does. A pause that began later, while the
        partition held, is likewise held back with the run when no node outside linked to it at its start
        (``Record.unlinked``; sweep seed 7357).

        The run is declared a dead limit and ``grace`` after the later of the partition's start and the pause, if
        the partition lasts that long. If it heals sooner, the run may never be declared: the heal refutes it, and
        the paused node, alone again, is due ``grace`` after the heal (sweep seed 7357: a partition of 1.6 dead
        limits healed before the larger side declared the run; the node, paused just after the partition began,
        was suspected again alone after the heal)."""
        start, _ = self.rec.paused[i]
        due = start + self.timers.dead + grace
        spans = [(x, y, a, b) for x, y, a, b in self.rec.partitions]
        spans += [(x, y, a, float("inf")) for x, y, a in self._open.values()]
        moved = True
        while moved:  # an extension may bring an earlier-listed partition within reach
            moved = False
            for x, y, a, b in spans:
                small = min(x, y, key=len)
                if start <= a:
                    hidden = i not in self.rec.watched.get((small, a), ())
                else:
                    hidden = i in self.rec.unlinked.get((small, a), ())
                declared = max(a, start) + self.timers.dead + grace
                later = declared if b >= declared else b + grace
                if a < due < later and b > start and hidden and self._run_meets(i, small, a):
                    due, moved = later, True
        return due

    def _run_meets(self, i: int, group: frozenset[int], at: float) -> bool:
        """Whether the stretch of consecutive nodes silent at ``at`` (paused or killed) around ``i``, in table
        order, has a neighbour in ``group`` (the simulator numbers nodes in table order)."""
        n = len(self.sim.nodes)

        def silent(j: int) -> bool:
            if j in self.rec.killed and self.rec.killed[j] <= at:
                return True
            span = self.rec.paused.get(j)
            return span is not None and span[0] <= at < span[1]

        for step in (1, -1):
            j = (i + step) % n
            while j != i and silent(j) and j not in group:
                j = (j + step) % n
            if j in group:
                return True
        return False

    def zombies(self) -> set[int]:
        """Paused past the dead limit and resumed since."""
        dead = self.timers.dead
        return {
            i
            for i, (a, b) in self.rec.paused.items()
            if b - a > dead and b != float("inf") and i not in self.rec.killed
        }

    def survivors(self, grace: float = 0.0) -> list[int]:
        doomed = self.doomed(grace)
        return [s.index for s in self.sim.nodes if s.index not in doomed]

    def slack(self) -> float:
        """How much earlier than the record says a silence may have begun: the last message heard may predate the
        fault by up to a keepalive interval, and a verdict waits for a tick (two, at the edges)."""
        return self.timers.keepalive + 2 * self.timers.tick

    def may_be_declared_dead(self, subject: int, at: float, observer: int | None = None) -> bool:
        """A verdict about ``subject`` at ``at`` is justified only if it was killed by then, or had been silent for
        about the dead limit by then because it was paused past it, or a partition that cut it off from part of the
        job had lasted the dead limit by then. With ``observer`` (who holds the verdict), that partition must have
        had the two on opposite sides, or ``subject`` on the smaller one: either side may declare the other dead,
        and the larger side's verdicts travel into the smaller one once it heals (which side keeps its verdicts is
        checked at the end), but nothing justifies a verdict about a process of the larger side held on the larger
        side. Slack: the last message heard from it may predate the pause by up to a keepalive interval (and a
        tick)."""
        if subject in self.rec.killed and self.rec.killed[subject] <= at:
            return True
        if self.separated_past_dead(subject, at, observer):
            return True
        if subject in self.rec.paused:
            start, end = self.rec.paused[subject]
            slack = self.slack()
            if end - start > self.timers.dead and at >= start + self.timers.dead - slack:
                return True
        return False

    def separated_past_dead(self, node: int, at: float, observer: int | None = None) -> bool:
        """Whether a partition with ``node`` on one side lasted (or, still open, has lasted) the dead limit by ``at``,
        less the slack of ``may_be_declared_dead``; with ``observer``, a partition with the two on opposite sides or
        ``node`` on the smaller side."""
        slack = self.slack()
        spans = [(x, y, start, end) for x, y, start, end in self.rec.partitions]
        spans += [(x, y, start, float("inf")) for x, y, start in self._open.values()]
        for x, y, start, end in spans:
            if observer is None:
                cut = node in x or node in y
            else:
                cut = node in min(x, y, key=len) or (node in x and observer in y) or (node in y and observer in x)
            if cut and end - start >= self.timers.dead - slack and at >= start + self.timers.dead - slack:
                return True
        return False

    def cut_off_until(self, observer: int, at: float) -> float:
        """When ``observer`` can next hear the job after ``at``: later than ``at`` if it was paused or partitioned
        away from most of the job at that time."""
        t = at
        if observer in self.rec.paused:
            a, b = self.rec.paused[observer]
            if a <= t < b:
                t = b
        for x, y, a, b in self.rec.partitions:
            if (observer in x or observer in y) and a <= t < b:
                t = b
        return t

    # ------------------------------------------------------------------------------------------------------------

    def dead_verdicts(self) -> list[tuple[int, int, float]]:
        """(observer, subject, time) of every PEER_DEAD about another node."""
        idx = self.sim.addr_index
        out = []
        for observer, at, e in self.sim.events(Kind.PEER_DEAD):
            subject = idx[e.addr]
            if subject != observer:
                out.append((observer, subject, at))
        return out

    def trace(self) -> list[tuple]:
        """Every event but PEER_NEW (of which there are N squared), in a comparable form."""
        return [
            (s.index, round(t, 9), e.kind.value, str(e.addr), e.details)
            for s in self.sim.nodes
            for t, e in s.events
            if e.kind is not Kind.PEER_NEW
        ]
