"""The node's TCP connections as it sees them: one record per connection, and the table of them.

Belongs here: the connection record (``Conn``), its states (``ConnState``), the connection ids, and the lookups
the other concepts need (the connection to an address, the ready ones, the pending incoming ones). What a
connection is *for* lives elsewhere: the handshake that makes it READY in ``handshake.py``, the links that use
it in ``links.py``. A connection is about an address, not a process: it reaches whoever listens there now
(docs/architecture.md section 2.6), and learns the process's incarnation from the handshake.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from . import wire
from .peers import Addr

#: At most this many connections may be unauthenticated at once; the oldest is dropped to make room.
MAX_PENDING_CONNS = 64


class ConnState(enum.Enum):
    CONNECTING = "connecting"  # outgoing, TCP not yet up
    AUTH = "auth"  # challenge-response in progress
    INIT = "init"  # authenticated, waiting for CONNINIT (incoming) or CONNINITACK (outgoing)
    READY = "ready"


@dataclass
class Conn:
    id: int
    outgoing: bool
    opened_at: float
    peer: Addr | None = None
    incarnation: int | None = None  # the peer process's, once its CONNINIT or CONNINITACK named it
    state: ConnState = ConnState.AUTH
    reader: wire.FrameReader = field(default_factory=wire.FrameReader)
    last_recv: float = 0.0
    last_send: float = 0.0


class Connections:
    """Every connection of the node by id. Outgoing ids count up from 1; the driver picks incoming ones (negative by
    convention)."""

    def __init__(self) -> None:
        self.by_id: dict[int, Conn] = {}
        self._next_id = 1

    def __iter__(self) -> Iterator[Conn]:
        return iter(list(self.by_id.values()))

    def get(self, conn_id: int | None) -> Conn | None:
        return self.by_id.get(conn_id) if conn_id is not None else None

    def pop(self, conn_id: int) -> Conn | None:
        return self.by_id.pop(conn_id, None)

    def open_outgoing(self, addr: Addr, now: float) -> Conn:
        """A new outgoing connection to ``addr``, not yet connected (the caller emits the ``Connect``)."""
        conn = Conn(
            id=self._next_id,
            outgoing=True,
            opened_at=now,
            peer=addr,
            state=ConnState.CONNECTING,
            last_recv=now,
            last_send=now,
        )
        self._next_id += 1
        self.by_id[conn.id] = conn
        return conn

    def open_incoming(self, conn_id: int, now: float) -> Conn:
        conn = Conn(id=conn_id, outgoing=False, opened_at=now, last_recv=now, last_send=now)
        self.by_id[conn_id] = conn
        return conn

    def oldest_pending_incoming(self) -> Conn | None:
        """When ``MAX_PENDING_CONNS`` incoming connections are still in their handshake: the oldest of them."""
        pending = sorted(
            (c for c in self.by_id.values() if c.state in (ConnState.AUTH, ConnState.INIT) and not c.outgoing),
            key=lambda c: c.opened_at,
        )
        return pending[0] if len(pending) >= MAX_PENDING_CONNS else None

    def to(self, addr: Addr, exclude: int | None = None) -> Conn | None:
        """The first connection to ``addr`` (any state), other than ``exclude``."""
        for c in self.by_id.values():
            if c.peer == addr and c.id != exclude:
                return c
        return None

    def ready(self, except_conn: int | None = None) -> list[Conn]:
        return [c for c in self.by_id.values() if c.id != except_conn and c.state is ConnState.READY]

    # --- what happens to a connection (the node calls these as its inputs and the handshake's effects say) ---------

    def connected(self, conn: Conn, now: float) -> None:
        """Our outgoing connection is up: its challenge-response starts."""
        conn.state = ConnState.AUTH
        conn.last_recv = now

    def authenticated(self, conn_id: int) -> None:
        """The connection passed the challenge-response: whole frames may come now."""
        conn = self.by_id.get(conn_id)
        if conn is not None:
            conn.state = ConnState.INIT
            conn.reader.max_frame = wire.MAX_FRAME

    def reaches(self, conn_id: int, incarnation: int | None) -> None:
        """The connection reaches this incarnation of its peer."""
        conn = self.by_id.get(conn_id)
        if conn is not None:
            conn.incarnation = incarnation

    def ready_for(self, conn_id: int, peer: Addr, incarnation: int | None) -> None:
        """The handshake is over: the connection is a link to ``peer``'s ``incarnation``."""
        conn = self.by_id.get(conn_id)
        if conn is not None:
            conn.peer = peer
            conn.incarnation = incarnation
            conn.state = ConnState.READY

    def forgive(self, gap: float) -> None:
        """The node did not run for ``gap`` seconds: no connection is to blame for that silence."""
        for conn in self.by_id.values():
            conn.last_recv += gap
            conn.opened_at += gap
