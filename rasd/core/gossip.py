"""Table gossip: how every node comes to hold the same peer table and the same dead and departed lists.

Belongs here: merging entries into the table (``PEER_NEW`` for each new one, retiring the incarnations they
replace), passing new entries on as a diff, comparing the hashes a keepalive carries with our own and answering a
mismatch with the whole table (once per state of our hashes and that connection), and applying a table update.
The peer table itself lives here. This is NCCL's scheme with the departed list added (docs/architecture.md section
2.4). The hashes are computed in ``peers.py`` (the table) and ``verdicts.py`` (the dead and departed sets).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import wire
from .connections import Conn
from .effects import Broadcast, Dead, Effects, Expel, Left, Notify, Relink, Retire, Say
from .events import Kind
from .peers import PeerInfo, PeerKey, PeerTable

if TYPE_CHECKING:
    from .view import World


class Gossip:
    def __init__(self, world: World, me: PeerInfo) -> None:
        self.world = world
        self.table = PeerTable()
        self.table.merge([me])
        #: Our (table, dead) hashes when we last sent our whole table on each connection (by id).
        self._full_sent_for: dict[int, tuple[int, int]] = {}
        #: New entries waiting to be passed on, each with the connection it came from (None: not from the mesh), and
        #: when entries were last passed on: in a storm of joins, diffs go out at most once a tick (``spread``).
        self._pending: list[tuple[PeerInfo, int | None]] = []
        self._spread_at = -math.inf
        #: Our (table, dead) hashes as last seen by ``sync``, and since when: a node still changing is in flux.
        self._mine = (0, 0)
        self._changed_at = -math.inf

    def adopt(self, table: PeerTable) -> None:
        """Start from a whole table (the simulator's start of thousands of nodes that have all heard of each other)."""
        self.table = table

    def merge(self, peers: Iterable[PeerInfo], now: float, retire: bool = True) -> tuple[list[PeerInfo], Effects]:
        """Add entries to the table: the new ones, and PEER_NEW for each; unless the caller does it after applying
        dead and departed lists, the older incarnations at the addresses that got a new one are retired."""
        new = self.table.merge(peers)
        out: Effects = [Notify(Kind.PEER_NEW, p.key) for p in new]
        if retire and new:
            out.append(Retire(frozenset(p.addr for p in new)))
        return new, out

    def merged(
        self, peers: Iterable[PeerInfo], spread: bool, except_conn: int | None, relink: bool, now: float
    ) -> Effects:
        """Entries for the table from a handshake or the bootstrap: if any is new, it is passed on (``spread``) and
        the links are recomputed (``relink``)."""
        new, out = self.merge(peers, now)
        if new:
            if spread:
                out += self.spread(new, except_conn, now)
            if relink:
                out.append(Relink())
        return out

    def spread(self, new: list[PeerInfo], except_conn: int | None, now: float) -> Effects:
        """Pass entries new to us on, as a diff, to every other ready connection: at once if nothing went out in the
        last tick, else with the others at the next tick (``flush``). A job of N processes starting at once would
        otherwise send every entry as a message of its own on every connection: O(N) messages per node, where
        batching sends one per connection per tick (docs/architecture.md §11)."""
        if not self._pending and now - self._spread_at >= self.world.timers.tick:
            self._spread_at = now
            return [Broadcast(wire.PeersUpdate(tuple(new), (), (), full=False), except_conn)]
        self._pending += [(p, except_conn) for p in new]
        return []

    def flush(self, now: float) -> Effects:
        """A tick: pass on the entries that waited, one diff per connection, without the ones it brought us."""
        if not self._pending:
            return []
        pending, self._pending = self._pending, []
        self._spread_at = now
        sources = {source for _, source in pending}
        if len(sources) == 1:
            return [Broadcast(wire.PeersUpdate(tuple(p for p, _ in pending), (), (), full=False), sources.pop())]
        out: Effects = []
        for conn in self.world.ready_conns():
            entries = tuple(p for p, source in pending if source != conn.id)
            if entries:
                out.append(Say(conn.id, wire.PeersUpdate(entries, (), (), full=False)))
        return out

    def sync(self, conn: Conn, peers_hash: int, dead_hash: int, now: float) -> Effects:
        """The peer's hashes differ from ours: send it our whole table, once per state of our hashes. While our own
        table is still changing (a storm of joins), only once per connection: the diffs we pass on carry what is
        new, and the whole table follows once we have been still for a keepalive interval."""
        mine = (self.table.hash, self.world.dead_hash)
        if mine != self._mine:
            self._mine, self._changed_at = mine, now
        if (peers_hash, dead_hash) == mine:
            return []
        sent = self._full_sent_for.get(conn.id)
        if sent == mine or (sent is not None and now - self._changed_at < self.world.timers.keepalive):
            return []
        self._full_sent_for[conn.id] = mine
        return [Say(conn.id, self.full_update())]

    def full_update(self) -> wire.PeersUpdate:
        """Our whole table and our dead and departed lists."""
        world = self.world
        return wire.PeersUpdate(
            tuple(self.table.all_entries()),
            tuple(sorted(world.dead, key=PeerKey.sort_key)),
            tuple(sorted(world.left, key=PeerKey.sort_key)),
            full=True,
        )

    def send_table(self, conn_id: int) -> Effects:
        return [Say(conn_id, self.full_update())]

    def forget_conn(self, conn_id: int) -> None:
        self._full_sent_for.pop(conn_id, None)

    def on_keepalive(self, conn: Conn, msg: wire.Keepalive, now: float) -> Effects:
        return self.sync(conn, msg.peers_hash, msg.dead_hash, now)

    def on_peers_update(self, conn: Conn, msg: wire.PeersUpdate, now: float) -> Effects:
        world = self.world
        me = world.me.key
        if me in msg.dead or me in msg.left:
            # The job holds us gone. Those we are still connected to were most likely cut off with us (a healed
            # partition's smaller side): pass the job's lists on so that they learn it now, then leave.
            return [Broadcast(msg, conn.id), Expel()]
        # The lists first, then the rule that retires replaced incarnations: a replaced process that this update
        # lists as departed is recorded LEFT, not dead.
        new, out = self.merge(msg.peers, now, retire=False)
        changed = bool(new)
        dead, left = world.dead, world.left
        for k in msg.left:
            if k not in left and k not in dead and self.table.knows(k):
                out.append(Left(k))
                changed = True
        for k in msg.dead:
            if k not in dead and self.table.knows(k):
                out.append(Dead(k, None, flood=False))
                changed = True
        out.append(Retire(frozenset(p.addr for p in new)))
        # After an expulsion (a retire of our own address) there is no connection left to pass anything on to, and
        # an expelled node links nothing.
        if new:
            out += self.spread(new, conn.id, now)
        if changed:
            out.append(Relink())
        return out
