"""The rules of the mesh, pinned on two or three ``Node``s driven by hand (see ``harness``): fake clock values, no
sockets, no sleeps. Each test reads as one rule of docs/architecture.md §2 (the life of a node) and §4 (gathers)."""

import dataclasses
import random

import pytest

from rasd.core import node as core, wire
from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.core.frames import Frame
from rasd.core.liveness import CONFIRM
from rasd.core.peers import Addr

from .harness import SECRET, Harness, peer

FACTORS = [1.0, 0.1]


def pair(timers: Timers = Timers(), hosts=("10.0.0.1", "10.0.0.1"), rng=None, **kw) -> Harness:
    """``a`` (the lower address) and ``b``, introduced and connected at t=0."""
    h = Harness(rng)
    h.add("a", peer(1, hosts[0]), timers, **kw)
    h.add("b", peer(2, hosts[1]), timers, **kw)
    h.introduce()
    return h


def trio(timers: Timers = Timers(), **kw) -> Harness:
    h = Harness()
    for i, name in enumerate("abc", start=1):
        h.add(name, peer(i), timers, **kw)
    h.introduce()
    return h


def first(m, kind: Kind, about: Addr | None = None):
    for e in m.events:
        if e.kind is kind and (about is None or e.addr == about):
            return e
    return None


def count(m, kind: Kind, about: Addr | None = None) -> int:
    return sum(1 for e in m.events if e.kind is kind and (about is None or e.addr == about))


def beliefs(n: core.Node):
    """Everything a node believes about the job, to check that an input changed none of it."""
    return (
        n.table.hash,
        frozenset(n.dead),
        frozenset(n.left),
        frozenset(n.hung),
        n.expelled,
        {a: (c.conn, c.delayed, c.last_heard) for a, c in n.contacts.items()},
        {cid: (c.peer, c.state) for cid, c in n.conns.items()},
    )


# ----------------------------------------------------------------------------------------------------------------
# Handshake


def test_handshake_connects_both_sides_and_each_emits_its_event():
    h = pair()
    a, b = h["a"], h["b"]
    # The acceptor says CONNECTING about the connector, the connector CONNECTED about the acceptor.
    assert first(b, Kind.PEER_CONNECTING, a.node.me.addr) is not None
    assert first(a, Kind.PEER_CONNECTED, b.node.me.addr) is not None
    assert len(a.ready_conns(b.node.me.addr)) == 1 and len(b.ready_conns(a.node.me.addr)) == 1
    assert a.node.link_peers() == {b.node.me.addr} and b.node.link_peers() == {a.node.me.addr}
    # Every node announces itself and each newcomer once.
    assert count(a, Kind.PEER_NEW) == 2 and count(b, Kind.PEER_NEW) == 2


def test_the_lower_address_connects_first_and_the_higher_waits_connect_warn():
    h = pair()
    a, b = h["a"], h["b"]
    assert [c.outgoing for c in a.node.conns.values()] == [True]
    assert [c.outgoing for c in b.node.conns.values()] == [False]
    assert not any(isinstance(x, core.Connect) for x in b.actions)


def test_the_higher_address_connects_itself_after_connect_warn_when_the_lower_is_silent():
    t = Timers()
    h = Harness()
    h.add("a", peer(1), t)
    b = h.add("b", peer(2), t)
    # Only b learns of a; a never connects.
    h.call("b", lambda: b.node.add_peers([h["a"].node.me, b.node.me], h.now))
    h.run()
    h.advance(t.connect_warn - 1e-6, t.tick)
    assert not any(isinstance(x, core.Connect) for x in b.actions)
    h.tick(t.connect_warn)
    assert any(isinstance(x, core.Connect) for x in b.actions)
    assert len(b.ready_conns(h["a"].node.me.addr)) == 1


def test_keepalives_flow_on_an_idle_link_every_interval():
    t = Timers(sweep=1e9)  # no stuck-collective sweeps: nothing but keepalives on the link
    h = pair(t)
    h.advance(10.0, t.tick)
    a = h["a"]
    keepalives = [m for _, m in a.sent if isinstance(m, wire.Keepalive)]
    assert 9 <= len(keepalives) <= 11
    assert all(m.wanted and m.peers_hash == a.node.table.hash for m in keepalives)
    assert not h["a"].kinds(Kind.PEER_UNRESPONSIVE, Kind.PEER_DEAD) and not h["b"].kinds(Kind.PEER_UNRESPONSIVE)


# ----------------------------------------------------------------------------------------------------------------
# Strangers and garbage: the connection is closed and nothing else changes


def _stranger(h: Harness, name: str, conn_id: int = -99):
    """Open an incoming connection on ``name`` from outside the harness; return a function that feeds it bytes
    and returns the node's actions."""
    n = h[name].node
    n.accepted(conn_id, h.now)

    def feed(data: bytes):
        return n.received(conn_id, data, h.now)

    return feed


def _closed(actions, conn_id=-99) -> bool:
    return core.Close(conn_id) in actions


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x00\x00\x00",  # an empty frame
        b"\x00\x00\x00\x02\x07\x01",  # a wrong wire version
        b"\x00\x00\x00\x02\x01\x63",  # an unknown message type
        b"\x00\x00\x00\x05\x01\x01XXXX",  # a HELLO cut short
        wire.encode(wire.Hello(b"n" * 16))[:4] + b"\x01\x01BADMnnnnnnnnnnnnnnnn",  # wrong magic
        b"\xff\xff\xff\xff",  # 4 GiB announced
    ],
)
def test_garbage_on_a_fresh_connection_closes_it_and_changes_nothing(garbage):
    h = pair()
    b = h["b"].node
    before = beliefs(b)
    events = len(h["b"].events)
    actions = _stranger(h, "b")(garbage)
    assert _closed(actions)
    assert -99 not in b.conns
    assert beliefs(b) == before and len(h["b"].events) == events
    assert not any(isinstance(x, (core.Emit, core.Send)) for x in actions)


def test_the_preauth_frame_limit_closes_before_the_frame_is_buffered():
    h = pair()
    feed = _stranger(h, "b")
    head = (wire.PREAUTH_MAX_FRAME + 1).to_bytes(4, "big")
    assert _closed(feed(head))  # the length alone is enough: nothing of the body is waited for
    feed2 = _stranger(h, "b", -98)
    ok = wire.PREAUTH_MAX_FRAME.to_bytes(4, "big")
    assert feed2(ok + b"\x01") == []  # a frame at the limit is waited for
    assert h["b"].node.conns[-98].reader.buffered == 5


def test_a_stranger_with_the_wrong_secret_gets_a_challenge_then_is_dropped():
    h = pair()
    b = h["b"].node
    before = beliefs(b)
    feed = _stranger(h, "b")
    actions = feed(wire.encode(wire.Hello(b"s" * 16)))
    (send,) = actions
    challenge = wire.decode_body(send.data[4:])
    assert isinstance(challenge, wire.Challenge)
    # A proof made with another secret fails.
    from rasd.core import auth

    wrong = auth.connector_mac(b"another job", b"s" * 16, challenge.nonce)
    actions = feed(wire.encode(wire.Proof(wrong)))
    assert _closed(actions)
    assert beliefs(b) == before


def test_a_replayed_proof_for_another_nonce_is_refused():
    h = pair()
    from rasd.core import auth

    feed = _stranger(h, "b")
    (send,) = feed(wire.encode(wire.Hello(b"s" * 16)))
    challenge = wire.decode_body(send.data[4:])
    # Right secret but over a nonce the acceptor did not choose: a replay from an old handshake.
    stale = auth.connector_mac(SECRET, b"s" * 16, b"o" * 16)
    assert challenge.nonce != b"o" * 16
    assert _closed(feed(wire.encode(wire.Proof(stale))))


@pytest.mark.parametrize(
    "first_msg",
    [
        lambda me: wire.ConnInit(me, 1, 2),
        lambda me: wire.Keepalive(1, 2, True),
        lambda me: wire.Flood(me.addr, 1, wire.FloodKind.DEAD, Addr("10.0.0.1", 30001), 7001),
        lambda me: wire.Proof(b"p" * 32),
        lambda me: wire.Challenge(b"c" * 16, b"m" * 32),
        lambda me: wire.CollReq(me.addr, 1, 100),
    ],
)
def test_a_message_before_authentication_closes_the_connection(first_msg):
    h = pair()
    b = h["b"].node
    before = beliefs(b)
    intruder = peer(9)
    data = wire.encode(first_msg(intruder))
    feed = _stranger(h, "b")
    actions = feed(data)
    assert _closed(actions)
    assert beliefs(b) == before
    assert intruder.addr not in b.table and not b.dead


def test_a_second_hello_closes_the_connection():
    h = pair()
    b = h["b"].node
    before = beliefs(b)
    feed = _stranger(h, "b")
    feed(wire.encode(wire.Hello(b"s" * 16)))
    assert _closed(feed(wire.encode(wire.Hello(b"t" * 16))))
    assert beliefs(b) == before


def test_nodes_of_two_jobs_never_connect():
    t = Timers()
    h = Harness()
    a = h.add("a", peer(1), t, secret=b"job one")
    b = h.add("b", peer(2), t, secret=b"job two")
    h.introduce()
    h.advance(3.0, t.tick)
    assert not a.kinds(Kind.PEER_CONNECTED, Kind.PEER_CONNECTING)
    assert not b.kinds(Kind.PEER_CONNECTED, Kind.PEER_CONNECTING)
    assert not any(c.state is core.ConnState.READY for m in (a, b) for c in m.node.conns.values())
    assert not a.node.dead and not b.node.dead


def test_garbage_on_an_established_connection_closes_only_that_connection():
    h = pair()
    a, b = h["a"], h["b"]
    (cid,) = [c.id for c in b.ready_conns(a.node.me.addr)]
    table, dead = b.node.table.hash, set(b.node.dead)
    actions = b.node.received(cid, b"\x00\x00\x00\x03\x01\x06\x00", h.now)  # a keepalive cut short
    assert core.Close(cid) in actions
    assert b.node.table.hash == table and b.node.dead == dead and not b.node.expelled
    assert not any(isinstance(x, core.Emit) and x.event.kind is Kind.PEER_DEAD for x in actions)


def test_too_many_unauthenticated_connections_drop_the_oldest():
    h = pair()
    b = h["b"].node
    for i in range(core.MAX_PENDING_CONNS):
        b.accepted(-1000 - i, h.now + i * 0.001)
    actions = b.accepted(-5000, h.now + 1)
    assert core.Close(-1000) in actions
    pending = [c for c in b.conns.values() if c.state is not core.ConnState.READY]
    assert len(pending) == core.MAX_PENDING_CONNS
    assert len(h["b"].ready_conns(h["a"].node.me.addr)) == 1  # the mesh connection is untouched


def test_an_unauthenticated_connection_is_dropped_after_the_handshake_time():
    t = Timers()
    h = pair(t)
    b = h["b"].node
    b.accepted(-99, 0.0)
    h.advance(t.handshake, t.tick)
    assert -99 in b.conns
    h.tick(t.handshake + t.tick)
    assert -99 not in b.conns


# ----------------------------------------------------------------------------------------------------------------
# The ladder: UNRESPONSIVE 5 s, HUNG 10 s, reset 20 s, DEAD 60 s, all scaled


@pytest.mark.parametrize("factor", FACTORS)
def test_the_ladder_of_a_silent_peer_on_the_exact_tick_times(factor):
    t = Timers().scaled(factor)
    h = pair(t)
    a, b = h["a"], h["b"]
    baddr = b.node.me.addr
    h.pause("b")  # SIGSTOP at t=0: its sockets stay open, it says nothing more
    rungs = [
        (t.unresponsive, Kind.PEER_UNRESPONSIVE),
        (t.hang, Kind.PEER_HUNG),
        (t.reset, Kind.PEER_KEEPALIVE_TIMEOUT),
    ]
    for limit, kind in rungs:
        h.advance(limit, t.tick, ["a"])
        assert first(a, kind, baddr) is None, f"{kind} at or before {limit}"
        h.tick(limit + 1e-9, ["a"])
        e = first(a, kind, baddr)
        assert e is not None and e.at == limit + 1e-9, f"{kind} not right after {limit}"
    # The DEAD rung: our HUNG verdict goes out once more (its last call), and the death comes CONFIRM later.
    h.advance(t.dead, t.tick, ["a"])
    h.tick(t.dead + 1e-9, ["a"])
    assert a.node.suspicion.pending
    confirm = CONFIRM * t.unresponsive
    h.advance(t.dead + 1e-9 + confirm - t.tick / 2, t.tick, ["a"])
    assert first(a, Kind.PEER_DEAD, baddr) is None, "PEER_DEAD before the last call stood CONFIRM"
    h.tick(t.dead + 2e-9 + confirm, ["a"])
    e = first(a, Kind.PEER_DEAD, baddr)
    assert e is not None and e.at == t.dead + 2e-9 + confirm
    assert first(a, Kind.PEER_TIMEOUT_DEAD, baddr) is not None
    for kind in (Kind.PEER_UNRESPONSIVE, Kind.PEER_HUNG, Kind.PEER_KEEPALIVE_TIMEOUT, Kind.PEER_DEAD):
        assert count(a, kind, baddr) == 1
    assert a.node.is_unresponsive(baddr) is False  # dead peers are no contacts any more
    assert a.node.is_dead(baddr) and baddr not in a.node.link_peers()
    assert not a.kinds(Kind.PEER_DISCONNECTED)  # a hang is not a crash


@pytest.mark.parametrize("seen", [True, False])
def test_a_hung_verdict_names_where_our_sweeps_last_saw_the_process(seen):
    t = Timers()
    h = pair(t)
    a, b = h["a"], h["b"]
    baddr = b.node.me.addr
    where = (Frame("/src/train.py", 31, "step"), Frame("/usr/lib/python3.11/queue.py", 171, "get"))
    if seen:
        a.node.sweeper.positions[baddr] = (where, 0.0)  # as a sweep of a's leaves it (sweeper.swept)
    h.pause("b")
    h.advance(t.hang + 2 * t.tick, t.tick, ["a"])
    hung = first(a, Kind.PEER_HUNG, baddr)
    assert hung is not None and hung.positions == (((b.node.me.rank, where),) if seen else ())
    unresponsive = first(a, Kind.PEER_UNRESPONSIVE, baddr)
    assert unresponsive is not None and unresponsive.positions == ()  # only the hang verdict says where


@pytest.mark.parametrize("factor", FACTORS)
def test_a_peer_that_speaks_again_recovers_and_is_not_hung(factor):
    t = Timers().scaled(factor)
    h = pair(t)
    a, b = h["a"], h["b"]
    h.pause("b")
    h.advance(t.hang + 2 * t.tick, t.tick, ["a"])
    assert first(a, Kind.PEER_HUNG) is not None
    h.resume("b")
    h.advance(h.now + 2 * t.keepalive, t.tick)
    assert first(a, Kind.PEER_RECOVERED, b.node.me.addr) is not None
    assert not a.node.is_unresponsive(b.node.me.addr) and not a.node.hung
    h.advance(h.now + t.dead * 1.5, t.tick)
    assert not a.node.dead and not b.node.dead
    assert not b.node.expelled


@pytest.mark.parametrize("factor", FACTORS)
def test_reset_reconnects_and_a_slow_peer_resumed_before_the_dead_limit_is_not_dead(factor):
    t = Timers().scaled(factor)
    h = pair(t)
    a, b = h["a"], h["b"]
    h.pause("b")
    h.advance(t.reset + t.handshake + 2 * t.tick, t.tick, ["a"])
    assert first(a, Kind.PEER_KEEPALIVE_TIMEOUT) is not None
    h.resume("b")
    h.advance(h.now + 3 * t.connect_retry + t.handshake, t.tick)
    assert len(a.ready_conns(b.node.me.addr)) == 1 and len(b.ready_conns(a.node.me.addr)) == 1
    h.advance(t.dead * 2, t.tick)
    assert not a.node.dead and not b.node.dead and not b.node.expelled


# ----------------------------------------------------------------------------------------------------------------
# Fast death


@pytest.mark.parametrize("factor", FACTORS)
def test_connection_closed_then_reconnect_refused_is_dead_at_once(factor):
    t = Timers().scaled(factor)
    h = pair(t, hosts=("10.0.0.1", "10.0.0.2"))
    a, b = h["a"], h["b"]
    h.advance(1.0 * factor, t.tick)
    h.kill("b")
    h.run()
    e = first(a, Kind.PEER_DEAD, b.node.me.addr)
    assert e is not None and e.at == h.now
    assert first(a, Kind.PEER_DISCONNECTED, b.node.me.addr).at == h.now
    assert first(a, Kind.PEER_TIMEOUT_DEAD) is None


@pytest.mark.parametrize("factor", FACTORS)
def test_without_fast_death_a_crashed_peer_is_dead_only_at_the_dead_limit(factor):
    t = Timers(fast_death=False).scaled(factor)
    h = pair(t, hosts=("10.0.0.1", "10.0.0.2"))
    a, b = h["a"], h["b"]
    baddr = b.node.me.addr
    h.advance(1.0 * factor, t.tick)
    last_heard = a.node.contacts[baddr].last_heard
    h.kill("b")
    h.run()
    assert first(a, Kind.PEER_DISCONNECTED, baddr) is not None
    # Dead once silent past the dead limit and the last call of its HUNG verdict stood CONFIRM (liveness.py).
    due = last_heard + t.dead + CONFIRM * t.unresponsive
    h.advance(due, t.tick)
    assert not a.node.is_dead(baddr)
    assert first(a, Kind.PEER_UNRESPONSIVE, baddr) is not None  # the connect warning came on the way
    h.advance(due + 2 * t.tick, t.tick)
    assert a.node.is_dead(baddr)


def test_a_refused_connect_to_a_peer_never_reached_is_not_a_death():
    """A peer listed by the bootstrap but not listening yet refuses connects: that is no crash."""
    t = Timers()
    h = Harness()
    a = h.add("a", peer(1), t)
    ghost = peer(2)
    h.call("a", lambda: a.node.add_peers([a.node.me, ghost], h.now))
    h.run()
    h.advance(t.dead, t.tick)
    assert not a.node.is_dead(ghost.addr)
    assert any(isinstance(x, core.Connect) for x in a.actions)


def test_a_crashed_peer_on_the_same_host_is_probed_and_pid_gone_is_death():
    t = Timers()
    h = pair(t)  # same host
    a, b = h["a"], h["b"]
    h.pause("b")
    assert callable(a.node.pid_gone)  # the driver's answer to a ProbePid
    h.call("a", lambda: a.node.pid_gone(b.node.me.addr, 3.0))
    e = first(a, Kind.PEER_DEAD, b.node.me.addr)
    assert e is not None and e.at == 3.0 and e.details == "process no longer exists"


def test_a_lost_connection_to_a_peer_on_the_same_host_asks_for_a_pid_probe():
    t = Timers()
    h = pair(t)
    a, b = h["a"], h["b"]
    h.cut("a", "b")
    h.run()
    assert core.ProbePid(b.node.me.addr, b.node.me.pid) in a.actions
    assert not a.node.is_dead(b.node.me.addr)  # the probe only asks; the peer is alive and reconnects


def test_without_fast_death_pid_gone_changes_nothing():
    t = Timers(fast_death=False)
    h = pair(t)
    a, b = h["a"], h["b"]
    h.cut("a", "b")
    h.run()
    assert not any(isinstance(x, core.ProbePid) for x in a.actions)
    before = beliefs(a.node)
    h.call("a", lambda: a.node.pid_gone(b.node.me.addr, h.now))
    assert beliefs(a.node) == before and not a.node.is_dead(b.node.me.addr)


# ----------------------------------------------------------------------------------------------------------------
# Pauses of this node are not its peers' fault


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("gap_in_dead_limits", [0.5, 2.0])
def test_a_long_gap_between_ticks_does_not_blame_the_peers(factor, gap_in_dead_limits):
    t = Timers().scaled(factor)
    h = pair(t)
    h.advance(2 * t.keepalive, t.tick)
    # The whole machine stops (both processes): nobody could have heard anybody.
    h.pause("a")
    h.pause("b")
    h.now += gap_in_dead_limits * t.dead
    h.resume("a")
    h.resume("b")
    h.advance(h.now + 3 * t.unresponsive, t.tick)
    for m in (h["a"], h["b"]):
        assert not m.kinds(
            Kind.PEER_UNRESPONSIVE, Kind.PEER_HUNG, Kind.PEER_KEEPALIVE_TIMEOUT, Kind.PEER_DEAD, Kind.PEER_DISCONNECTED
        )


@pytest.mark.parametrize("factor", FACTORS)
def test_after_its_own_pause_a_node_still_finds_a_silent_peer_one_ladder_step_later(factor):
    t = dataclasses.replace(Timers().scaled(factor), sweep=float("inf"))  # only keepalives on the links
    h = pair(t)
    a, b = h["a"], h["b"]
    h.advance(2 * t.keepalive, t.tick)
    h.pause("a")
    h.pause("b")
    h.now += 30 * factor
    resumed = h.now
    h.resume("a")  # b stays stopped
    h.advance(resumed + t.unresponsive + 2 * t.tick, t.tick, ["a"])
    e = first(a, Kind.PEER_UNRESPONSIVE, b.node.me.addr)
    # The pause itself is forgiven; the silence b had already accrued before it (under one keepalive) still counts.
    low = resumed + t.unresponsive - t.keepalive - 2 * t.tick
    assert e is not None and low < e.at <= resumed + t.unresponsive + 2 * t.tick


# ----------------------------------------------------------------------------------------------------------------
# Leaving, zombies


def test_a_peer_that_leaves_is_recorded_as_left_never_dead():
    t = Timers()
    h = trio(t)
    h.advance(2.0, t.tick)
    caddr = h["c"].node.me.addr
    h.call("c", lambda: h["c"].node.leave(h.now))
    h.run()
    h["c"].killed = True  # the process exits
    h.advance(h.now + 2 * t.dead, t.tick)
    for name in "ab":
        m = h[name]
        assert count(m, Kind.PEER_LEFT, caddr) == 1
        assert first(m, Kind.PEER_DEAD, caddr) is None
        assert m.node.has_left(caddr) and not m.node.is_dead(caddr)
        assert caddr not in m.node.link_peers()
        assert [p.addr for p in m.node.live_peers()] == [h["a"].node.me.addr, h["b"].node.me.addr]
    # a and b still talk to each other
    assert len(h["a"].ready_conns(h["b"].node.me.addr)) == 1
    assert not h["a"].kinds(Kind.PEER_UNRESPONSIVE) and not h["b"].kinds(Kind.PEER_UNRESPONSIVE)


def test_a_dead_peer_that_comes_back_is_told_it_is_dead_and_expels_itself_for_good():
    t = Timers().scaled(0.1)
    h = pair(t)
    a, b = h["a"], h["b"]
    baddr = b.node.me.addr
    h.pause("b")
    h.advance(t.dead + CONFIRM * t.unresponsive + 2 * t.tick, t.tick, ["a"])
    assert a.node.is_dead(baddr)
    table = a.node.table.hash
    h.resume("b")
    h.advance(h.now + 4 * t.connect_retry, t.tick)
    # a answered b's CONNINIT with its lists (naming b dead, for b to pass on), then YOU_ARE_DEAD ...
    told = [m for _, m in a.sent if isinstance(m, wire.PeersUpdate | wire.ConnInitAck)]
    i = next(i for i, m in enumerate(told) if isinstance(m, wire.ConnInitAck) and m.nack is wire.Nack.YOU_ARE_DEAD)
    assert i > 0 and isinstance(told[i - 1], wire.PeersUpdate) and b.node.me.key in told[i - 1].dead
    # ... and b declared itself dead and stopped.
    e = first(b, Kind.PEER_DEAD, baddr)
    assert e is not None and b.node.expelled
    assert not b.node.conns and not b.node.contacts
    # It cannot rejoin: it refuses and opens nothing, and a never takes it back.
    sent = len(b.actions)
    h.call("b", lambda: b.node.add_peers([a.node.me], h.now))
    h.call("b", lambda: b.node.accepted(-500, h.now))
    h.advance(h.now + t.dead, t.tick)
    # (a probes b now and then, as a dead process of its ring gap: b closes those connections too.)
    after = b.actions[sent:]
    assert core.Close(-500) in after and all(isinstance(x, core.Close) for x in after)
    assert a.node.is_dead(baddr) and a.node.table.hash == table
    assert count(a, Kind.PEER_DEAD, baddr) == 1
    assert baddr not in a.node.link_peers()


def test_a_dead_flood_about_oneself_expels_the_zombie():
    t = Timers()
    h = trio(t)
    b = h["b"]
    flood = wire.Flood(h["a"].node.me.addr, 999, wire.FloodKind.DEAD, b.node.me.addr, b.node.me.incarnation)
    (cid,) = [c.id for c in b.ready_conns(h["a"].node.me.addr)]
    h.call("b", lambda: b.node.received(cid, wire.encode(flood), h.now))
    assert b.node.expelled and first(b, Kind.PEER_DEAD, b.node.me.addr) is not None
    # It passed the verdict on before leaving: those linked to it were most likely cut off with it.
    passed = [m for _, m in b.sent if isinstance(m, wire.Flood) and m.flood_id == 999]
    assert len(passed) == 1 and passed[0].subject == b.node.me.addr


def test_a_death_is_flooded_to_peers_that_did_not_see_it():
    t = Timers().scaled(0.1)
    h = Harness()
    names = "abcde"
    for i, name in enumerate(names, start=1):
        h.add(name, peer(i, f"10.0.0.{i}"), t)
    h.introduce()
    h.advance(2 * t.keepalive, t.tick)
    caddr = h["c"].node.me.addr
    h.kill("c")
    h.run()
    for name in "abde":
        assert count(h[name], Kind.PEER_DEAD, caddr) == 1, name
        assert h[name].node.is_dead(caddr)
    # Only the neighbours found out themselves; the others heard the flood (no refused connect of their own).
    assert first(h["a"], Kind.PEER_DISCONNECTED, caddr) is None
    # the ring closed over the gap: b and d are now linked
    assert h["d"].node.me.addr in h["b"].node.link_peers()


def test_a_stale_verdict_about_another_incarnation_is_ignored():
    h = trio()
    b = h["b"]
    c = h["c"].node.me
    flood = wire.Flood(h["a"].node.me.addr, 999, wire.FloodKind.DEAD, c.addr, c.incarnation + 1)
    (cid,) = [x.id for x in b.ready_conns(h["a"].node.me.addr)]
    before = beliefs(b.node)
    h.call("b", lambda: b.node.received(cid, wire.encode(flood), h.now))
    assert not b.node.is_dead(c.addr) and beliefs(b.node) == before


@pytest.mark.parametrize("kind", [wire.FloodKind.DEAD, wire.FloodKind.HUNG, wire.FloodKind.SUSPECT])
def test_a_verdict_from_a_process_held_dead_is_neither_applied_nor_passed_on(kind):
    # A zombie's verdict, or the other side's of a healed partition carried by a process both sides hold alive.
    t = Timers().scaled(0.1)
    h = Harness()
    for i, name in enumerate("abcd", start=1):
        h.add(name, peer(i, f"10.0.0.{i}"), t)
    h.introduce()
    h.advance(2 * t.keepalive, t.tick)
    d = h["d"].node.me
    h.kill("d")
    h.run()
    a, b = h["a"], h["b"]
    assert a.node.is_dead(d.addr)
    subject = b.node.me  # about the very process that carries it, which a hears
    flood = wire.Flood(d.addr, 4242, kind, subject.addr, subject.incarnation, 0.01)
    (cid,) = [x.id for x in a.ready_conns(b.node.me.addr)]
    before, sent = beliefs(a.node)[:5], len(a.sent)  # (the contacts' last-heard times move: b spoke)
    h.call("a", lambda: a.node.received(cid, wire.encode(flood), h.now))
    assert beliefs(a.node)[:5] == before and not a.node.is_dead(subject.addr)
    assert not [m for _, m in a.sent[sent:] if isinstance(m, wire.Flood)]  # not passed on, not refuted


# ----------------------------------------------------------------------------------------------------------------
# Simultaneous connects


@pytest.mark.parametrize("seed", [None, *range(40)])
def test_simultaneous_connects_converge_on_one_connection(seed):
    t = Timers()
    h = pair(t, rng=None if seed is None else random.Random(seed))
    a, b = h["a"], h["b"]
    aaddr, baddr = a.node.me.addr, b.node.me.addr
    h.advance(1.0, t.tick)
    h.cut("a", "b")  # both sides lose the connection at once and both reconnect at once
    h.run()
    if seed is None:
        # In order: both see the close before either reconnect arrives, so both connect. (In a random order the
        # first reconnect may arrive before the other side noticed the close; then only one side connects.)
        assert sum(isinstance(x, core.Connect) for x in b.actions) == 1
    h.advance(h.now + 3 * t.connect_retry, t.tick)
    (ca,) = a.ready_conns(baddr)
    (cb,) = b.ready_conns(aaddr)
    assert h.ends[("a", ca.id)] == ("b", cb.id)  # the same connection on both sides
    assert a.node.contacts[baddr].conn == ca.id and b.node.contacts[aaddr].conn == cb.id
    disconnects = count(a, Kind.PEER_DISCONNECTED) + count(b, Kind.PEER_DISCONNECTED)
    h.advance(h.now + 3 * t.dead / 2, t.tick)
    assert count(a, Kind.PEER_DISCONNECTED) + count(b, Kind.PEER_DISCONNECTED) == disconnects
    assert not a.kinds(Kind.PEER_UNRESPONSIVE, Kind.PEER_DEAD) and not b.kinds(Kind.PEER_UNRESPONSIVE, Kind.PEER_DEAD)
    assert len(a.ready_conns(baddr)) == 1 and len(b.ready_conns(aaddr)) == 1


# ----------------------------------------------------------------------------------------------------------------
# Gathers


def _done(m) -> list[core.GatherDone]:
    return [x for x in m.actions if isinstance(x, core.GatherDone)]


def test_a_gather_returns_every_live_node_and_duplicates_are_answered_empty():
    t = Timers(sweep=float("inf"))  # no sweeper gathers beside the one under test
    h = trio(t)
    h.advance(2.0, t.tick)
    h.call("a", lambda: h["a"].node.start_gather(7, h.now))
    h.run()
    (done,) = _done(h["a"])
    snap = done.snapshot
    assert done.query_id == 7
    assert set(snap.responses) == {h[n].node.me.addr for n in "abc"}
    assert snap.timeouts == 0 and snap.missing() == [] and snap.collection_time == 0.0
    # b and c each forwarded to the other; the second copy of the request got an empty response.
    empties = [m for n in "bc" for _, m in h[n].sent if isinstance(m, wire.CollResp) and not m.entries]
    assert len(empties) == 2
    assert not h["a"].node.gathers and not h["b"].node.gathers and not h["c"].node.gathers


def test_a_repeated_request_on_the_same_connection_is_answered_empty():
    h = trio()
    b = h["b"]
    (cid,) = [c.id for c in b.ready_conns(h["a"].node.me.addr)]
    req = wire.encode(wire.CollReq(h["a"].node.me.addr, 41, 5000))
    h.call("b", lambda: b.node.received(cid, req, h.now))
    sent = len(b.sent)
    actions = b.node.received(cid, req, h.now)
    (send,) = actions
    assert send.conn_id == cid
    assert wire.decode_body(send.data[4:]) == wire.collresp(h["a"].node.me.addr, 41, 0, ())
    assert len(b.sent) == sent


def test_a_gather_on_a_lone_node_finishes_at_once():
    h = Harness()
    a = h.add("a", peer(1))
    h.call("a", lambda: a.node.start_gather(1, 5.0))
    (done,) = _done(a)
    assert set(done.snapshot.responses) == {a.node.me.addr} and done.snapshot.timeouts == 0


@pytest.mark.parametrize("factor", FACTORS)
def test_a_leg_that_goes_silent_is_counted_as_a_timeout(factor):
    t = Timers().scaled(factor)
    h = trio(t)
    h.advance(2 * t.keepalive, t.tick)
    h.pause("c")  # c hangs: its connections stay up but it never answers
    start = h.now
    h.call("a", lambda: h["a"].node.start_gather(3, h.now, timeout=float("inf")))
    h.run()
    assert not _done(h["a"])
    h.advance(start + t.unresponsive + 2 * t.keepalive, t.tick, ["a", "b"])
    (done,) = _done(h["a"])
    snap = done.snapshot
    assert set(snap.responses) == {h["a"].node.me.addr, h["b"].node.me.addr}
    assert [p.addr for p in snap.missing()] == [h["c"].node.me.addr]
    assert snap.timeouts == 2  # a's leg to c and b's leg to c
    # A later gather skips the silent peer and is quick, with no timeout.
    h.call("a", lambda: h["a"].node.start_gather(4, h.now))
    h.run()
    later = _done(h["a"])[-1].snapshot
    assert later.timeouts == 0 and later.collection_time == 0.0
    assert [p.addr for p in later.missing()] == [h["c"].node.me.addr]


def test_a_gather_ends_at_the_hard_limit_even_if_a_leg_still_looks_healthy():
    # Liveness far beyond the gather's limits, so only the gather's own clock can end it.
    t = Timers(unresponsive=1000, hang=2000, reset=3000, dead=6000, idle=6000)
    h = trio(t)
    h.advance(2.0, t.tick)
    h.pause("c")
    start = h.now
    timeout = 1.0
    h.call("a", lambda: h["a"].node.start_gather(5, h.now, timeout=timeout))
    h.run()
    limit = start + timeout + t.gather_extra
    h.advance(limit - 1e-6, t.tick, ["a", "b"])
    assert not _done(h["a"]), "ended before timeout + extra"
    h.tick(limit, ["a", "b"])
    (done,) = _done(h["a"])
    assert done.snapshot.timeouts >= 1 and done.snapshot.collection_time == timeout + t.gather_extra
    assert h["c"].node.me.addr in {p.addr for p in done.snapshot.missing()}


def test_a_gather_with_no_timeout_waits_on_a_healthy_looking_leg():
    t = Timers(unresponsive=1000, hang=2000, reset=3000, dead=6000, idle=6000)
    h = trio(t)
    h.advance(2.0, t.tick)
    h.pause("c")
    h.call("a", lambda: h["a"].node.start_gather(6, h.now, timeout=float("inf")))
    h.run()
    h.advance(h.now + 100.0, 1.0, ["a", "b"])
    assert not _done(h["a"])
    h.resume("c")
    h.advance(h.now + 1.0, t.tick)
    (done,) = _done(h["a"])
    assert set(done.snapshot.responses) == {h[n].node.me.addr for n in "abc"}


def test_a_gather_whose_connection_closes_counts_a_timeout():
    t = Timers()
    h = trio(t)
    h.advance(2.0, t.tick)
    h.pause("c")
    h.call("a", lambda: h["a"].node.start_gather(8, h.now))
    h.run()
    h.kill("c")
    h.run()
    (done,) = _done(h["a"])
    # The gather ends on the close (both legs to c cut), before the refused reconnect makes c dead: c is missing.
    assert done.snapshot.timeouts == 2
    assert [p.addr for p in done.snapshot.missing()] == [h["c"].node.me.addr]
    assert h["a"].node.is_dead(h["c"].node.me.addr)


# ----------------------------------------------------------------------------------------------------------------
# The peer table is gossiped


@pytest.mark.parametrize("who_knows_more", ["connector", "acceptor"])
def test_a_table_hash_mismatch_trades_full_tables_until_the_hashes_agree(who_knows_more):
    t = Timers()
    h = Harness()
    a = h.add("a", peer(1), t)
    b = h.add("b", peer(2), t)
    d = h.add("d", peer(9, "10.0.0.9"), t)
    both = [a.node.me, b.node.me]
    knows_more, knows_less = ("a", "b") if who_knows_more == "connector" else ("b", "a")
    h.call(knows_more, lambda: h[knows_more].node.add_peers(both + [d.node.me], h.now))
    h.call(knows_less, lambda: h[knows_less].node.add_peers(both, h.now))
    h.run()
    h.advance(3 * t.keepalive, t.tick)
    assert d.node.me.addr in h[knows_less].node.table
    assert a.node.table.hash == b.node.table.hash
    full = [m for n in "ab" for _, m in h[n].sent if isinstance(m, wire.PeersUpdate) and m.full]
    assert full, "no full table was traded"
    assert first(h[knows_less], Kind.PEER_NEW, d.node.me.addr) is not None
    # Once equal, keepalives carry equal hashes and no more tables move.
    n_full = len(full)
    h.advance(h.now + 5 * t.keepalive, t.tick)
    assert len([m for n in "ab" for _, m in h[n].sent if isinstance(m, wire.PeersUpdate) and m.full]) == n_full


def test_new_peers_are_passed_on_as_a_diff():
    t = Timers()
    h = trio(t)
    h.advance(1.0, t.tick)
    newcomer = peer(50, "10.0.0.50")
    h.call("a", lambda: h["a"].node.add_peers([newcomer], h.now))
    h.run()
    for n in "abc":
        assert newcomer.addr in h[n].node.table
        assert count(h[n], Kind.PEER_NEW, newcomer.addr) == 1
    diffs = [m for _, m in h["a"].sent if isinstance(m, wire.PeersUpdate) and not m.full]
    assert diffs and all(m.peers == (newcomer,) for m in diffs)
    assert len({h[n].node.table.hash for n in "abc"}) == 1


def test_the_dead_list_is_synced_by_hash_when_a_flood_was_missed():
    t = Timers()
    h = trio(t)
    h.advance(1.0, t.tick)
    a, b = h["a"], h["b"]
    caddr = h["c"].node.me.addr
    # a learns c is dead by a route that b never sees (no flood to b).
    a.node.dead.add(h["c"].node.me.key)
    a.node.verdicts.dead_hash = a.node.verdicts.gone_hash()
    h.advance(h.now + 3 * t.keepalive, t.tick, ["a", "b"])
    assert b.node.is_dead(caddr) and first(b, Kind.PEER_DEAD, caddr) is not None
    assert a.node.dead_hash == b.node.dead_hash


@pytest.mark.parametrize("phase", ["auth", "init"])
def test_an_outgoing_connection_closed_during_the_handshake_is_retried(phase):
    """The acceptor may drop a connection before it is ready (its handshake timer, its pending limit, a restart).
    The connector must retry, not wait forever on a connection that no longer exists and in the end declare a live
    peer dead. (Found by this test: ``closed`` left the contact pointing at the closed connection.)"""
    t = Timers()
    me, other = peer(1), peer(2)
    n = core.Node(me, SECRET, t, rng=random.Random(1))
    n.start(0.0)
    (connect,) = [x for x in n.add_peers([me, other], 0.0) if isinstance(x, core.Connect)]
    cid = connect.conn_id
    (hello,) = n.connected(cid, 0.0)
    if phase == "init":
        acceptor = core.Node(other, SECRET, t, rng=random.Random(2))
        acceptor.accepted(-1, 0.0)
        (challenge,) = acceptor.received(-1, hello.data, 0.0)
        proof_and_init = n.received(cid, challenge.data, 0.0)
        assert [type(wire.decode_body(x.data[4:])) for x in proof_and_init] == [wire.Proof, wire.ConnInit]
        assert n.conns[cid].state is core.ConnState.INIT
    n.closed(cid, 0.1)
    assert n.contacts[other.addr].conn is None
    connects = []
    now = 0.1
    while now < t.dead - t.tick:
        now += t.tick
        for x in n.tick(now):
            if isinstance(x, core.Connect):
                connects.append(now)
                n.connect_failed(x.conn_id, now, refused=False)  # the retry times out: no verdict from that
    assert connects and connects[0] <= 0.1 + t.connect_retry + t.tick
    assert len(connects) >= (t.dead - 1) / (t.connect_retry + t.tick)
    assert not n.is_dead(other.addr)


def test_a_hang_verdict_is_refuted_only_by_a_keepalive_stamped_well_after_the_origins_last_one():
    """docs/architecture.md 2.7: the HUNG flood carries the subject's clock as last heard by its origin; a node holding
    a keepalive from the subject stamped more than REFUTE hang limits later refutes it (a RECOVERED flood, stamped),
    and a verdict whose origin never had a keepalive from the subject (UNSTAMPED) makes no claim to refute."""
    from rasd.core.liveness import REFUTE, UNSTAMPED

    t = Timers()
    h = trio(t)
    h.advance(3 * t.keepalive, t.tick)
    a, b, c = h["a"], h["b"], h["c"]
    conn = a.ready_conns(b.node.me.addr)[0]
    clock = a.node.links.stamp(c.node.me.key)
    assert clock != UNSTAMPED

    def hung(flood_id: int, stamp: float) -> list[wire.Flood]:
        sent = len(a.sent)
        flood = wire.Flood(b.node.me.addr, flood_id, wire.FloodKind.HUNG, c.node.me.addr, c.node.me.incarnation, stamp)
        h.call("a", lambda: a.node.received(conn.id, wire.encode(flood), h.now))
        return [m for _, m in a.sent[sent:] if isinstance(m, wire.Flood) and m.kind is wire.FloodKind.RECOVERED]

    # Stamped about when a last heard c itself: no proof of anything later, the verdict holds here.
    assert hung(30_001, clock - 0.5 * REFUTE * t.hang) == []
    assert c.node.me.key in a.node.hung
    # Stamped well before a's last keepalive from c: refuted, with a's stamp.
    refutes = hung(30_002, clock - 2 * REFUTE * t.hang)
    assert refutes and {(m.flood_id, m.stamp) for m in refutes} == {(refutes[0].flood_id, clock)}  # one flood
    # Unstamped (the origin never had a keepalive from c): no claim, nothing to refute.
    assert hung(30_003, UNSTAMPED) == []
