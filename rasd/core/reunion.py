"""Reunion after a partition: when the two sides of a healed partition meet again, the smaller side leaves the job.

Belongs here: a node's *side* (how many processes answered its last reachability gather, itself included, and the
lowest address among them), comparing two sides, the probes that look for the far side after a heal, and what a node
does when its side lost. Theory of operation (docs/architecture.md section 2.7)::

    probe    every PROBE_EVERY hang limits a node connects to one dead process of its *ring gap* (the dead
             addresses between it and its next live peer in table order, in a spread order), its CONNINIT
             carrying the node's side. So each dead process has one prober per side, its live predecessor; a
             killed process refuses the connect, which costs nothing.
    measure  a side is what a reachability gather reached (``suspicion.py``), at most MEASURED_FOR old; every
             CONNINIT carries it when there is one. A probe that carries no such side, or a side to an
             acceptor without one, gets MEASURE: both gather, and the prober probes the same process again
             when its gather has ended (and a keepalive interval; a gather's hard limit if MEASURE comes
             again).
    compare  an acceptor that holds the connector dead compares the measured sides: its own larger ->
             YOU_ARE_DEAD (the connector's side lost); smaller -> OUTNUMBERED (the acceptor's side lost). An
             acceptor that does not hold the connector dead is a zombie of the connector's view: it answers as
             usual, and the connector tells it it is dead (``handshake.py``).
    spread   the node whose side lost floods OUTVOTED(winner) to its side, then expels itself; a node that
             receives it and holds the winner dead was cut off with it: it passes it on and expels itself too.

Why measured sides. The processes a node holds alive are not its side while its verdicts are still coming: the
smaller side of a partition that heals a little after two dead limits holds a few of the larger side dead (its own
links' silence deaths) and the rest alive (their suspicions not yet due). Counted as alive, they made the smaller
side the larger one, and the larger side left the job (sweep seeds 55 and 121). What a gather reaches is measured,
not believed: across a healed partition nobody links to a process it holds dead, so each side's gather reaches
exactly that side.

Why this rule. A partition longer than the dead limit leaves each side holding the other dead, and each side is
right about what it cannot see (docs/reliability.md 2.1). Death is permanent (docs/architecture.md 2.6), so the
sides would stay apart after the network heals, each with its own report of the job. Only one side can go on
training anyway (it has the store and most of the ranks), so the larger side keeps its verdicts and the smaller
side's processes accept theirs, as a process paused past the dead limit does. Equal sides: the one whose lowest
address is lower wins, an order both sides compute alike.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING, NamedTuple

from . import wire
from .connections import Conn
from .peers import Addr, PeerKey

if TYPE_CHECKING:
    from .node import Node

#: How often a node probes its ring gap, in hang limits (10 s at the defaults).
PROBE_EVERY = 1.0
#: How long a measured side stands, in gather hard limits (leg timeout + extra: 20 s at the defaults). Long enough for
#: the re-probe after a MEASURE (one hard limit later) to find both sides' gathers done.
MEASURED_FOR = 2.0


class Side(NamedTuple):
    """One side of a partition as one of its members measured it."""

    live: int  # processes that answered its reachability gather, the member included; 0: not measured
    lowest: Addr  # the lowest address among them

    def beats(self, other: Side) -> bool:
        """More members wins; equal counts: the lower lowest address wins."""
        if self.live != other.live:
            return self.live > other.live
        return self.lowest.sort_key() < other.lowest.sort_key()


class Ruling(enum.Enum):
    """What an acceptor makes of a connection from a process it holds dead."""

    ZOMBIE = "zombie"  # not a reunion, or our side wins: our lists, then YOU_ARE_DEAD
    WE_LOSE = "we lose"  # the probe's side beats ours: OUTNUMBERED, and our side leaves
    MEASURE = "measure"  # a side is not measured: both gather, and the prober probes again


class Reunion:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._next_probe = 0.0
        self._turn = 0
        self._measured: tuple[Side, bool, float] | None = None  # our side as our last reachability gather found it
        self._again: tuple[Addr, float] | None = None  # a probe answered MEASURE: whom to probe again, and when
        self._measures = 0  # MEASURE answers in a row from one process (``_measured_for``)
        self._measured_for: Addr | None = None

    def measured(self, side: Side, complete: bool, now: float) -> None:
        """A reachability gather ended (``suspicion.py``): what it reached is our side. ``complete``: no leg timed
        out (a lost leg may have hidden part of our side)."""
        self._measured = (side, complete, now)

    def side(self, now: float, complete: bool = False) -> Side | None:
        """Our measured side, if measured lately (and, with ``complete``, by a gather that lost no leg)."""
        if self._measured is None:
            return None
        side, whole, at = self._measured
        timers = self.node.timers
        if now - at > MEASURED_FOR * (timers.leg_timeout + timers.gather_extra) or (complete and not whole):
            return None
        return side

    # --- probing -----------------------------------------------------------------------------------------------

    def gap(self) -> list[Addr]:
        """The dead processes between this node and its next live peer in table order (its ring gap)."""
        node = self.node
        order = list(node.table)
        start = next(i for i, p in enumerate(order) if p.addr == node.me.addr)
        gap: list[Addr] = []
        for step in range(1, len(order)):
            p = order[(start + step) % len(order)]
            if not node.verdicts.gone(p.key):
                break
            if p.key in node.verdicts.dead:
                gap.append(p.addr)
        return gap

    def probe_due(self, now: float) -> None:
        """Every PROBE_EVERY hang limits, connect to the next dead process of our ring gap (one at a time); a probe
        answered MEASURE is made again once both sides have gathered."""
        node = self.node
        if node.expelled or node.leaving:
            return
        if self._again is not None:
            target, at = self._again
            if now < at or node.suspicion.gathering:
                return  # our own gather first: the probe carries its measure
            if self.side(now, complete=True) is None:
                node.suspicion.measure(now)  # it ended too long ago, or lost a leg: once more
                return
            self._again = None
            if node.is_dead(target):
                node.connect(target, now).probe = True
            return
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_EVERY * node.timers.hang
        if not node.verdicts.dead or self._again is not None or any(c.probe for c in node.connections.by_id.values()):
            return
        gap = self.gap()
        if gap:
            target = gap[spread(self._turn, len(gap))]
            self._turn += 1
            node.connect(target, now).probe = True

    def measure(self, now: float, again: Addr | None = None) -> None:
        """Gather to measure our side (a prober: unless it measured lately); with ``again``, probe that process
        again once our gather has ended: a keepalive interval later the first time (the acceptor's gather, started
        when it answered, takes about as long as ours), a gather's hard limit later after that (its gather waits on
        a silent leg)."""
        node = self.node
        if again is None or self.side(now, complete=True) is None:
            node.suspicion.measure(now)
        if again is not None:
            if again != self._measured_for:
                self._measures, self._measured_for = 0, again
            self._measures += 1
            timers = node.timers
            wait = timers.keepalive if self._measures == 1 else timers.leg_timeout + timers.gather_extra
            self._again = (again, now + wait)

    def answered(self) -> None:
        """A probe of ours was answered with a ruling (not MEASURE)."""
        self._measures, self._measured_for = 0, None

    # --- comparing -----------------------------------------------------------------------------------------------

    def judge(self, key: PeerKey, msg: wire.ConnInit, now: float) -> Ruling:
        """A connection from ``key``, a process we hold gone: a zombie (no probe: it holds us alive), or a probe
        whose measured side beats ours, or a probe where one of the two sides is not measured lately (then we
        start measuring ours)."""
        node = self.node
        if msg.side_lowest is None or key not in node.verdicts.dead or not node.table.is_current(key):
            return Ruling.ZOMBIE
        ours = self.side(now)
        if msg.side_live == 0 or ours is None:
            if ours is None:
                self.measure(now)
            return Ruling.MEASURE
        if not Side(msg.side_live, msg.side_lowest).beats(ours):
            return Ruling.ZOMBIE
        if self.side(now, complete=True) is None:
            # We would lose, but our gather lost legs: part of our side may have gone uncounted. Measure again
            # before leaving (a lost leg can only make a side look smaller).
            self.measure(now)
            return Ruling.MEASURE
        return Ruling.WE_LOSE

    def conninit(self, conn: Conn, now: float) -> wire.ConnInit:
        """The CONNINIT this node sends on ``conn``: on a probe, with its measured side (live 0: none lately, or only
        by a gather that lost a leg, which could make the larger side lose)."""
        node = self.node
        msg = wire.ConnInit(node.me, node.table.hash, node.verdicts.dead_hash)
        if conn.probe:
            side = self.side(now, complete=True) or Side(0, node.me.addr)  # a lost leg can hide part of it
            msg = wire.ConnInit(node.me, node.table.hash, node.verdicts.dead_hash, side.live, side.lowest)
        return msg

    # --- losing --------------------------------------------------------------------------------------------------

    def lost(self, winner: PeerKey, now: float) -> None:
        """Our side met a larger one that holds us dead: tell our side, then leave the job."""
        node = self.node
        node.pass_on(node.floods.verdict(wire.FloodKind.OUTVOTED, winner), except_conn=None)
        node.expel(now, "the larger side of a healed partition holds this process dead")

    def outvoted(self, conn: Conn, msg: wire.Flood, winner: PeerKey, now: float) -> None:
        """A member of our side lost to ``winner``'s side. If we hold the winner dead we were cut off with it."""
        node = self.node
        if winner == node.me.key or winner not in node.verdicts.dead:
            return
        node.pass_on(msg, except_conn=conn.id)
        node.expel(now, "the larger side of a healed partition holds this process dead")


def spread(turn: int, n: int) -> int:
    """The gap index of probe number ``turn``: steps of about 0.618 of the gap (the golden ratio, made coprime with
    ``n``), so every member is probed once in ``n`` turns and the first few probes land far apart. A gap's near end
    is most likely the prober's own host and side: a process that missed its verdict when the rest of its side left
    the job holds them dead too, and probing them in table order would take one probe period each."""
    if n <= 2:
        return turn % n
    step = max(1, round(n * 0.618))
    while math.gcd(step, n) != 1:
        step += 1
    return (turn * step) % n
