"""The RAS node: the one facade the drivers hold, composing the mesh's rules from their own modules.

Belongs here: the node's inputs (each takes the current time and returns the actions the driver must carry out, in
order), the queries the drivers and tests read, and the few services every concept shares (sending, emitting,
passing a message on, dropping a connection, expelling this node). Every rule of the mesh lives in its own module
with its own small state; the runtime (``rasd/net/runtime.py``) and the simulator (``rasd/sim/network.py``) only
carry bytes and time in and out::

    driver                                   Node
      accepted / connected / received  --->  (state changes)  ---> [Send, Connect, Close, Emit, ...]
      closed / connect_failed / tick   --->
      start_gather / leave / pid_gone  --->

Where each rule lives (docs/architecture.md, "Where each rule lives"):

    connections.py  the connection records and ids          handshake.py  HELLO .. CONNINITACK, as a table
    links.py        contacts, relinking, connecting,        liveness.py   the liveness ladder, as a table
                    keepalives, applying the ladder         ring.py       which peers to link (pure)
    verdicts.py     dead, left, hung; fast death; retiring  floods.py     flood ids, dedup, passing verdicts on
    gossip.py       table merges, hashes, updates           gather.py     status gathers and their snapshot
    reunion.py      a healed partition: the smaller side     suspicion.py  silence deaths decided with a
                    leaves                                                 reachability gather
    sweeper.py      the stuck sweeper, COMM_STUCK verdicts  stuck.py      whether a communicator is stuck (pure)
    actions.py      what the node asks its driver to do     snapshot.py   a gather's result, and its one merge

A *paused* node (its thread starved, or SIGSTOP) does not blame its peers for its own silence: a long gap between
ticks moves every silence clock forward by the gap (``_forgive_pause``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from . import wire
from .actions import Action, Close, Connect, Emit, GatherDone, ProbePid, Send
from .comms import ProcessData, RestartRecord, next_restart
from .config import Timers
from .connections import MAX_PENDING_CONNS, Conn, Connections, ConnState
from .events import Event, Kind
from .floods import Floods
from .gather import Gather, Gathering
from .gossip import Gossip
from .handshake import Handshake
from .links import Links
from .liveness import Contact
from .peers import Addr, PeerInfo, PeerKey, PeerTable
from .reunion import Reunion
from .stuck import StuckVerdict
from .suspicion import Suspicion
from .sweeper import Sweeper
from .verdicts import Verdicts

#: The drivers import the actions and the connection types from here, with the node (``from rasd.core import node``).
__all__ = [
    "Action",
    "Close",
    "Conn",
    "ConnState",
    "Connect",
    "Emit",
    "GatherDone",
    "MAX_PENDING_CONNS",
    "Node",
    "ProbePid",
    "Send",
]


class Node:
    def __init__(
        self,
        info: PeerInfo,
        secret: bytes,
        timers: Timers = Timers(),
        rng: random.Random | None = None,
        local_data: Callable[[], ProcessData] = ProcessData,
        express_links: bool = True,
    ) -> None:
        self.me = info
        self.secret = secret
        self.timers = timers
        self.rng = rng or random.SystemRandom()
        self.local_data = local_data
        self.express_links = express_links
        self.table = PeerTable()
        self.table.merge([info])
        self.expelled = False
        self.leaving = False
        #: This process's in-process restarts (``restarted``), contributed to every gather.
        self.restart: RestartRecord | None = None
        #: This process waits to be admitted into training (``rasd.record_waiting``): reports mark it WAITING.
        self.waiting = False
        # The concepts, each with its own state (the module docstrings say what belongs in each).
        self.connections = Connections()
        self.verdicts = Verdicts(self)
        self.links = Links(self)
        self.handshake = Handshake(self)
        self.floods = Floods(self)
        self.gossip = Gossip(self)
        self.gathering = Gathering(self)
        self.sweeper = Sweeper(self)
        self.reunion = Reunion(self)
        self.suspicion = Suspicion(self)
        #: What a READY connection may carry, and which concept takes it.
        self._ready_handlers: dict[type, Callable[[Conn, Any, float], None]] = {
            wire.Keepalive: self.gossip.on_keepalive,
            wire.PeersUpdate: self.gossip.on_peers_update,
            wire.Flood: self.floods.on_flood,
            wire.CollReq: self.gathering.on_collreq,
            wire.CollResp: self.gathering.on_collresp,
            wire.CommVerdict: self.floods.on_comm_verdict,
        }
        self._last_tick: float | None = None
        self.now = 0.0  # the time of the input being handled, for services that send or close
        self._out: list[Action] = []

    # ------------------------------------------------------------------------------------------------------------
    # Inputs

    def start(self, now: float) -> list[Action]:
        self.now = now
        self.emit(Kind.PEER_NEW, now, self.me)
        self._last_tick = now
        self.sweeper.start(now)
        return self._flush()

    def add_peers(self, peers: list[PeerInfo], now: float, introduce: bool = False) -> list[Action]:
        """Peers learnt outside the mesh (the bootstrap store, a communicator's members). ``introduce``: connect to
        them at once whatever the address order (bootstrap seeds do not know this node yet; the connection tells
        them, and gossip tells the rest of the job)."""
        self.now = now
        if not self.expelled:
            new = self.gossip.merge(peers, now)
            if new:
                self.gossip.spread(new, except_conn=None)
            self.links.relink(now)
            if introduce:
                self.links.introduce(peers, now)
            self.links.connect_due(now)
        return self._flush()

    def adopt_table(self, table: PeerTable, now: float) -> list[Action]:
        """Start from a whole peer table that lists this node, without a PEER_NEW event per peer: the simulator's
        way to start thousands of nodes that have all heard of each other (one sort and hash for all of them)."""
        self.now = now
        if self.me.addr not in table or self.expelled:
            raise ValueError("the adopted table must list this node")
        self.table = table
        self.links.relink(now)
        self.links.connect_due(now)
        return self._flush()

    def accepted(self, conn_id: int, now: float) -> list[Action]:
        """A new incoming TCP connection (``conn_id`` chosen by the driver, negative by convention)."""
        self.now = now
        if self.expelled or self.leaving:
            self._out.append(Close(conn_id))
            return self._flush()
        oldest = self.connections.oldest_pending_incoming()
        if oldest is not None:
            self.drop_conn(oldest.id)
        self.connections.open_incoming(conn_id, now)
        return self._flush()

    def connected(self, conn_id: int, now: float) -> list[Action]:
        """An outgoing connection reached the peer: start the handshake."""
        self.now = now
        conn = self.connections.get(conn_id)
        if conn is None:
            self._out.append(Close(conn_id))
        else:
            self.handshake.connected(conn, now)
        return self._flush()

    def connect_failed(self, conn_id: int, now: float, refused: bool) -> list[Action]:
        self.now = now
        conn = self.connections.pop(conn_id)
        contact = self.links.retry(conn, now) if conn is not None else None
        if contact is not None and refused:
            self.verdicts.refused(contact.key, contact.lost_connection, now)
        return self._flush()

    def closed(self, conn_id: int, now: float) -> list[Action]:
        """The peer closed the connection (EOF or reset)."""
        self.now = now
        conn = self.connections.pop(conn_id)
        if conn is not None:
            self.gathering.purge(conn_id, now)
            if conn.peer is not None and conn.state is ConnState.READY:
                self.links.lost(conn, now, "peer closed connection during receive operation")
            elif conn.peer is not None:
                # Closed by the acceptor before it was ready (its handshake timer, its pending limit): retry as after
                # a failed connect, or the contact would wait on a connection that no longer exists until the dead
                # limit declares a live peer dead.
                contact = self.links.retry(conn, now)
                if contact is not None:
                    contact.lost_connection = True  # a refused reconnect now means the peer is gone
                    self.verdicts.probe_if_local(conn.peer)
            self.links.connect_due(now)
        return self._flush()

    def pid_gone(self, addr: Addr, now: float) -> list[Action]:
        """The driver checked a ``ProbePid``: that process no longer exists. The verdict is about the incarnation
        the probe asked about; if a newer one holds the address by now, that one is not touched."""
        self.now = now
        self.verdicts.pid_gone(addr, now)
        return self._flush()

    def received(self, conn_id: int, data: bytes, now: float) -> list[Action]:
        self.now = now
        conn = self.connections.get(conn_id)
        if conn is None:
            return self._flush()
        if conn.state is ConnState.READY and data:
            # Any bytes are proof of life, a whole frame or not (NCCL's lastRecvTime): a large frame crawling over a
            # slow link comes from a peer that speaks (tests/unit/core/test_frame_arriving.py).
            conn.last_recv = now
            self.links.heard(conn, now)
        try:
            for msg in conn.reader.feed(data):
                if conn_id not in self.connections.by_id:
                    break
                self._on_message(conn, msg, now)
        except wire.ProtocolError:
            self.drop_conn(conn_id)
        return self._flush()

    def tick(self, now: float) -> list[Action]:
        self.now = now
        if self.expelled:
            return self._flush()
        if self._last_tick is not None:
            gap = now - self._last_tick
            if gap > max(3 * self.timers.tick, 2 * self.timers.keepalive):
                self._forgive_pause(gap - self.timers.tick)
        self._last_tick = now
        self.handshake.timeouts(now)
        self.links.climb(now)
        self.verdicts.expire_hung(now)
        self.sweeper.tick(now)
        self.sweeper.expire(now)
        self.links.connect_due(now)
        self.links.keepalives(now)
        self.links.close_idle(now)
        self.reunion.probe_due(now)
        self.suspicion.tick(now)
        self.gathering.tick(now)
        return self._flush()

    def start_gather(self, query_id: int, now: float, timeout: float | None = None) -> list[Action]:
        """Start a status gather rooted here. ``timeout``: the collective timeout in seconds (None: the default;
        ``float('inf')``: no collective timeout). Ends with a ``GatherDone`` action."""
        self.now = now
        self.gathering.start(query_id, now, timeout)
        return self._flush()

    def restarted(
        self, iteration: int, cause: str, terminated: tuple[int, ...], seconds_lost: float, now: float
    ) -> list[Action]:
        """A local notification: this process's training restarted in place (``rasd.record_restart``, called by
        inprocess.Wrapper). The node keeps the summary it contributes to gathers and emits RESTART to its own
        subscribers. Nothing goes over the mesh: every rank of the job restarts and its own node tells its own
        clients, and gathers carry the summaries job-wide. A repeat of the last iteration is ignored."""
        self.now = now
        record = next_restart(self.restart, iteration, cause, terminated, seconds_lost)
        if record is not None:
            self.restart = record
            self.act_emit(
                Event(
                    kind=Kind.RESTART,
                    at=now,
                    addr=self.me.addr,
                    peer=self.me,
                    details=record.describe(),
                    ranks=record.terminated,
                    restart=record,
                )
            )
        return self._flush()

    def set_waiting(self, waiting: bool, now: float) -> list[Action]:
        """A local notification: this process joined a running job and waits for the next rendezvous round (True),
        or was admitted, or gave up (False). Its contribution to gathers says so; nothing else changes."""
        self.now = now
        self.waiting = bool(waiting)
        return self._flush()

    def leave(self, now: float) -> list[Action]:
        """Say goodbye: every peer records this process as LEFT, not dead. Closes every connection."""
        self.now = now
        if not self.expelled and not self.leaving:
            self.leaving = True
            self.pass_on(self.floods.verdict(wire.FloodKind.LEFT, self.me.key), except_conn=None)
        for cid in list(self.connections.by_id):
            self.drop_conn(cid)
        self.links.contacts.clear()
        return self._flush()

    # ------------------------------------------------------------------------------------------------------------
    # Queries (for the drivers and tests)

    @property
    def conns(self) -> dict[int, Conn]:
        return self.connections.by_id

    @property
    def contacts(self) -> dict[Addr, Contact]:
        return self.links.contacts

    @property
    def gathers(self) -> dict[tuple[Addr, int], Gather]:
        return self.gathering.gathers

    @property
    def dead(self) -> set[PeerKey]:
        return self.verdicts.dead

    @property
    def left(self) -> set[PeerKey]:
        return self.verdicts.left

    @property
    def hung(self) -> dict[PeerKey, float]:
        return self.verdicts.hung

    @property
    def stuck(self) -> dict[int, tuple[StuckVerdict, float]]:
        return self.sweeper.stuck

    @property
    def dead_hash(self) -> int:
        return self.verdicts.dead_hash

    def link_peers(self) -> set[Addr]:
        return set(self.links.contacts)

    def live_peers(self) -> list[PeerInfo]:
        """The current entry of every address whose process is neither dead nor departed."""
        return [p for p in self.table if not self.verdicts.gone(p.key)]

    def is_dead(self, addr: Addr) -> bool:
        """Whether the process that holds ``addr`` now (the newest incarnation known there) is dead."""
        p = self.table.get(addr)
        return p is not None and p.key in self.verdicts.dead

    def has_left(self, addr: Addr) -> bool:
        """Whether the process that holds ``addr`` now left the job cleanly."""
        p = self.table.get(addr)
        return p is not None and p.key in self.verdicts.left

    def left_addresses(self) -> set[Addr]:
        """The addresses whose current process left the job (the job summary leaves them out)."""
        return {k.addr for k in self.verdicts.left if self.table.is_current(k)}

    def is_unresponsive(self, addr: Addr) -> bool:
        return self.links.is_delayed(addr)

    # ------------------------------------------------------------------------------------------------------------
    # Messages

    def _on_message(self, conn: Conn, msg: wire.Message, now: float) -> None:
        conn.last_recv = now
        if conn.state in (ConnState.AUTH, ConnState.INIT):
            self.handshake.on_message(conn, msg, now)
            return
        self.links.heard(conn, now)
        handler = self._ready_handlers.get(type(msg))
        if handler is None:
            raise wire.ProtocolError(f"unexpected {type(msg).__name__} on a ready connection")
        handler(conn, msg, now)

    def _forgive_pause(self, gap: float) -> None:
        """This node did not run for ``gap`` seconds: its peers' silence over that time is not their fault."""
        self.verdicts.forgive(gap)
        self.suspicion.forgive(gap)
        self.sweeper.forgive(gap)
        self.links.forgive(gap)
        self.connections.forgive(gap)

    # ------------------------------------------------------------------------------------------------------------
    # Services for the concept modules (not for drivers)

    def connect(self, addr: Addr, now: float) -> Conn:
        """Open a new outgoing connection to ``addr``."""
        conn = self.connections.open_outgoing(addr, now)
        self._out.append(Connect(conn.id, addr))
        return conn

    def send(self, conn: Conn, msg: wire.Message, now: float) -> None:
        self.send_encoded(conn, wire.encode(msg), now)

    def send_encoded(self, conn: Conn, frame: bytes, now: float) -> None:
        """Send a frame already encoded (``wire.encode``): one message to many connections is encoded once."""
        conn.last_send = max(conn.last_send, now)
        self._out.append(Send(conn.id, frame))

    def pass_on(self, msg: wire.Message, except_conn: int | None) -> None:
        """Send ``msg`` on every ready connection but ``except_conn``."""
        ready = self.connections.ready(except_conn)
        if ready:
            frame = wire.encode(msg)
            for c in ready:
                self.send_encoded(c, frame, self.now)

    def drop_conn(self, conn_id: int, replaced: bool = False) -> None:
        """Close a connection. ``replaced``: another connection to that peer takes over its contact."""
        conn = self.connections.pop(conn_id)
        if conn is None:
            return
        self._out.append(Close(conn_id))
        self.links.detach(conn, replaced, self.now)
        self.gathering.purge(conn_id, self.now)

    def emit(self, kind: Kind, now: float, peer: PeerInfo | None, details: str = "") -> None:
        self.act_emit(Event(kind=kind, at=now, addr=peer.addr if peer else None, peer=peer, details=details))

    def act_emit(self, event: Event) -> None:
        self._out.append(Emit(event))

    def act(self, action: Action) -> None:
        self._out.append(action)

    def probe(self, peer: PeerInfo) -> None:
        self._out.append(ProbePid(peer.addr, peer.pid))

    def expel(self, now: float, why: str = "this process was declared dead by the job") -> None:
        """The job has declared this process dead. It can never rejoin: stop taking part."""
        if self.expelled:
            return
        self.expelled = True
        self.emit(Kind.PEER_DEAD, now, self.me, why)
        for cid in list(self.connections.by_id):
            self.drop_conn(cid)
        self.links.contacts.clear()
        self.gathering.finish_all(now)

    def _flush(self) -> list[Action]:
        out, self._out = self._out, []
        return out
