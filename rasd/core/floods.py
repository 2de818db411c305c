"""Verdict floods: how a verdict reaches every node exactly once.

Belongs here: flood ids (one counter per node for every kind of flood, so (origin, id) names one flood), the
memory of floods already seen, and what a node does with a flood it sees first: apply it, then pass it on to every
other ready connection. Two kinds travel this way: process verdicts (``wire.Flood``: DEAD, LEFT, HUNG, RECOVERED,
and the reachability rules' SUSPECT, HEARD and OUTVOTED) and communicator verdicts (``wire.CommVerdict``:
COMM_STUCK and its clear). The verdicts themselves live in ``verdicts.py`` and ``sweeper.py``; the dead and departed
sets are also hashed into every keepalive as a backstop for a missed flood (``gossip.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import wire
from .connections import Conn
from .peers import Addr, PeerKey
from .recent import Recent
from .stuck import StuckVerdict

if TYPE_CHECKING:
    from .node import Node


class Floods:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._next_id = 1
        self._seen: Recent[tuple[Addr, int]] = Recent()

    def _allocate(self) -> int:
        """A new flood id from this node, remembered as seen (our own flood coming back is not applied again)."""
        flood_id = self._next_id
        self._next_id += 1
        self._seen.remember((self.node.me.addr, flood_id))
        return flood_id

    def verdict(self, kind: wire.FloodKind, subject: PeerKey, stamp: float = 0.0) -> wire.Flood:
        """A new flood of a process verdict about ``subject``, originated here (``stamp``: wire.Flood)."""
        return wire.Flood(self.node.me.addr, self._allocate(), kind, subject.addr, subject.incarnation, stamp)

    def comm_verdict(self, v: StuckVerdict, stuck: bool) -> wire.CommVerdict:
        """A new flood of a communicator verdict (or its clear), originated here."""
        return wire.CommVerdict(
            self.node.me.addr,
            self._allocate(),
            stuck,
            v.comm_hash,
            v.op,
            v.seq,
            v.behind,
            v.inside,
            v.global_behind,
            v.global_inside,
        )

    def on_flood(self, conn: Conn, msg: wire.Flood, now: float) -> None:
        node = self.node
        if not self._seen.first_sight((msg.origin, msg.flood_id)):
            return
        if node.is_dead(msg.origin):
            # A verdict of a process we hold dead: a zombie's, or the other side's of a healed partition, passed on
            # by a process both sides hold alive. Neither applies here, nor goes further (sweep seed 46: the
            # smaller side's late verdict about a process of the larger side, carried into the larger side).
            return
        subject = PeerKey(msg.subject, msg.incarnation)
        if msg.kind is wire.FloodKind.OUTVOTED:
            node.reunion.outvoted(conn, msg, subject, now)
            return
        if msg.kind is wire.FloodKind.SUSPECT:
            if not node.verdicts.gone(subject):
                node.suspicion.on_suspect(conn, msg, subject, now)
            return
        if subject == node.me.key:
            if msg.kind is wire.FloodKind.DEAD:
                # Pass it on first: those still linked to us were most likely cut off with us, and may hear of our
                # death only through us (gossip.py does the same with a full update naming us dead).
                node.pass_on(msg, except_conn=conn.id)
                node.expel(now)
            elif msg.kind is wire.FloodKind.HUNG:
                # Somebody holds us hung, and we run: refute it, stamped with our own clock.
                node.pass_on(self.verdict(wire.FloodKind.RECOVERED, subject, now), except_conn=None)
            return
        if not node.table.is_current(subject) or node.verdicts.gone(subject):
            return  # unknown, already gone, or an older incarnation of that address (gone by rule): stale
        if msg.kind is wire.FloodKind.DEAD:
            node.verdicts.declare_dead(subject, now, None, flood=False)
        elif msg.kind is wire.FloodKind.LEFT:
            node.verdicts.mark_left(subject, now)
        elif msg.kind is wire.FloodKind.HUNG:
            if node.links.fresher(subject, msg.stamp):
                # Refuted: we heard it well after the origin last did. The flood stops here and our RECOVERED tells
                # the job, the origin included, before its verdict becomes a death (liveness.py, CONFIRM).
                refute = self.verdict(wire.FloodKind.RECOVERED, subject, node.links.stamp(subject))
                node.pass_on(refute, except_conn=None)
                return
            if node.links.refuted(subject, msg.stamp):
                return  # a RECOVERED stamped well after this verdict came in first, by a faster path: old news
            node.verdicts.hung_verdict(subject, now, "peer silent beyond the hang limit")
        elif msg.kind is wire.FloodKind.RECOVERED:
            node.verdicts.recovered(subject, now)
            node.links.vouch(subject, msg.stamp, now)
        elif msg.kind is wire.FloodKind.HEARD:
            # Not a RECOVERED: that one says "heard after the HUNG's origin did", which may be long ago (sweep seed
            # 471: a partition's stale HUNG verdicts, refuted again and again about a process paused for good, kept
            # its suspicion from ever being raised). HEARD says "heard within the dead limit".
            node.links.vouch(subject, msg.stamp, now)
            node.suspicion.refuted(subject, now)
        node.pass_on(msg, except_conn=conn.id)

    def on_comm_verdict(self, conn: Conn, msg: wire.CommVerdict, now: float) -> None:
        if not self._seen.first_sight((msg.origin, msg.flood_id)):
            return
        verdict = StuckVerdict(
            msg.comm_hash, msg.op, msg.seq, msg.behind, msg.inside, msg.global_behind, msg.global_inside
        )
        if msg.stuck:
            self.node.sweeper.hold(verdict, now)
        else:
            self.node.sweeper.release(verdict.comm_hash, now, "counters moving again")
        self.node.pass_on(msg, except_conn=conn.id)
