"""handshake.py alone: the table of messages a connection may receive before it is READY, authentication, the
introductions and their answers, and the time limit, as effects."""

import itertools

import pytest

from rasd.core import auth, wire
from rasd.core.connections import ConnState
from rasd.core.effects import (
    Attach,
    Authenticated,
    Broadcast,
    Confirm,
    Drop,
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
from rasd.core.events import Kind
from rasd.core.handshake import HANDSHAKE, ConnRole, Handshake
from rasd.core.stuck import StuckVerdict

from .world import SECRET, FakeWorld, peer

P1, P2, P3 = peer(1), peer(2), peer(3)
P2_NEW = peer(2, incarnation=9002)
NONCE = b"n" * wire.NONCE_LEN
MAC = b"m" * wire.MAC_LEN

#: One message of every type.
MESSAGES = [
    wire.Hello(NONCE),
    wire.Challenge(NONCE, MAC),
    wire.Proof(MAC),
    wire.ConnInit(P2, 1, 2),
    wire.ConnInitAck(wire.Nack.OK, P2),
    wire.Keepalive(1, 2, True),
    wire.PeersUpdate((P2,), (), (), full=True),
    wire.Flood(P2.addr, 1, wire.FloodKind.DEAD, P3.addr, P3.incarnation),
    wire.CollReq(P2.addr, 1, 0),
    wire.collresp(P2.addr, 1, 0),
    wire.CommVerdict(P2.addr, 1, True, StuckVerdict(1, 0, 1, (0,), ())),
]
ALLOWED = {
    (ConnRole.ACCEPTOR, ConnState.AUTH, wire.Hello),
    (ConnRole.ACCEPTOR, ConnState.AUTH, wire.Proof),
    (ConnRole.CONNECTOR, ConnState.AUTH, wire.Challenge),
    (ConnRole.ACCEPTOR, ConnState.INIT, wire.ConnInit),
    (ConnRole.CONNECTOR, ConnState.INIT, wire.ConnInitAck),
    (ConnRole.CONNECTOR, ConnState.INIT, wire.PeersUpdate),  # the lists a dead connector gets before YOU_ARE_DEAD
}


def _handshake(me=P1, *peers):
    world = FakeWorld(me, peers or (P2, P3))
    return world, Handshake(world)


def test_every_message_type_is_in_the_list():
    assert {type(m) for m in MESSAGES} == set(wire.Message.__args__)


def test_the_table_is_the_protocol():
    assert set(HANDSHAKE) == ALLOWED


@pytest.mark.parametrize(
    ("role", "state", "msg"),
    [
        (role, state, msg)
        for role, state, msg in itertools.product(ConnRole, (ConnState.AUTH, ConnState.INIT), MESSAGES)
        if (role, state, type(msg)) not in ALLOWED
    ],
    ids=lambda x: getattr(x, "name", type(x).__name__),
)
def test_anything_else_before_ready_is_a_protocol_error_and_changes_nothing(role, state, msg):
    world, h = _handshake()
    conn = world.add_conn(5, P2 if role is ConnRole.CONNECTOR else None, state, outgoing=role.value)
    nonces = dict(h._nonces)
    with pytest.raises(wire.ProtocolError, match=f"unexpected {type(msg).__name__}"):
        h.on_message(conn, msg, 1.0)
    assert h._nonces == nonces


def _pair():
    """A connector (P2) and an acceptor (P1) with the same secret, and the connection between them on each side."""
    cw, connector = _handshake(P2, P1)
    aw, acceptor = _handshake(P1, P2)
    out = cw.add_conn(1, P1, ConnState.AUTH, incarnation=None, outgoing=True)
    inc = aw.add_conn(-1, None, ConnState.AUTH, incarnation=None, outgoing=False)
    return (cw, connector, out), (aw, acceptor, inc)


def test_the_challenge_response_authenticates_both_sides():
    (cw, connector, out), (aw, acceptor, inc) = _pair()
    (hello,) = connector.connected(out, 0.0)
    assert hello == Say(1, wire.Hello(b"\x01" * wire.NONCE_LEN))
    (challenge,) = acceptor.on_message(inc, hello.msg, 0.1)
    na = b"\x01" * wire.NONCE_LEN  # the acceptor's first draw
    assert challenge == Say(-1, wire.Challenge(na, auth.acceptor_mac(SECRET, hello.msg.nonce, na)))
    proof, conninit, authenticated = connector.on_message(out, challenge.msg, 0.2)
    assert (proof, conninit, authenticated) == (
        Say(1, wire.Proof(auth.connector_mac(SECRET, hello.msg.nonce, na))),
        SendConnInit(1),
        Authenticated(1),
    )
    assert acceptor.on_message(inc, proof.msg, 0.3) == [Authenticated(-1)]
    assert connector._nonces == {} and acceptor._nonces == {}


def test_a_second_hello_and_a_proof_before_any_hello_are_protocol_errors():
    (_, connector, out), (_, acceptor, inc) = _pair()
    with pytest.raises(wire.ProtocolError, match="unexpected Proof"):
        acceptor.on_message(inc, wire.Proof(MAC), 0.0)
    acceptor.on_message(inc, wire.Hello(NONCE), 0.0)
    with pytest.raises(wire.ProtocolError, match="unexpected Hello"):
        acceptor.on_message(inc, wire.Hello(NONCE), 0.1)


def test_a_wrong_secret_fails_on_either_side():
    (cw, connector, out), (aw, acceptor, inc) = _pair()
    aw.secret = b"another job"
    (hello,) = connector.connected(out, 0.0)
    (challenge,) = acceptor.on_message(inc, hello.msg, 0.1)
    with pytest.raises(wire.ProtocolError, match="bad challenge: wrong job secret"):
        connector.on_message(out, challenge.msg, 0.2)
    # The connector's proof, made with its own secret, fails at the acceptor too.
    mine = connector._nonces[1][0]
    proof = wire.Proof(auth.connector_mac(SECRET, mine, challenge.msg.nonce))
    with pytest.raises(wire.ProtocolError, match="bad proof: wrong job secret"):
        acceptor.on_message(inc, proof, 0.3)
    assert -1 in acceptor._nonces  # not authenticated: the node drops the connection


# --- introductions: the acceptor -----------------------------------------------------------------------------------


def test_a_conninit_makes_the_connection_ready_and_introduces_the_peer():
    world, h = _handshake(P1, P2)
    conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False)
    msg = wire.ConnInit(P3, 11, 22)
    assert h.on_message(conn, msg, 1.0) == [
        Ready(-1, P3.addr, P3.incarnation),
        Merge((P3,), spread=True, except_conn=-1, relink=True),
        Notify(Kind.PEER_CONNECTING, P3.addr),
        Say(-1, wire.ConnInitAck(wire.Nack.OK, P1)),
        Attach(-1),
        Sync(-1, 11, 22),
    ]


def test_simultaneous_connects_the_lower_addresss_connection_survives():
    # We are P1, lower than P2: our own connection to P2 stays, P2's is refused as a DUPLICATE.
    world, h = _handshake(P1)
    world.add_conn(4, P2, ConnState.READY, at=0.0)
    conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False)
    assert h.on_message(conn, wire.ConnInit(P2, 0, 0), 1.0) == [
        Say(-1, wire.ConnInitAck(wire.Nack.DUPLICATE)),
        Drop(-1),
    ]
    # We are P3, higher than P2: P2's connection replaces ours.
    world, h = _handshake(P3)
    world.add_conn(4, P2, ConnState.AUTH, incarnation=None)
    conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False)
    effects = h.on_message(conn, wire.ConnInit(P2, 0, 0), 1.0)
    assert effects[:2] == [Drop(4, replaced=True), Ready(-1, P2.addr, P2.incarnation)]


def test_a_ready_connection_gone_silent_is_replaced_even_by_the_higher_address():
    world, h = _handshake(P1)
    world.add_conn(4, P2, ConnState.READY, at=0.0)
    conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False, at=10.0)
    now = world.timers.unresponsive + 0.1
    assert h.on_message(conn, wire.ConnInit(P2, 0, 0), now)[:2] == [
        Drop(4, replaced=True),
        Ready(-1, P2.addr, P2.incarnation),
    ]


def test_a_connection_to_an_older_incarnation_is_no_duplicate():
    world, h = _handshake(P1)
    world.add_conn(4, P2, ConnState.READY)  # reaches P2's old incarnation; the merge of P2_NEW retires it
    conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False)
    assert h.on_message(conn, wire.ConnInit(P2_NEW, 0, 0), 1.0)[0] == Ready(-1, P2.addr, P2_NEW.incarnation)


def test_a_connector_we_hold_gone_or_outdated_is_judged_by_the_reunion_rule():
    world, h = _handshake(P1, P2, P3)
    world.dead.add(P3.key)
    world.merge(P2_NEW)
    for who in (P3, P2):  # dead; older than the process that holds its address
        conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False)
        msg = wire.ConnInit(who, 0, 0)
        assert h.on_message(conn, msg, 1.0) == [Judge(-1, who.key, msg)]
    world.dead.discard(P3.key)
    world.left.add(P3.key)
    msg = wire.ConnInit(P3, 0, 0)
    assert h.on_message(conn, msg, 1.0) == [Judge(-1, P3.key, msg)]


def test_a_connection_from_our_own_address_is_a_protocol_error():
    world, h = _handshake(P1)
    conn = world.add_conn(-1, None, ConnState.INIT, outgoing=False)
    with pytest.raises(wire.ProtocolError, match="our own address"):
        h.on_message(conn, wire.ConnInit(peer(1, incarnation=1 << 50), 0, 0), 1.0)


# --- introductions: the connector ----------------------------------------------------------------------------------


def _connector(probe: bool = False):
    world, h = _handshake(P1, P2, P3)
    conn = world.add_conn(3, P2, ConnState.INIT, incarnation=None)
    if probe:
        world.probes.add(3)
    return world, h, conn


def test_an_ok_ack_names_the_incarnation_merges_the_entry_then_confirms():
    world, h, conn = _connector()
    assert h.on_message(conn, wire.ConnInitAck(wire.Nack.OK, P2_NEW), 1.0) == [
        Incarnation(3, P2_NEW.incarnation),
        Merge((P2_NEW,), relink=True),
        Confirm(3),
    ]
    # An acceptor of an older protocol names nobody: the table's current entry is assumed.
    assert h.on_message(conn, wire.ConnInitAck(wire.Nack.OK), 1.0) == [Incarnation(3, P2.incarnation), Confirm(3)]


def test_you_are_dead_expels_us_or_on_a_probe_says_we_were_outnumbered():
    world, h, conn = _connector()
    assert h.on_message(conn, wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD), 1.0) == [Expel()]
    world.probes.add(3)
    assert h.on_message(conn, wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD), 1.0) == [ProbeAnswered(), Outnumbered(P2.key)]


@pytest.mark.parametrize("probe", [False, True])
def test_the_other_nacks(probe):
    world, h, conn = _connector(probe)
    answered = [ProbeAnswered()] if probe else []

    def ack(nack):
        return h.on_message(conn, wire.ConnInitAck(nack), 1.0)

    assert ack(wire.Nack.OUTNUMBERED) == [*answered, Drop(3)]
    assert ack(wire.Nack.MEASURE) == [Drop(3), MeasureAgain(P2.addr)]  # not an answer: the prober asks again
    assert ack(wire.Nack.DUPLICATE) == [*answered, Drop(3, replaced=True)]
    assert ack(wire.Nack.LEAVING) == [*answered, Drop(3), Left(P2.key)]


def test_an_ack_from_another_address_is_a_protocol_error():
    _, h, conn = _connector()
    with pytest.raises(wire.ProtocolError, match="another address"):
        h.on_message(conn, wire.ConnInitAck(wire.Nack.OK, P3), 1.0)


def test_an_acceptor_we_hold_gone_gets_our_lists_if_dead_and_is_closed():
    world, h, conn = _connector()
    world.dead.add(P2.key)
    assert h.on_message(conn, wire.ConnInitAck(wire.Nack.OK, P2), 1.0) == [SendTable(3), Drop(3)]
    world.merge(P2_NEW)
    world.dead.clear()
    assert h.on_message(conn, wire.ConnInitAck(wire.Nack.OK, P2), 1.0) == [Drop(3)]  # outdated, not dead


def test_confirm_makes_the_connection_ready_replacing_the_peers_own():
    world, h, conn = _connector()
    conn.incarnation = P2.incarnation
    world.add_conn(-4, P2, ConnState.READY, outgoing=False)
    assert h.confirm(conn, 1.0) == [
        Drop(-4, replaced=True),
        Ready(3, P2.addr, P2.incarnation),
        ProbeMet(3),
        Notify(Kind.PEER_CONNECTED, P2.addr, "connection established successfully"),
        Attach(3),
    ]
    world.conns[-4].state = ConnState.INIT  # not ready: its own handshake times out or is refused
    assert h.confirm(conn, 1.0)[0] == Ready(3, P2.addr, P2.incarnation)


def test_the_lists_before_you_are_dead_are_passed_on_to_those_cut_off_with_us():
    _, h, conn = _connector()
    naming_us = wire.PeersUpdate((P1, P2), (P1.key,), (), full=True)
    assert h.on_message(conn, naming_us, 1.0) == [Broadcast(naming_us, 3)]
    assert h.on_message(conn, wire.PeersUpdate((P1, P2), (P3.key,), (), full=True), 1.0) == []
    assert h.on_message(conn, wire.PeersUpdate((P1,), (P1.key,), (), full=False), 1.0) == []


# --- the time limit ------------------------------------------------------------------------------------------------


def test_connections_not_ready_within_the_limit_are_dropped():
    world, h = _handshake(P1)
    limit = world.timers.handshake
    world.add_conn(1, P2, ConnState.AUTH, incarnation=None, outgoing=True, at=0.0)
    world.add_conn(-2, None, ConnState.INIT, outgoing=False, at=0.0)
    world.add_conn(3, P3, ConnState.READY, at=0.0)
    world.add_conn(4, P3, ConnState.CONNECTING, at=1.0)
    assert h.timeouts(limit) == []
    assert h.timeouts(limit + 0.5) == [
        Notify(Kind.PEER_INIT_TIMEOUT, P2.addr, "handshake completion timed out after 5s (outgoing connection)"),
        Drop(1),
        Drop(-2),  # nobody to name yet
    ]
