"""The handshake: how a TCP connection becomes a READY link between two members of one job.

Belongs here: every message a connection may receive before it is READY, as one table (``HANDSHAKE``), the
handlers it names, and the handshake time limit. The acceptor and the connector follow the same table; which role
(``ConnRole``) this node plays on a connection is ``Conn.outgoing``. Theory of operation (docs/architecture.md
sections 2.3 and 3.1)::

    connector                                   acceptor
      HELLO(magic, nc)             ------>                                     (AUTH)
                                   <------      CHALLENGE(na, MAC_acceptor)
      checks the acceptor's MAC
      PROOF(MAC_connector)         ------>      checks the connector's MAC     (AUTH -> INIT)
      CONNINIT(record, hashes,     ------>      [PEERSUPDATE] YOU_ARE_DEAD |    (INIT -> READY)
               a probe's side)                  DUPLICATE | OUTNUMBERED | MEASURE | OK
                                   <------      CONNINITACK(nack, record)

Until a connection is authenticated only the message the table expects next is accepted, and a frame may be at
most ``wire.PREAUTH_MAX_FRAME`` bytes; anything else is a ``wire.ProtocolError`` and the node drops the connection.
A connection not READY after ``Timers.handshake`` is dropped (and retried by its contact). Simultaneous connects:
the connection the lower address opened survives, on both sides, unless the existing one is READY but silent.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import auth, wire
from .connections import Conn, ConnState
from .effects import (
    Attach,
    Authenticated,
    Broadcast,
    Confirm,
    Drop,
    Effects,
    Expel,
    Incarnation,
    Judge,
    Left,
    MeasureAgain,
    Merge,
    Notify,
    Outnumbered,
    ProbeAnswered,
    ProbeMet,
    Ready,
    Say,
    SendConnInit,
    SendTable,
    Sync,
)
from .events import Kind

if TYPE_CHECKING:
    from .view import World


class ConnRole(enum.Enum):
    """Which end of a connection this node is: the connector dialled it, the acceptor took it."""

    CONNECTOR = True  # Conn.outgoing
    ACCEPTOR = False


Handler = Callable[["Handshake", Conn, Any, float], Effects]


class Handshake:
    def __init__(self, world: World) -> None:
        self.world = world
        #: The nonces of each connection in its challenge-response (by id): ours, and the peer's once it sent one.
        self._nonces: dict[int, tuple[bytes, bytes]] = {}

    def connected(self, conn: Conn, now: float) -> Effects:
        """Our outgoing connection is up: the connector speaks first."""
        mine = self.world.random_bytes(wire.NONCE_LEN)
        self._nonces[conn.id] = (mine, b"")
        return [Say(conn.id, wire.Hello(mine))]

    def on_message(self, conn: Conn, msg: wire.Message, now: float) -> Effects:
        """A message on a connection in AUTH or INIT: the one the table expects, or a protocol error."""
        handler = HANDSHAKE.get((ConnRole(conn.outgoing), conn.state, type(msg)))
        if handler is None:
            stage = "during authentication" if conn.state is ConnState.AUTH else "before CONNINIT"
            raise wire.ProtocolError(f"unexpected {type(msg).__name__} {stage}")
        return handler(self, conn, msg, now)

    def forget_conn(self, conn_id: int) -> None:
        self._nonces.pop(conn_id, None)

    # --- authentication ----------------------------------------------------------------------------------------

    def _hello(self, conn: Conn, msg: wire.Hello, now: float) -> Effects:
        if conn.id in self._nonces:
            raise wire.ProtocolError("unexpected Hello during authentication")
        mine = self.world.random_bytes(wire.NONCE_LEN)
        self._nonces[conn.id] = (mine, msg.nonce)
        mac = auth.acceptor_mac(self.world.secret, msg.nonce, mine)
        return [Say(conn.id, wire.Challenge(mine, mac))]

    def _proof(self, conn: Conn, msg: wire.Proof, now: float) -> Effects:
        if conn.id not in self._nonces:
            raise wire.ProtocolError("unexpected Proof during authentication")
        mine, theirs = self._nonces[conn.id]
        expected = auth.connector_mac(self.world.secret, theirs, mine)
        if not auth.verify(expected, msg.mac):
            raise wire.ProtocolError("bad proof: wrong job secret")
        del self._nonces[conn.id]
        return [Authenticated(conn.id)]

    def _challenge(self, conn: Conn, msg: wire.Challenge, now: float) -> Effects:
        secret = self.world.secret
        mine = self._nonces.get(conn.id, (b"", b""))[0]
        expected = auth.acceptor_mac(secret, mine, msg.nonce)
        if not auth.verify(expected, msg.mac):
            raise wire.ProtocolError("bad challenge: wrong job secret")
        self._nonces.pop(conn.id, None)
        return [
            Say(conn.id, wire.Proof(auth.connector_mac(secret, mine, msg.nonce))),
            SendConnInit(conn.id),
            Authenticated(conn.id),
        ]

    # --- introductions -----------------------------------------------------------------------------------------

    def _conninit(self, conn: Conn, msg: wire.ConnInit, now: float) -> Effects:
        world = self.world
        addr = msg.info.addr
        key = msg.info.key
        if world.is_gone(key) or world.table.is_outdated(key):
            # Dead, departed, or older than the process that holds its address now: the reunion rule answers
            # (reunion.py): our lists and YOU_ARE_DEAD, OUTNUMBERED, or MEASURE.
            return [Judge(conn.id, key, msg)]
        if addr == world.me.addr:
            raise wire.ProtocolError("connection from our own address")
        out: Effects = []
        existing = world.conn_to(addr, exclude=conn.id)
        if existing is not None and existing.incarnation not in (None, key.incarnation):
            existing = None  # a connection to an older process at that address: the merge below retires it
        if existing is not None:
            # Simultaneous connects (docs/architecture.md 2.3): the connection the lower address opened survives,
            # on both sides, whatever the timing. A ready connection gone silent is no reason to refuse a fresh one.
            stale = existing.state is ConnState.READY and now - existing.last_recv > world.timers.unresponsive
            if world.me.addr.sort_key() < addr.sort_key() and not stale:
                return [Say(conn.id, wire.ConnInitAck(wire.Nack.DUPLICATE)), Drop(conn.id)]
            out.append(Drop(existing.id, replaced=True))
        out += [
            Ready(conn.id, addr, key.incarnation),
            Merge((msg.info,), spread=True, except_conn=conn.id, relink=True),
            Notify(Kind.PEER_CONNECTING, addr),
            Say(conn.id, wire.ConnInitAck(wire.Nack.OK, world.me)),
            Attach(conn.id),
            Sync(conn.id, msg.peers_hash, msg.dead_hash),
        ]
        return out

    def _ack(self, conn: Conn, msg: wire.ConnInitAck, now: float) -> Effects:
        world = self.world
        assert conn.peer is not None
        probe = world.is_probe(conn.id)
        out: Effects = []
        if probe and msg.nack is not wire.Nack.MEASURE:
            out.append(ProbeAnswered())
        if msg.nack is wire.Nack.YOU_ARE_DEAD:
            acceptor = world.table.get(conn.peer)
            if probe and acceptor is not None:
                out.append(Outnumbered(acceptor.key))  # our probe met the larger side of a healed partition
            else:
                out.append(Expel())
            return out
        if msg.nack is wire.Nack.OUTNUMBERED:
            return out + [Drop(conn.id)]  # the acceptor's side is the smaller one: it leaves the job
        if msg.nack is wire.Nack.MEASURE:
            # A side not measured yet: gather, then probe again with ours (reunion.py).
            return out + [Drop(conn.id), MeasureAgain(conn.peer)]
        if msg.nack is wire.Nack.DUPLICATE:
            return out + [Drop(conn.id, replaced=True)]
        if msg.nack is wire.Nack.LEAVING:
            out.append(Drop(conn.id))
            acceptor = world.table.get(conn.peer)
            if acceptor is not None:
                out.append(Left(acceptor.key))
            return out
        if msg.info is not None and msg.info.addr != conn.peer:
            raise wire.ProtocolError("the peer answered with another address")
        if msg.info is not None and (world.is_gone(msg.info.key) or world.table.is_outdated(msg.info.key)):
            # A process the job holds gone answered (a zombie that missed its verdict, the smaller side of a healed
            # partition): send it our lists, which name it dead (it passes them on to its side), and close.
            if msg.info.key in world.dead:
                out.append(SendTable(conn.id))
            return out + [Drop(conn.id)]
        current = world.table.get(conn.peer)
        incarnation = msg.info.incarnation if msg.info is not None else current.incarnation if current else None
        out.append(Incarnation(conn.id, incarnation))
        # A newer process at that address retires the older one first (dropping its connections, not this one).
        if msg.info is not None:
            out.append(Merge((msg.info,), relink=True))
        return out + [Confirm(conn.id)]

    def confirm(self, conn: Conn, now: float) -> Effects:
        """The connector's handshake ends, once the acceptor's entry is merged (``_ack``)."""
        world = self.world
        assert conn.peer is not None
        out: Effects = []
        existing = world.conn_to(conn.peer, exclude=conn.id)
        if existing is not None and existing.state is ConnState.READY:
            # The peer accepted our connection and dropped its own: keep this one.
            out.append(Drop(existing.id, replaced=True))
        # A probe that met a newer process at that address is an ordinary connection now.
        out += [
            Ready(conn.id, conn.peer, conn.incarnation),
            ProbeMet(conn.id),
            Notify(Kind.PEER_CONNECTED, conn.peer, "connection established successfully"),
            Attach(conn.id),
        ]
        return out

    def _lists(self, conn: Conn, msg: wire.PeersUpdate, now: float) -> Effects:
        """The acceptor's lists, sent just before it tells us we are dead: pass them on, for those cut off with us."""
        if msg.full and self.world.me.key in msg.dead:
            return [Broadcast(msg, conn.id)]
        return []

    # --- the time limit ----------------------------------------------------------------------------------------

    def timeouts(self, now: float) -> Effects:
        """Drop every connection not READY within the handshake limit; its contact reconnects when due."""
        world = self.world
        out: Effects = []
        for conn in world.conns_list():
            if conn.state is not ConnState.READY and now - conn.opened_at > world.timers.handshake:
                if conn.peer is not None:
                    direction = "outgoing" if conn.outgoing else "incoming"
                    why = f"handshake completion timed out after {int(now - conn.opened_at)}s ({direction} connection)"
                    out.append(Notify(Kind.PEER_INIT_TIMEOUT, conn.peer, why))
                out.append(Drop(conn.id))
        return out


#: (our role on the connection, its state, the message) -> what to do. Any other message before READY is a
#: protocol error.
HANDSHAKE: dict[tuple[ConnRole, ConnState, type], Handler] = {
    (ConnRole.ACCEPTOR, ConnState.AUTH, wire.Hello): Handshake._hello,
    (ConnRole.ACCEPTOR, ConnState.AUTH, wire.Proof): Handshake._proof,
    (ConnRole.CONNECTOR, ConnState.AUTH, wire.Challenge): Handshake._challenge,
    (ConnRole.ACCEPTOR, ConnState.INIT, wire.ConnInit): Handshake._conninit,
    (ConnRole.CONNECTOR, ConnState.INIT, wire.ConnInitAck): Handshake._ack,
    (ConnRole.CONNECTOR, ConnState.INIT, wire.PeersUpdate): Handshake._lists,
}
