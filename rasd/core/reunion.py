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
from typing import TYPE_CHECKING

from . import wire
from .effects import (
    Broadcast,
    Dial,
    Drop,
    Effects,
    Expel,
    Measure,
    Originate,
    Purpose,
    Say,
    SendTable,
    Side,
)
from .peers import Addr, PeerKey

if TYPE_CHECKING:
    from .view import World

__all__ = ["MEASURED_FOR", "PROBE_EVERY", "Reunion", "Ruling", "Side", "spread"]

#: How often a node probes its ring gap, in hang limits (10 s at the defaults).
PROBE_EVERY = 1.0
#: How long a measured side stands, in gather hard limits (leg timeout + extra: 20 s at the defaults). Long enough for
#: the re-probe after a MEASURE (one hard limit later) to find both sides' gathers done.
MEASURED_FOR = 2.0
#: Why a node whose side lost leaves the job.
_LOST = "the larger side of a healed partition holds this process dead"


class Ruling(enum.Enum):
    """What an acceptor makes of a connection from a process it holds dead."""

    ZOMBIE = "zombie"  # not a reunion, or our side wins: our lists, then YOU_ARE_DEAD
    WE_LOSE = "we lose"  # the probe's side beats ours: OUTNUMBERED, and our side leaves
    MEASURE = "measure"  # a side is not measured: both gather, and the prober probes again


class Reunion:
    def __init__(self, world: World) -> None:
        self.world = world
        self._next_probe = 0.0
        self._turn = 0
        self._measured: tuple[Side, bool, float] | None = None  # our side as our last reachability gather found it
        self._again: tuple[Addr, float] | None = None  # a probe answered MEASURE: whom to probe again, and when
        self._measures = 0  # MEASURE answers in a row from one process (``_measured_for``)
        self._measured_for: Addr | None = None
        #: Our probes in progress, by connection id (a probe that met a live process is an ordinary connection).
        self.probes: set[int] = set()

    def measured(self, side: Side, complete: bool, now: float) -> None:
        """A reachability gather ended (``suspicion.py``): what it reached is our side. ``complete``: no leg timed
        out (a lost leg may have hidden part of our side)."""
        self._measured = (side, complete, now)

    def side(self, now: float, complete: bool = False) -> Side | None:
        """Our measured side, if measured lately (and, with ``complete``, by a gather that lost no leg)."""
        if self._measured is None:
            return None
        side, whole, at = self._measured
        timers = self.world.timers
        if now - at > MEASURED_FOR * (timers.leg_timeout + timers.gather_extra) or (complete and not whole):
            return None
        return side

    # --- probing -----------------------------------------------------------------------------------------------

    def gap(self) -> list[Addr]:
        """The dead processes between this node and its next live peer in table order (its ring gap)."""
        world = self.world
        order = list(world.table)
        start = next(i for i, p in enumerate(order) if p.addr == world.me.addr)
        gap: list[Addr] = []
        dead = world.dead
        for step in range(1, len(order)):
            p = order[(start + step) % len(order)]
            if not world.is_gone(p.key):
                break
            if p.key in dead:
                gap.append(p.addr)
        return gap

    def probe_due(self, now: float) -> Effects:
        """Every PROBE_EVERY hang limits, connect to the next dead process of our ring gap (one at a time); a probe
        answered MEASURE is made again once both sides have gathered."""
        world = self.world
        if world.expelled or world.leaving:
            return []
        if self._again is not None:
            target, at = self._again
            if now < at or world.reach_gathering():
                return []  # our own gather first: the probe carries its measure
            if self.side(now, complete=True) is None:
                return [Measure()]  # it ended too long ago, or lost a leg: once more
            self._again = None
            return [Dial(target, Purpose.PROBE)] if world.is_dead(target) else []
        if now < self._next_probe:
            return []
        self._next_probe = now + PROBE_EVERY * world.timers.hang
        if not world.dead or self._again is not None or self.probes:
            return []
        gap = self.gap()
        if gap:
            target = gap[spread(self._turn, len(gap))]
            self._turn += 1
            return [Dial(target, Purpose.PROBE)]
        return []

    def dialled(self, conn_id: int) -> None:
        """The connection a ``Dial(PROBE)`` of ours asked for is open."""
        self.probes.add(conn_id)

    def met(self, conn_id: int) -> None:
        """A probe met a process the job holds alive (a newer one at that address): an ordinary connection now."""
        self.probes.discard(conn_id)

    def forget_conn(self, conn_id: int) -> None:
        self.probes.discard(conn_id)

    def is_probe(self, conn_id: int) -> bool:
        return conn_id in self.probes

    def measure(self, now: float, again: Addr | None = None) -> Effects:
        """Gather to measure our side (a prober: unless it measured lately); with ``again``, probe that process
        again once our gather has ended: a keepalive interval later the first time (the acceptor's gather, started
        when it answered, takes about as long as ours), a gather's hard limit later after that (its gather waits on
        a silent leg)."""
        out: Effects = []
        if again is None or self.side(now, complete=True) is None:
            out.append(Measure())
        if again is not None:
            if again != self._measured_for:
                self._measures, self._measured_for = 0, again
            self._measures += 1
            timers = self.world.timers
            wait = timers.keepalive if self._measures == 1 else timers.leg_timeout + timers.gather_extra
            self._again = (again, now + wait)
        return out

    def answered(self) -> None:
        """A probe of ours was answered with a ruling (not MEASURE)."""
        self._measures, self._measured_for = 0, None

    # --- comparing -----------------------------------------------------------------------------------------------

    def judge(self, conn_id: int, key: PeerKey, msg: wire.ConnInit, now: float) -> Effects:
        """A connection from ``key``, a process we hold gone or older than the one at its address (the acceptor's
        side of the rule): our lists and YOU_ARE_DEAD, OUTNUMBERED and our side leaves, or MEASURE."""
        ruling, out = self._ruling(key, msg, now)
        if ruling is Ruling.WE_LOSE:
            # A healed partition, and the connector's side is the larger one: ours leaves.
            return out + [Say(conn_id, wire.ConnInitAck(wire.Nack.OUTNUMBERED)), Drop(conn_id)] + self.lost(key, now)
        if ruling is Ruling.MEASURE:
            return out + [Say(conn_id, wire.ConnInitAck(wire.Nack.MEASURE)), Drop(conn_id)]
        # Dead, departed, or older than the process that holds its address now (so gone): never rejoins. A dead one
        # gets our lists first, which it passes on to whoever it is still connected to: most likely processes cut
        # off with it (the smaller side of a healed partition), who learn it at once.
        if key in self.world.dead:
            out.append(SendTable(conn_id))
        return out + [Say(conn_id, wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD)), Drop(conn_id)]

    def _ruling(self, key: PeerKey, msg: wire.ConnInit, now: float) -> tuple[Ruling, Effects]:
        """A zombie (no probe: it holds us alive), or a probe whose measured side beats ours, or a probe where one of
        the two sides is not measured lately (then we start measuring ours)."""
        world = self.world
        if msg.side_lowest is None or key not in world.dead or not world.table.is_current(key):
            return Ruling.ZOMBIE, []
        ours = self.side(now)
        if msg.side_live == 0 or ours is None:
            return Ruling.MEASURE, self.measure(now) if ours is None else []
        if not Side(msg.side_live, msg.side_lowest).beats(ours):
            return Ruling.ZOMBIE, []
        if self.side(now, complete=True) is None:
            # We would lose, but our gather lost legs: part of our side may have gone uncounted. Measure again
            # before leaving (a lost leg can only make a side look smaller).
            return Ruling.MEASURE, self.measure(now)
        return Ruling.WE_LOSE, []

    def conninit(self, conn_id: int, now: float) -> wire.ConnInit:
        """The CONNINIT this node sends on a connection: on a probe, with its measured side (live 0: none lately, or
        only by a gather that lost a leg, which could make the larger side lose)."""
        world = self.world
        if conn_id in self.probes:
            side = self.side(now, complete=True) or Side(0, world.me.addr)  # a lost leg can hide part of it
            return wire.ConnInit(world.me, world.table.hash, world.dead_hash, side.live, side.lowest)
        return wire.ConnInit(world.me, world.table.hash, world.dead_hash)

    def send_conninit(self, conn_id: int, now: float) -> Effects:
        return [Say(conn_id, self.conninit(conn_id, now))]

    # --- losing --------------------------------------------------------------------------------------------------

    def lost(self, winner: PeerKey, now: float) -> Effects:
        """Our side met a larger one that holds us dead: tell our side, then leave the job."""
        return [Originate(wire.FloodKind.OUTVOTED, winner), Expel(_LOST)]

    def outvoted(self, conn_id: int, msg: wire.Flood, winner: PeerKey, now: float) -> Effects:
        """A member of our side lost to ``winner``'s side. If we hold the winner dead we were cut off with it."""
        if winner == self.world.me.key or winner not in self.world.dead:
            return []
        return [Broadcast(msg, conn_id), Expel(_LOST)]


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
