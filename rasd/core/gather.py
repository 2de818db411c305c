"""Gathers: a status query floods a request over the mesh and folds the replies back up the tree it made.

Belongs here: the gathers in progress (``Gather``), their ids, the memory of finished ones, which connections a
gather may use, answering duplicates, counting leg timeouts (a leg that closes or goes silent, the collective
timeout, the hard limit) and, at the root, turning what was gathered into a ``JobSnapshot``. NCCL's scheme
(docs/architecture.md section 4): duplicates answered empty, a quiet leg counted as a timeout, a hard limit of
timeout + ``gather_extra``. The sweeper's gathers end in ``sweeper.py``; a client's end in a ``GatherDone``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import wire
from .actions import GatherDone
from .comms import ProcessData
from .connections import Conn, ConnState
from .peers import Addr
from .recent import Recent
from .snapshot import JobSnapshot
from .suspicion import REACH_QUERY
from .sweeper import SWEEP_QUERY

if TYPE_CHECKING:
    from .node import Node


@dataclass
class Gather:
    root: Addr
    coll_id: int
    from_conn: int | None  # None at the root
    query_id: int
    started: float
    timeout: float | None
    pending: set[int]
    entries: list[tuple[Addr, ProcessData]]
    leg_timeouts: int = 0

    @property
    def key(self) -> tuple[Addr, int]:
        return (self.root, self.coll_id)


class Gathering:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.gathers: dict[tuple[Addr, int], Gather] = {}
        self._done: Recent[tuple[Addr, int]] = Recent()
        self._next_id = 1

    def contribution(self) -> ProcessData:
        """What this process adds to a gather: its communicators, once it has restarted its restarts, and whether
        it waits to be admitted into training."""
        node = self.node
        data = node.local_data()
        if node.restart is not None and data.restart is None:
            data = dataclasses.replace(data, restart=node.restart)
        if node.waiting and not data.waiting:
            data = dataclasses.replace(data, waiting=True)
        return data

    def _open(self, g: Gather, request: wire.CollReq, now: float) -> None:
        """Record ``g`` and forward the request on every connection a gather may use (not back where it came
        from); a gather with nobody to wait on ends at once."""
        self.gathers[g.key] = g
        usable = self._usable(now, except_conn=g.from_conn)
        frame = wire.encode(request) if usable else b""
        for c in usable:
            self.node.send_encoded(c, frame, now)
            g.pending.add(c.id)
        self._maybe_finish(g, now)

    def start(self, query_id: int, now: float, timeout: float | None) -> None:
        """A gather rooted here. ``timeout``: None for the default, ``inf`` for none."""
        node = self.node
        if timeout is None:
            timeout = node.timers.leg_timeout
        coll_id = self._next_id
        self._next_id += 1
        g = Gather(
            root=node.me.addr,
            coll_id=coll_id,
            from_conn=None,
            query_id=query_id,
            started=now,
            timeout=None if timeout == float("inf") else timeout,
            pending=set(),
            entries=[(node.me.addr, self.contribution())],
        )
        # The wire carries a u32 of milliseconds (49.7 days): a longer client TIMEOUT is clamped, never raised.
        timeout_ms = 0 if g.timeout is None else max(1, min(int(g.timeout * 1000), 0xFFFFFFFF))
        self._open(g, wire.CollReq(g.root, g.coll_id, timeout_ms), now)

    def _usable(self, now: float, except_conn: int | None) -> list[Conn]:
        """Connections a gather may use: ready, in use by a link, and not silent."""
        node = self.node
        out = []
        for c in node.connections.ready(except_conn):
            if c.peer is None:
                continue
            in_use = c.peer in node.links.contacts or c.peer_wants
            if in_use and now - c.last_recv <= node.timers.unresponsive and not node.links.is_delayed(c.peer):
                out.append(c)
        return out

    def on_collreq(self, conn: Conn, msg: wire.CollReq, now: float) -> None:
        key = (msg.root, msg.coll_id)
        if key in self.gathers or key in self._done:
            self.node.send(conn, wire.CollResp(msg.root, msg.coll_id, 0, ()), now)
            return
        g = Gather(
            root=msg.root,
            coll_id=msg.coll_id,
            from_conn=conn.id,
            query_id=0,
            started=now,
            timeout=None if msg.timeout_ms == 0 else msg.timeout_ms / 1000,
            pending=set(),
            entries=[(self.node.me.addr, self.contribution())],
        )
        self._open(g, msg, now)

    def on_collresp(self, conn: Conn, msg: wire.CollResp, now: float) -> None:
        g = self.gathers.get((msg.root, msg.coll_id))
        if g is None or conn.id not in g.pending:
            return
        g.pending.discard(conn.id)
        g.leg_timeouts += msg.leg_timeouts
        g.entries.extend(msg.entries)
        self._maybe_finish(g, now)

    def _maybe_finish(self, g: Gather, now: float, force: bool = False) -> None:
        if g.pending and not force:
            return
        node = self.node
        g.leg_timeouts += len(g.pending)
        g.pending.clear()
        self.gathers.pop(g.key, None)
        self._done.remember(g.key)
        if g.from_conn is None:
            snap = self._snapshot(g, now)
            if g.query_id == SWEEP_QUERY:
                node.sweeper.swept(snap, now)
            elif g.query_id == REACH_QUERY:
                node.suspicion.reached(snap, now)
            else:
                node.act(GatherDone(g.query_id, snap))
        else:
            back = node.connections.get(g.from_conn)
            if back is not None and back.state is ConnState.READY:
                node.send(back, wire.CollResp(g.root, g.coll_id, g.leg_timeouts, tuple(g.entries)), now)

    def _snapshot(self, g: Gather, now: float) -> JobSnapshot:
        """What the root knows when its gather ends."""
        node = self.node
        responses: dict[Addr, ProcessData] = {}
        for addr, data in g.entries:
            responses.setdefault(addr, data)
        dead, left = node.verdicts.dead, node.verdicts.left
        former = node.table.former()
        return JobSnapshot(
            peers=tuple(node.table),
            dead=frozenset(k.addr for k in dead if node.table.is_current(k)),
            left=frozenset(k.addr for k in left if node.table.is_current(k)),
            former_dead=tuple(p for p in former if p.key in dead),
            former_left=tuple(p for p in former if p.key in left and p.key not in dead),
            responses=responses,
            timeouts=g.leg_timeouts,
            collection_time=now - g.started,
            stuck=node.sweeper.standing(),
            in_flight_grace=node.timers.in_flight,
        )

    def purge(self, conn_id: int, now: float) -> None:
        """A connection went silent or away: count it as a leg timeout wherever a gather waits on it."""
        for key, g in list(self.gathers.items()):
            if g.from_conn == conn_id:
                del self.gathers[key]  # nobody left to answer to
                self._done.remember(key)
            elif conn_id in g.pending:
                g.pending.discard(conn_id)
                g.leg_timeouts += 1
                self._maybe_finish(g, now)

    def finish_all(self, now: float) -> None:
        """This node was expelled: its own gathers end at once with what they have; the others are dropped."""
        for g in list(self.gathers.values()):
            if g.from_conn is None:
                self._maybe_finish(g, now, force=True)
        self.gathers.clear()

    def tick(self, now: float) -> None:
        node = self.node
        for g in list(self.gathers.values()):
            # A leg whose connection has gone silent is answered by nobody: count it now (NCCL purges a delayed
            # connection from its collectives), whether or not the connection is one of our links.
            for cid in list(g.pending):
                c = node.connections.get(cid)
                if c is not None and c.state is ConnState.READY and now - c.last_recv > node.timers.unresponsive:
                    self.purge(cid, now)
            if g.timeout is None or g.key not in self.gathers:
                continue
            if now >= g.started + g.timeout + node.timers.gather_extra:
                self._maybe_finish(g, now, force=True)
            elif now >= g.started + g.timeout:
                for cid in list(g.pending):
                    c = node.connections.get(cid)
                    if (
                        c is None
                        or c.state is not ConnState.READY
                        or (c.peer is not None and node.links.is_delayed(c.peer))
                    ):
                        g.pending.discard(cid)
                        g.leg_timeouts += 1
                self._maybe_finish(g, now)
