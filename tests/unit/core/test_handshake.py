"""The handshake as a table: before a connection is READY, each side accepts only the message the table expects
next, and anything else closes that connection and changes nothing."""

import random

import pytest

from rasd.core import node as core, wire
from rasd.core.connections import ConnState
from rasd.core.handshake import HANDSHAKE, ConnRole

from .harness import SECRET, peer
from .test_wire import MESSAGES


def test_the_table_is_the_protocol():
    assert {(role, state, kind.__name__) for role, state, kind in HANDSHAKE} == {
        (ConnRole.ACCEPTOR, ConnState.AUTH, "Hello"),
        (ConnRole.ACCEPTOR, ConnState.AUTH, "Proof"),
        (ConnRole.CONNECTOR, ConnState.AUTH, "Challenge"),
        (ConnRole.ACCEPTOR, ConnState.INIT, "ConnInit"),
        (ConnRole.CONNECTOR, ConnState.INIT, "ConnInitAck"),
        (ConnRole.CONNECTOR, ConnState.INIT, "PeersUpdate"),  # the lists a dead connector gets before YOU_ARE_DEAD
    }


def _connector() -> tuple[core.Node, int]:
    """A node whose outgoing connection is up and has sent HELLO: it waits for a CHALLENGE."""
    me, other = peer(1), peer(2)
    n = core.Node(me, SECRET, rng=random.Random(1))
    n.start(0.0)
    (connect,) = [a for a in n.add_peers([me, other], 0.0) if isinstance(a, core.Connect)]
    (hello,) = n.connected(connect.conn_id, 0.0)
    assert isinstance(hello, core.Send) and isinstance(wire.decode_body(hello.data[4:]), wire.Hello)
    return n, connect.conn_id


@pytest.mark.parametrize(
    "msg", [m for m in MESSAGES if not isinstance(m, wire.Challenge)], ids=lambda m: type(m).__name__
)
def test_a_connector_waiting_for_its_challenge_accepts_nothing_else(msg):
    n, cid = _connector()
    before = (n.table.hash, n.dead_hash, set(n.hung), n.expelled)
    actions = n.received(cid, wire.encode(msg), 0.1)
    assert core.Close(cid) in actions and cid not in n.conns
    assert not any(isinstance(a, core.Send) for a in actions)
    assert (n.table.hash, n.dead_hash, set(n.hung), n.expelled) == before


@pytest.mark.parametrize(
    "msg", [m for m in MESSAGES if not isinstance(m, (wire.Hello, wire.Proof))], ids=lambda m: type(m).__name__
)
def test_an_acceptor_waiting_for_hello_accepts_nothing_else(msg):
    n = core.Node(peer(1), SECRET, rng=random.Random(1))
    n.start(0.0)
    n.accepted(-1, 0.0)
    before = (n.table.hash, n.dead_hash, n.expelled)
    actions = n.received(-1, wire.encode(msg), 0.1)
    assert core.Close(-1) in actions and -1 not in n.conns
    assert (n.table.hash, n.dead_hash, n.expelled) == before
