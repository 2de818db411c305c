"""The handshake: how a TCP connection becomes a READY link between two members of one job.

Belongs here: every message a connection may receive before it is READY, as one table (``HANDSHAKE``), the
handlers it names, and the handshake time limit. The acceptor and the connector follow the same table; which side
this node plays on a connection is ``Conn.outgoing``. Theory of operation (docs/architecture.md sections 2.3 and
3.1)::

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
from .events import Kind
from .reunion import Ruling

if TYPE_CHECKING:
    from .node import Node


class Side(enum.Enum):
    CONNECTOR = True  # Conn.outgoing
    ACCEPTOR = False


Handler = Callable[["Handshake", Conn, Any, float], None]


class Handshake:
    def __init__(self, node: Node) -> None:
        self.node = node

    def connected(self, conn: Conn, now: float) -> None:
        """Our outgoing connection is up: the connector speaks first."""
        conn.state = ConnState.AUTH
        conn.my_nonce = self.node.rng.randbytes(wire.NONCE_LEN)
        conn.last_recv = now
        self.node.send(conn, wire.Hello(conn.my_nonce), now)

    def on_message(self, conn: Conn, msg: wire.Message, now: float) -> None:
        """A message on a connection in AUTH or INIT: the one the table expects, or a protocol error."""
        handler = HANDSHAKE.get((Side(conn.outgoing), conn.state, type(msg)))
        if handler is None:
            stage = "during authentication" if conn.state is ConnState.AUTH else "before CONNINIT"
            raise wire.ProtocolError(f"unexpected {type(msg).__name__} {stage}")
        handler(self, conn, msg, now)

    # --- authentication ----------------------------------------------------------------------------------------

    def _hello(self, conn: Conn, msg: wire.Hello, now: float) -> None:
        if conn.their_nonce:
            raise wire.ProtocolError("unexpected Hello during authentication")
        conn.their_nonce = msg.nonce
        conn.my_nonce = self.node.rng.randbytes(wire.NONCE_LEN)
        mac = auth.acceptor_mac(self.node.secret, conn.their_nonce, conn.my_nonce)
        self.node.send(conn, wire.Challenge(conn.my_nonce, mac), now)

    def _proof(self, conn: Conn, msg: wire.Proof, now: float) -> None:
        if not conn.their_nonce:
            raise wire.ProtocolError("unexpected Proof during authentication")
        expected = auth.connector_mac(self.node.secret, conn.their_nonce, conn.my_nonce)
        if not auth.verify(expected, msg.mac):
            raise wire.ProtocolError("bad proof: wrong job secret")
        self._authenticated(conn)

    def _challenge(self, conn: Conn, msg: wire.Challenge, now: float) -> None:
        node = self.node
        expected = auth.acceptor_mac(node.secret, conn.my_nonce, msg.nonce)
        if not auth.verify(expected, msg.mac):
            raise wire.ProtocolError("bad challenge: wrong job secret")
        node.send(conn, wire.Proof(auth.connector_mac(node.secret, conn.my_nonce, msg.nonce)), now)
        node.send(conn, node.reunion.conninit(conn, now), now)
        self._authenticated(conn)

    @staticmethod
    def _authenticated(conn: Conn) -> None:
        conn.state = ConnState.INIT
        conn.reader.max_frame = wire.MAX_FRAME

    # --- introductions -----------------------------------------------------------------------------------------

    def _conninit(self, conn: Conn, msg: wire.ConnInit, now: float) -> None:
        node = self.node
        addr = msg.info.addr
        key = msg.info.key
        if node.verdicts.gone(key) or node.table.is_outdated(key):
            ruling = node.reunion.judge(key, msg, now)
            if ruling is Ruling.WE_LOSE:
                # A healed partition, and the connector's side is the larger one: ours leaves (reunion.py).
                node.send(conn, wire.ConnInitAck(wire.Nack.OUTNUMBERED), now)
                node.drop_conn(conn.id)
                node.reunion.lost(key, now)
                return
            if ruling is Ruling.MEASURE:
                node.send(conn, wire.ConnInitAck(wire.Nack.MEASURE), now)
                node.drop_conn(conn.id)
                return
            # Dead, departed, or older than the process that holds its address now (so gone): never rejoins. A dead
            # one gets our lists first, which it passes on to whoever it is still connected to: most likely
            # processes cut off with it (the smaller side of a healed partition), who learn it at once.
            if key in node.verdicts.dead:
                node.send(conn, node.gossip.full_update(), now)
            node.send(conn, wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD), now)
            node.drop_conn(conn.id)
            return
        if addr == node.me.addr:
            raise wire.ProtocolError("connection from our own address")
        existing = node.connections.to(addr, exclude=conn.id)
        if existing is not None and existing.incarnation not in (None, key.incarnation):
            existing = None  # a connection to an older process at that address: the merge below retires it
        if existing is not None:
            # Simultaneous connects (docs/architecture.md 2.3): the connection the lower address opened survives,
            # on both sides, whatever the timing. A ready connection gone silent is no reason to refuse a fresh one.
            stale = existing.state is ConnState.READY and now - existing.last_recv > node.timers.unresponsive
            if node.me.addr.sort_key() < addr.sort_key() and not stale:
                node.send(conn, wire.ConnInitAck(wire.Nack.DUPLICATE), now)
                node.drop_conn(conn.id)
                return
            node.drop_conn(existing.id, replaced=True)
        conn.peer = addr
        conn.incarnation = key.incarnation
        conn.state = ConnState.READY
        conn.peer_wants = True
        if node.gossip.merge([msg.info], now):
            node.gossip.spread([msg.info], except_conn=conn.id)
            node.links.relink(now)
        node.emit(Kind.PEER_CONNECTING, now, node.table.get(addr))
        node.send(conn, wire.ConnInitAck(wire.Nack.OK, node.me), now)
        node.links.attach(conn, now)
        node.gossip.sync(conn, msg.peers_hash, msg.dead_hash, now)

    def _ack(self, conn: Conn, msg: wire.ConnInitAck, now: float) -> None:
        node = self.node
        assert conn.peer is not None
        if conn.probe and msg.nack is not wire.Nack.MEASURE:
            node.reunion.answered()
        if msg.nack is wire.Nack.YOU_ARE_DEAD:
            acceptor = node.table.get(conn.peer)
            if conn.probe and acceptor is not None:
                node.reunion.lost(acceptor.key, now)  # our probe met the larger side of a healed partition
            else:
                node.expel(now)
            return
        if msg.nack is wire.Nack.OUTNUMBERED:
            node.drop_conn(conn.id)  # the acceptor's side is the smaller one: it leaves the job
            return
        if msg.nack is wire.Nack.MEASURE:
            node.drop_conn(conn.id)  # a side not measured yet: gather, then probe again with ours (reunion.py)
            node.reunion.measure(now, again=conn.peer)
            return
        if msg.nack is wire.Nack.DUPLICATE:
            node.drop_conn(conn.id, replaced=True)
            return
        if msg.nack is wire.Nack.LEAVING:
            node.drop_conn(conn.id)
            acceptor = node.table.get(conn.peer)
            if acceptor is not None:
                node.verdicts.mark_left(acceptor.key, now)
            return
        if msg.info is not None and msg.info.addr != conn.peer:
            raise wire.ProtocolError("the peer answered with another address")
        if msg.info is not None and (node.verdicts.gone(msg.info.key) or node.table.is_outdated(msg.info.key)):
            # A process the job holds gone answered (a zombie that missed its verdict, the smaller side of a healed
            # partition): send it our lists, which name it dead (it passes them on to its side), and close.
            if msg.info.key in node.verdicts.dead:
                node.send(conn, node.gossip.full_update(), now)
            node.drop_conn(conn.id)
            return
        current = node.table.get(conn.peer)
        conn.incarnation = msg.info.incarnation if msg.info is not None else current.incarnation if current else None
        # A newer process at that address retires the older one first (dropping its connections, not this one).
        if msg.info is not None and node.gossip.merge([msg.info], now):
            node.links.relink(now)
        existing = node.connections.to(conn.peer, exclude=conn.id)
        if existing is not None and existing.state is ConnState.READY:
            # The peer accepted our connection and dropped its own: keep this one.
            node.drop_conn(existing.id, replaced=True)
        conn.state = ConnState.READY
        conn.probe = False  # a probe that met a newer process at that address is an ordinary connection now
        node.emit(Kind.PEER_CONNECTED, now, node.table.get(conn.peer), "connection established successfully")
        node.links.attach(conn, now)

    def _lists(self, conn: Conn, msg: wire.PeersUpdate, now: float) -> None:
        """The acceptor's lists, sent just before it tells us we are dead: pass them on, for those cut off with us."""
        node = self.node
        if msg.full and node.me.key in msg.dead:
            node.pass_on(msg, except_conn=conn.id)

    # --- the time limit ----------------------------------------------------------------------------------------

    def timeouts(self, now: float) -> None:
        """Drop every connection not READY within the handshake limit; its contact reconnects when due."""
        node = self.node
        for conn in node.connections:
            if conn.state is not ConnState.READY and now - conn.opened_at > node.timers.handshake:
                if conn.peer is not None:
                    direction = "outgoing" if conn.outgoing else "incoming"
                    node.emit(
                        Kind.PEER_INIT_TIMEOUT,
                        now,
                        node.table.get(conn.peer),
                        f"handshake completion timed out after {int(now - conn.opened_at)}s ({direction} connection)",
                    )
                node.drop_conn(conn.id)


#: (our side of the connection, its state, the message) -> what to do. Any other message before READY is a
#: protocol error.
HANDSHAKE: dict[tuple[Side, ConnState, type], Handler] = {
    (Side.ACCEPTOR, ConnState.AUTH, wire.Hello): Handshake._hello,
    (Side.ACCEPTOR, ConnState.AUTH, wire.Proof): Handshake._proof,
    (Side.CONNECTOR, ConnState.AUTH, wire.Challenge): Handshake._challenge,
    (Side.ACCEPTOR, ConnState.INIT, wire.ConnInit): Handshake._conninit,
    (Side.CONNECTOR, ConnState.INIT, wire.ConnInitAck): Handshake._ack,
    (Side.CONNECTOR, ConnState.INIT, wire.PeersUpdate): Handshake._lists,
}
