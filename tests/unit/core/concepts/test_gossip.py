"""gossip.py alone: merging entries into the table, syncing whole tables by hash, and applying a table update."""

from rasd.core import wire
from rasd.core.effects import Broadcast, Dead, Expel, Left, Notify, Relink, Retire, Say
from rasd.core.events import Kind
from rasd.core.gossip import Gossip
from rasd.core.peers import PeerKey

from .world import FakeWorld, peer

ME, P2, P3, P4, P5, P6, P7 = (peer(i) for i in range(1, 8))
P2_NEW = peer(2, incarnation=9002)


def _gossip(*known):
    world = FakeWorld(ME)
    g = Gossip(world, ME)
    g.table.merge(known)
    return world, g


def test_a_new_entry_is_announced_retires_what_it_replaces_spreads_and_relinks():
    _, g = _gossip(P2)
    assert g.merged([P2, P2_NEW, P3], spread=True, except_conn=5, relink=True, now=1.0) == [
        Notify(Kind.PEER_NEW, P2_NEW.key),
        Notify(Kind.PEER_NEW, P3.key),
        Retire(frozenset({P2.addr, P3.addr})),
        Broadcast(wire.PeersUpdate((P2_NEW, P3), (), (), full=False), 5),
        Relink(),
    ]
    assert g.table.get(P2.addr) == P2_NEW and g.table.entry(P2.key) == P2


def test_merging_nothing_new_says_nothing():
    _, g = _gossip(P2)
    assert g.merged([ME, P2], spread=True, except_conn=None, relink=True, now=1.0) == []
    assert g.merged([P3], spread=False, except_conn=None, relink=False, now=1.0) == [
        Notify(Kind.PEER_NEW, P3.key),
        Retire(frozenset({P3.addr})),
    ]


def test_sync_sends_the_whole_table_once_per_state_of_our_hashes():
    world, g = _gossip(P2)
    conn = world.add_conn(7, P2)
    full = wire.PeersUpdate((ME, P2), (), (), full=True)
    assert g.sync(conn, g.table.hash, world.dead_hash, 1.0) == []  # the same hashes: nothing to send
    assert g.on_keepalive(conn, wire.Keepalive(123, world.dead_hash, True), 1.0) == [Say(7, full)]
    assert g.on_keepalive(conn, wire.Keepalive(123, world.dead_hash, True), 2.0) == []  # sent for this state
    g.table.merge([P3])
    # Our table just changed: in flux, the connection that had a whole table waits until we are still for a
    # keepalive interval (the diffs we pass on carry what is new meanwhile).
    assert g.sync(conn, 123, world.dead_hash, 3.0) == []
    assert g.sync(conn, 123, world.dead_hash, 4.0) == [Say(7, wire.PeersUpdate((ME, P2, P3), (), (), full=True))]
    world.dead.add(P3.key)
    world.dead_hash = 99
    assert g.sync(conn, 123, 0, 5.0) == []
    assert g.sync(conn, 123, 0, 6.0) == [Say(7, wire.PeersUpdate((ME, P2, P3), (P3.key,), (), full=True))]
    assert g.sync(conn, 123, 0, 7.0) == []
    g.forget_conn(7)  # a new connection with that id starts afresh: its first mismatch gets the table at once
    assert g.sync(conn, 123, 0, 7.5) == [Say(7, wire.PeersUpdate((ME, P2, P3), (P3.key,), (), full=True))]


def test_a_storm_of_new_entries_is_passed_on_once_a_tick():
    world, g = _gossip(P2)
    world.add_conn(7, P2)
    world.add_conn(8, P3)
    first = g.merged([P4], spread=True, except_conn=7, relink=False, now=1.0)
    assert Broadcast(wire.PeersUpdate((P4,), (), (), full=False), 7) in first  # the first goes out at once
    later = g.merged([P5], spread=True, except_conn=8, relink=False, now=1.1)
    assert not [e for e in later if isinstance(e, (Broadcast, Say))]  # within a tick: it waits
    assert g.flush(1.2) == [Broadcast(wire.PeersUpdate((P5,), (), (), full=False), 8)]
    assert g.flush(1.3) == []
    g.merged([P6], spread=True, except_conn=7, relink=False, now=1.3)
    g.merged([P7], spread=True, except_conn=8, relink=False, now=1.35)
    # Entries from two connections: each connection gets those it did not bring.
    assert g.flush(1.5) == [
        Say(7, wire.PeersUpdate((P7,), (), (), full=False)),
        Say(8, wire.PeersUpdate((P6,), (), (), full=False)),
    ]


def test_the_full_update_lists_former_entries_and_sorted_verdicts():
    world, g = _gossip(P3, P2, P2_NEW)
    world.dead.update({P3.key, P2.key})
    world.left.add(P4.key)
    assert g.send_table(4) == [
        Say(4, wire.PeersUpdate((ME, P2, P2_NEW, P3), (P2.key, P3.key), (P4.key,), full=True)),
    ]


def test_an_update_that_holds_us_dead_is_passed_on_and_expels_us():
    world, g = _gossip(P2)
    conn = world.add_conn(7, P2)
    for msg in (
        wire.PeersUpdate((ME, P2, P3), (ME.key,), (), full=True),
        wire.PeersUpdate((), (), (ME.key,), full=True),
    ):
        assert g.on_peers_update(conn, msg, 1.0) == [Broadcast(msg, 7), Expel()]
    assert P3.addr not in g.table  # nothing of it applied


def test_an_update_applies_its_lists_then_retires_then_spreads_and_relinks():
    world, g = _gossip(P2, P3)
    world.dead.add(P4.key)  # already dead here
    stranger = PeerKey(peer(9).addr, 1)
    msg = wire.PeersUpdate((ME, P2, P2_NEW, P4), dead=(P4.key, stranger, P3.key), left=(P2.key, stranger), full=True)
    assert g.on_peers_update(world.add_conn(7, P2_NEW), msg, 1.0) == [
        Notify(Kind.PEER_NEW, P2_NEW.key),
        Notify(Kind.PEER_NEW, P4.key),
        Left(P2.key),  # listed departed: recorded LEFT before the retire rule could call it dead
        Dead(P3.key, None, flood=False),
        Retire(frozenset({P2.addr, P4.addr})),
        Broadcast(wire.PeersUpdate((P2_NEW, P4), (), (), full=False), 7),
        Relink(),
    ]


def test_an_update_with_nothing_new_changes_nothing():
    world, g = _gossip(P2)
    world.left.add(P2.key)
    msg = wire.PeersUpdate((ME, P2), (), (P2.key,), full=False)
    assert g.on_peers_update(world.add_conn(7, P2), msg, 1.0) == [Retire(frozenset())]


def test_adopt_takes_a_whole_table():
    world, g = _gossip()
    world.merge(P2, P3)
    g.adopt(world.table)
    assert list(g.table) == [ME, P2, P3]
