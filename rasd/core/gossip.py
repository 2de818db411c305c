"""Table gossip: how every node comes to hold the same peer table and the same dead and departed lists.

Belongs here: merging entries into the table (``PEER_NEW`` for each new one, retiring the incarnations they
replace), passing new entries on as a diff, comparing the hashes a keepalive carries with our own and answering a
mismatch with the whole table (once per state of our hashes and that connection), and applying a table update.
This is NCCL's scheme with the departed list added (docs/architecture.md section 2.4). The hashes are computed in
``peers.py`` (the table) and ``verdicts.py`` (the dead and departed sets).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import wire
from .connections import Conn
from .events import Kind
from .peers import PeerInfo, PeerKey

if TYPE_CHECKING:
    from .node import Node


class Gossip:
    def __init__(self, node: Node) -> None:
        self.node = node

    def merge(self, peers: Iterable[PeerInfo], now: float, retire: bool = True) -> list[PeerInfo]:
        """Add entries to the table (PEER_NEW for each new one) and, unless the caller does it after applying
        dead and departed lists, retire the older incarnations at the addresses that got a new one."""
        node = self.node
        new = node.table.merge(peers)
        for p in new:
            node.emit(Kind.PEER_NEW, now, p)
        if retire and new:
            node.verdicts.retire({p.addr for p in new}, now)
        return new

    def spread(self, new: Iterable[PeerInfo], except_conn: int | None) -> None:
        """Pass entries new to us on, as a diff, to every other ready connection."""
        self.node.pass_on(wire.PeersUpdate(tuple(new), (), (), full=False), except_conn=except_conn)

    def sync(self, conn: Conn, peers_hash: int, dead_hash: int, now: float) -> None:
        """The peer's hashes differ from ours: send it our whole table, once per state of our hashes."""
        node = self.node
        mine = (node.table.hash, node.verdicts.dead_hash)
        if (peers_hash, dead_hash) != mine and conn.full_sent_for != mine:
            conn.full_sent_for = mine
            node.send(conn, self.full_update(), now)

    def full_update(self) -> wire.PeersUpdate:
        """Our whole table and our dead and departed lists."""
        node = self.node
        return wire.PeersUpdate(
            tuple(node.table.all_entries()),
            tuple(sorted(node.verdicts.dead, key=PeerKey.sort_key)),
            tuple(sorted(node.verdicts.left, key=PeerKey.sort_key)),
            full=True,
        )

    def on_keepalive(self, conn: Conn, msg: wire.Keepalive, now: float) -> None:
        conn.peer_wants = msg.wanted
        self.node.links.clocked(conn, msg.clock)
        self.sync(conn, msg.peers_hash, msg.dead_hash, now)

    def on_peers_update(self, conn: Conn, msg: wire.PeersUpdate, now: float) -> None:
        node = self.node
        verdicts = node.verdicts
        if node.me.key in msg.dead or node.me.key in msg.left:
            # The job holds us gone. Those we are still connected to were most likely cut off with us (a healed
            # partition's smaller side): pass the job's lists on so that they learn it now, then leave.
            node.pass_on(msg, except_conn=conn.id)
            node.expel(now)
            return
        # The lists first, then the rule that retires replaced incarnations: a replaced process that this update
        # lists as departed is recorded LEFT, not dead.
        new = self.merge(msg.peers, now, retire=False)
        changed = bool(new)
        for k in msg.left:
            if k not in verdicts.left and k not in verdicts.dead and node.table.knows(k):
                verdicts.mark_left(k, now)
                changed = True
        for k in msg.dead:
            if k not in verdicts.dead and node.table.knows(k):
                verdicts.declare_dead(k, now, None, flood=False)
                changed = True
        verdicts.retire({p.addr for p in new}, now)
        if node.expelled:
            return
        if new:
            self.spread(new, except_conn=conn.id)
        if changed:
            node.links.relink(now)
