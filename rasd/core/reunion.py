"""Reunion after a partition: when the two sides of a healed partition meet again, the smaller side leaves the job.

Belongs here: a node's *side* (how many processes it holds alive, itself included, and the lowest address among
them), comparing two sides, the probes that look for the far side after a heal, and what a node does when its side
lost. Theory of operation (docs/architecture.md section 2.7)::

    probe    every PROBE_EVERY hang limits a node connects to one dead process of its *ring gap* (the dead
             addresses between it and its next live peer in table order, taken in turn), its CONNINIT carrying
             the node's side. So each dead process has one prober per side, its live predecessor; a killed
             process refuses the connect, which costs nothing.
    compare  an acceptor that holds the connector dead compares the sides: its own larger -> YOU_ARE_DEAD (the
             connector's side lost); smaller -> OUTNUMBERED (the acceptor's side lost). An acceptor that does
             not hold the connector dead is a zombie of the connector's view: it answers as usual, and the
             connector tells it it is dead (``handshake.py``).
    spread   the node whose side lost floods OUTVOTED(winner) to its side, then expels itself; a node that
             receives it and holds the winner dead was cut off with it: it passes it on and expels itself too.

Why this rule. A partition longer than the dead limit leaves each side holding the other dead, and each side is
right about what it cannot see (docs/reliability.md 2.1). Death is permanent (docs/architecture.md 2.6), so the
sides would stay apart after the network heals, each with its own report of the job. Only one side can go on
training anyway (it has the store and most of the ranks), so the larger side keeps its verdicts and the smaller
side's processes accept theirs, as a process paused past the dead limit does. Equal sides: the one whose lowest
address is lower wins, an order both sides compute alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from . import wire
from .connections import Conn
from .peers import Addr, PeerKey

if TYPE_CHECKING:
    from .node import Node

#: How often a node probes its ring gap, in hang limits (10 s at the defaults).
PROBE_EVERY = 1.0


class Side(NamedTuple):
    """One side of a partition as one of its members sees it."""

    live: int  # processes held alive, the member included
    lowest: Addr  # the lowest address among them

    def beats(self, other: Side) -> bool:
        """More members wins; equal counts: the lower lowest address wins."""
        if self.live != other.live:
            return self.live > other.live
        return self.lowest.sort_key() < other.lowest.sort_key()


class Reunion:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._next_probe = 0.0
        self._turn = 0

    def side(self) -> Side:
        """This node's side: the processes it holds alive (the table is sorted: the first live one is the lowest)."""
        live = self.node.live_peers()
        return Side(len(live), live[0].addr if live else self.node.me.addr)

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
        """Every PROBE_EVERY hang limits, connect to the next dead process of our ring gap (one at a time)."""
        node = self.node
        if now < self._next_probe or node.expelled or node.leaving:
            return
        self._next_probe = now + PROBE_EVERY * node.timers.hang
        if not node.verdicts.dead or any(c.probe for c in node.connections.by_id.values()):
            return
        gap = self.gap()
        if gap:
            target = gap[self._turn % len(gap)]
            self._turn += 1
            node.connect(target, now).probe = True

    # --- comparing -----------------------------------------------------------------------------------------------

    def outnumbered_by(self, key: PeerKey, msg: wire.ConnInit) -> bool:
        """A probe from ``key``, a process we hold dead: does its side beat ours?"""
        node = self.node
        if msg.side_lowest is None or key not in node.verdicts.dead or not node.table.is_current(key):
            return False
        return Side(msg.side_live, msg.side_lowest).beats(self.side())

    def conninit(self, conn: Conn) -> wire.ConnInit:
        """The CONNINIT this node sends on ``conn``: with its side when the connection is a probe."""
        node = self.node
        msg = wire.ConnInit(node.me, node.table.hash, node.verdicts.dead_hash)
        if conn.probe:
            side = self.side()
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
