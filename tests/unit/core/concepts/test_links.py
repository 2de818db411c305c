"""links.py alone: the contacts it keeps (relink and the ring), connecting, hearing, the liveness ladder's rungs,
keepalives and idle connections, as effects."""

from rasd.core import wire
from rasd.core.config import Timers
from rasd.core.connections import ConnState
from rasd.core.effects import (
    ClimbOn,
    Dial,
    Drop,
    Hung,
    HungEnded,
    Notify,
    Originate,
    ProbeLocal,
    Purge,
    Purpose,
    Refused,
    Relink,
    SayFrame,
    Silent,
)
from rasd.core.events import Kind
from rasd.core.links import Links
from rasd.core.liveness import REFUTE, UNSTAMPED, Contact

from .world import FakeWorld, peer

T = Timers()
P = {i: peer(i) for i in range(1, 7)}  # one host, table order by i


def _links(me: int, *others: int, **world_fields):
    world = FakeWorld(P[me], [P[i] for i in others or range(1, 7)])
    world.express_links = False
    for name, value in world_fields.items():
        setattr(world, name, value)
    return world, Links(world)


def _contact(links: Links, i: int, conn: int | None = None, *, heard: float = 0.0, **fields) -> Contact:
    """Put a contact for process ``i`` into the links' own state (a link made earlier), heard at ``heard``."""
    c = Contact(addr=P[i].addr, last_heard=heard, wanted_since=0.0, incarnation=P[i].incarnation, conn=conn)
    c.heard_ever = conn is not None
    for name, value in fields.items():
        setattr(c, name, value)
    links.contacts[c.addr] = c
    return c


def _keepalive(world: FakeWorld, wanted: bool, now: float) -> bytes:
    clock = now - now % world.timers.keepalive
    return wire.keepalive_frame(world.table.hash, world.dead_hash, wanted, clock)


# --- which peers ---------------------------------------------------------------------------------------------------


def test_relink_links_both_ring_neighbours_in_table_order_and_the_lower_address_dials_first():
    world, links = _links(3)
    links.relink(2.0)
    assert list(links.contacts) == [P[2].addr, P[4].addr]
    below, above = links.contacts[P[2].addr], links.contacts[P[4].addr]
    assert below.next_connect == 2.0 + T.connect_warn  # P2 is lower: it dials us first
    assert above.next_connect == 2.0  # we are lower than P4: we dial now
    assert (above.incarnation, above.disconnected_since, above.conn, above.heard_ever) == (
        P[4].incarnation,
        2.0,
        None,
        False,
    )


def test_the_ring_wraps_and_skips_gone_processes():
    world, links = _links(6)
    links.relink(0.0)
    assert list(links.contacts) == [P[1].addr, P[5].addr]  # wraps around to P1
    world.dead.add(P[5].key)
    world.left.add(P[1].key)
    links.relink(1.0)
    assert list(links.contacts) == [P[2].addr, P[4].addr]


def test_relink_adopts_an_existing_connection():
    world, links = _links(3)
    world.add_conn(8, P[4])  # READY
    world.add_conn(9, P[2], ConnState.INIT)
    links.relink(0.0)
    above, below = links.contacts[P[4].addr], links.contacts[P[2].addr]
    assert (above.conn, above.heard_ever, above.disconnected_since) == (8, True, None)
    assert (below.conn, below.heard_ever, below.disconnected_since) == (9, False, None)


def test_relink_does_nothing_once_expelled_or_leaving():
    for field in ("expelled", "leaving"):
        _, links = _links(3, **{field: True})
        links.relink(0.0)
        assert links.contacts == {}


def test_seed_121_an_unreached_link_is_bridged_by_a_fallback_that_dials_at_once():
    # P4's lower neighbour P3 never connected (cut off before we linked, or not started): after connect_warn the
    # UNREACHED rung marks it, silently, and relinks: P2 becomes a fallback, and a fallback is dialled at once even
    # though its address is lower than ours (sweep seed 121: the walk stopped at a peer never reached).
    world, links = _links(4)
    links.relink(0.0)
    _contact(links, 5, conn=5, heard=T.connect_warn + 1)  # P5 connected and heard
    world.add_conn(5, P[5], at=T.connect_warn + 1)
    assert links.climb(T.connect_warn) == []  # not past connect_warn yet
    assert links.climb(T.connect_warn + 1) == []  # no event: not a fault we know of
    assert links.contacts[P[3].addr].unreached
    assert list(links.contacts) == [P[3].addr, P[5].addr, P[2].addr]
    assert links.contacts[P[2].addr].next_connect == T.connect_warn + 1
    assert links.connect_due(T.connect_warn + 1) == [Dial(P[3].addr, Purpose.LINK), Dial(P[2].addr, Purpose.LINK)]


def test_seed_121_hearing_an_unreached_link_relinks_without_an_event():
    world, links = _links(4)
    c = _contact(links, 3, conn=1, unreached=True)
    conn = world.add_conn(1, P[3])
    assert links.heard(conn, 7.0) == [Relink()]
    assert not c.unreached and c.last_heard == 7.0


def test_seed_5152_a_silent_host_is_skipped_whole_past_two_unhealthy_processes():
    # Hosts: A (us), B (three processes), C, D. B1 and B2 are delayed; B3 we hold no link to, so it is not known
    # healthy: the walk skips the rest of host B and its fallback is C1 (sweep seed 5152: walking a cut-off host one
    # process per connect_warn kept the walker off every gather).
    a1 = peer(1, "10.0.0.1")
    b1, b2, b3 = peer(1, "10.0.0.2"), peer(2, "10.0.0.2"), peer(3, "10.0.0.2")
    c1, d1 = peer(1, "10.0.0.3"), peer(1, "10.0.0.4")
    world = FakeWorld(a1, [b1, b2, b3, c1, d1])
    world.express_links = False
    links = Links(world)
    for i, b in enumerate((b1, b2), start=1):
        links.contacts[b.addr] = Contact(b.addr, 0.0, 0.0, b.incarnation, conn=i, heard_ever=True, delayed=True)
    links.relink(1.0)
    assert set(links.contacts) == {b1.addr, b2.addr, c1.addr, d1.addr}
    # B3 heard and not delayed is known healthy: kept, and the walk ends there.
    links.contacts[b3.addr] = Contact(b3.addr, 0.0, 0.0, b3.incarnation, conn=3, heard_ever=True)
    links.relink(2.0)
    assert set(links.contacts) == {b1.addr, b2.addr, b3.addr, d1.addr}
    # A link we hold but never heard is not known healthy either.
    links.contacts[b3.addr].heard_ever = False
    links.relink(3.0)
    assert set(links.contacts) == {b1.addr, b2.addr, c1.addr, d1.addr}


def test_forget_drops_only_the_contact_of_that_incarnation():
    _, links = _links(3)
    links.relink(0.0)
    links.forget(peer(4, incarnation=1).key)
    assert P[4].addr in links.contacts
    links.forget(P[4].key)
    assert list(links.contacts) == [P[2].addr]
    links.clear()
    assert links.contacts == {}


# --- connecting ----------------------------------------------------------------------------------------------------


def test_connect_due_dials_each_contact_once_per_retry_interval():
    _, links = _links(3)
    links.relink(0.0)
    assert links.connect_due(0.0) == [Dial(P[4].addr, Purpose.LINK)]
    assert links.connect_due(0.5) == []
    assert links.connect_due(T.connect_retry) == [Dial(P[4].addr, Purpose.LINK)]
    assert links.connect_due(T.connect_warn) == [Dial(P[2].addr, Purpose.LINK), Dial(P[4].addr, Purpose.LINK)]
    links.dialled(P[4].addr, 11)
    assert links.contacts[P[4].addr].conn == 11
    assert links.connect_due(100.0) == [Dial(P[2].addr, Purpose.LINK)]


def test_introduce_dials_unknown_seeds_once_and_hurries_known_contacts():
    world, links = _links(3)
    links.relink(0.0)
    world.add_conn(1, P[6])
    far = peer(9)
    effects = links.introduce([P[3], P[2], far, far, P[6]], 1.0)
    assert effects == [Dial(far.addr, Purpose.INTRODUCE)]
    assert links.contacts[P[2].addr].next_connect == 1.0


def test_a_refused_connect_retries_later_and_reports_the_refusal():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, heard=0.0, heard_ever=False)
    conn = world.add_conn(7, P[4], ConnState.CONNECTING)
    assert links.connect_failed(conn, refused=True, now=2.0) == [Refused(P[4].key, False)]
    assert (c.conn, c.next_connect, c.disconnected_since) == (None, 2.0 + T.connect_retry, 2.0)
    c.conn = 8
    c.lost_connection = True
    other = world.add_conn(8, P[4], ConnState.CONNECTING)
    assert links.connect_failed(other, refused=True, now=3.0) == [Refused(P[4].key, True)]
    c.conn = 9
    assert links.connect_failed(world.add_conn(9, P[4], ConnState.CONNECTING), refused=False, now=4.0) == []
    assert links.connect_failed(world.add_conn(10, P[4], ConnState.CONNECTING), refused=True, now=5.0) == []  # not its


def test_losing_a_ready_connection_reconnects_at_once_and_probes_the_pid():
    world, links = _links(3)
    c = _contact(links, 4, conn=7)
    conn = world.add_conn(7, P[4])
    assert links.closed(conn, 3.0) == [
        Notify(Kind.PEER_DISCONNECTED, P[4].addr, "peer closed connection during receive operation"),
        ProbeLocal(P[4].addr),
    ]
    assert (c.conn, c.lost_connection, c.next_connect, c.disconnected_since) == (None, True, 3.0, 3.0)
    world.dead.add(P[2].key)
    _contact(links, 2, conn=8)
    assert links.closed(world.add_conn(8, P[2]), 3.0) == []  # dead already: nothing to tell


def test_a_connection_closed_before_it_was_ready_retries_and_probes():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, heard_ever=False)
    assert links.closed(world.add_conn(7, P[4], ConnState.AUTH), 1.0) == [ProbeLocal(P[4].addr)]
    assert (c.conn, c.lost_connection, c.next_connect) == (None, True, 1.0 + T.connect_retry)
    assert links.closed(world.add_conn(3, None, ConnState.AUTH, outgoing=False), 1.0) == []


def test_attach_and_detach_move_the_contact_between_connections():
    world, links = _links(3)
    c = _contact(links, 4, conn=None, heard_ever=False, disconnected_since=0.0, lost_connection=True)
    ready = world.add_conn(7, P[4])
    assert links.attach(ready, 2.0) == []
    assert (c.conn, c.disconnected_since, c.lost_connection, c.heard_ever, c.last_heard) == (7, None, False, True, 2.0)
    world.add_conn(8, P[4])
    del world.conns[7]
    links.detach(ready, replaced=True, now=3.0)
    assert (c.conn, c.disconnected_since) == (8, None)
    del world.conns[8]
    links.detach(world.add_conn(8, P[4]), replaced=False, now=4.0)
    assert (c.conn, c.disconnected_since) == (None, 4.0)
    assert links.attach(world.add_conn(9, peer(9)), 5.0) == []  # no contact for that peer


# --- hearing, clocks -----------------------------------------------------------------------------------------------


def test_hearing_a_delayed_hung_link_ends_both_and_tells_the_job():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, delayed=True, hung=True)
    conn = world.add_conn(7, P[4])
    links.on_keepalive(conn, wire.Keepalive(0, 0, True, clock=42.0), 1.0)
    assert links.heard(conn, 30.0) == [
        HungEnded(P[4].key),
        Notify(Kind.PEER_RECOVERED, P[4].key, "peer responding again"),
        Originate(wire.FloodKind.RECOVERED, P[4].key, 42.0),
        Relink(),
    ]
    assert (c.delayed, c.hung, c.last_heard) == (False, False, 30.0)
    assert links.heard_at[P[4].addr] == 30.0
    assert links.heard(conn, 31.0) == []  # healthy: nothing to say


def test_hearing_a_link_another_node_holds_hung_refutes_it():
    world, links = _links(3)
    _contact(links, 4, conn=7)
    world.hung.add(P[4].key)  # a flooded verdict, not ours
    assert links.heard(world.add_conn(7, P[4]), 5.0) == [
        HungEnded(P[4].key),
        Notify(Kind.PEER_RECOVERED, P[4].key, "peer responding again"),
        Originate(wire.FloodKind.RECOVERED, P[4].key, UNSTAMPED),
    ]


def test_hearing_a_delayed_link_on_another_connection_does_not_end_the_delay():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, delayed=True)
    assert links.heard(world.add_conn(8, P[4]), 5.0) == []
    assert c.delayed and c.last_heard == 5.0
    assert links.heard(world.add_conn(9, None, outgoing=False), 5.0) == []


def test_keepalive_clocks_stamps_and_the_refutation_rules():
    world, links = _links(3)
    conn = world.add_conn(7, P[4])
    key = P[4].key
    assert links.stamp(key) == UNSTAMPED and not links.fresher(key, 1.0)
    links.on_keepalive(conn, wire.Keepalive(0, 0, True, clock=100.0), 0.0)
    links.on_keepalive(conn, wire.Keepalive(0, 0, True, clock=90.0), 0.0)  # an older frame never moves it back
    assert links.stamp(key) == 100.0
    margin = REFUTE * T.hang
    assert links.fresher(key, 100.0 - margin - 0.1) and not links.fresher(key, 100.0 - margin)
    assert not links.fresher(key, UNSTAMPED)
    assert links.vouch(key, 200.0, 1.0) is None
    assert links.refuted(key, 200.0 - margin - 0.1) and not links.refuted(key, 200.0 - margin)
    assert not links.refuted(key, UNSTAMPED)


def test_vouch_restarts_the_silence_clock_only_for_a_fresh_proof_about_our_link():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, hung=True)
    links.on_keepalive(world.add_conn(7, P[4]), wire.Keepalive(0, 0, True, clock=100.0), 0.0)
    links.vouch(P[4].key, UNSTAMPED, 10.0)
    links.vouch(P[4].key, 100.0 + REFUTE * T.hang, 10.0)  # not fresher than our own keepalive by REFUTE
    assert (c.vouched, c.hung) == (float("-inf"), True)
    links.vouch(P[4].key, 106.0, 11.0)
    assert (c.vouched, c.hung) == (11.0, False)
    links.answered(peer(4, incarnation=1).key, 12.0)  # another incarnation: not our link
    assert c.vouched == 11.0
    links.answered(P[4].key, 13.0)
    assert c.vouched == 13.0


def test_heard_within_and_still_silent():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, heard=0.0)
    links.heard(world.add_conn(7, P[4]), 10.0)
    assert links.heard_within(P[4].key, 5.0, 15.0) and not links.heard_within(P[4].key, 5.0, 15.1)
    assert not links.heard_within(peer(4, incarnation=1).key, 5.0, 10.0)  # not the current process there
    assert links.still_silent(P[4].key, 10.0 + T.dead) is None
    assert links.still_silent(P[4].key, 10.0 + T.dead + 1) == T.dead + 1
    c.vouched = 20.0
    assert links.still_silent(P[4].key, 10.0 + T.dead + 1) is None
    assert links.still_silent(P[2].key, 1000.0) is None  # not a link of ours


# --- the ladder ----------------------------------------------------------------------------------------------------


def test_climb_skips_a_ready_link_heard_lately():
    world, links = _links(3)
    _contact(links, 4, conn=7, heard=10.0)
    world.add_conn(7, P[4])
    assert links.climb(10.0 + T.unresponsive) == []


def test_the_unresponsive_rung_flags_the_link_purges_its_gathers_and_adds_a_fallback():
    world, links = _links(3)
    links.relink(0.0)
    c = links.contacts[P[4].addr]
    c.conn, c.heard_ever = 7, True
    world.add_conn(7, P[4])
    _contact(links, 2, conn=8, heard=T.unresponsive + 1)  # P2 ready and heard
    world.add_conn(8, P[2])
    effects = links.climb(T.unresponsive + 1)
    assert effects[:3] == [
        Notify(Kind.PEER_UNRESPONSIVE, P[4].addr, "peer not responding for 6s (keepalive warning)"),
        Purge(7),
        Relink(),
    ]
    assert effects[3:] in ([], [ClimbOn()])  # the climb stops at the first contact that asks something of others
    assert c.delayed and links.is_delayed(P[4].addr)
    links.relink(T.unresponsive + 1)  # the Relink, carried out
    assert list(links.contacts) == [P[2].addr, P[4].addr, P[5].addr]  # P5 bridges P4


def test_the_connect_timeout_rung_flags_a_link_that_cannot_reconnect():
    _, links = _links(3)
    c = _contact(links, 4, heard_ever=True, disconnected_since=0.0, heard=0.0)
    assert links.climb(T.connect_warn + 1) == [
        Notify(Kind.PEER_UNRESPONSIVE, P[4].addr, "peer not responding for 6s (connect timeout)"),
        Relink(),
    ]
    assert c.delayed


def test_the_hung_rung_floods_our_verdict_and_refreshes_it():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, delayed=True)
    conn = world.add_conn(7, P[4])
    links.on_keepalive(conn, wire.Keepalive(0, 0, True, clock=0.5), 0.0)
    assert links.climb(T.hang + 1) == [
        Hung(P[4].key, "peer silent for 11s"),
        Originate(wire.FloodKind.HUNG, P[4].key, 0.5),
    ]
    assert (c.hung, c.hung_since, c.hung_refreshed) == (True, T.hang + 1, T.hang + 1)
    assert links.holds_hung(P[4].key) and not links.holds_hung(peer(4, incarnation=1).key)
    assert links.climb(T.hang + 2) == []
    assert links.climb(T.hang + 1 + 2 * T.hang)[0] == Hung(P[4].key, "peer silent for 31s")  # HUNG_REFRESH
    assert c.hung_since == T.hang + 1


def test_the_hung_rung_waits_while_the_jobs_collectives_vouch_for_the_peer():
    """witness.py: collectives that need every process completed here since the peer went silent: its training runs,
    so no verdict; the silence counts again from now, and without such work the next check flags it."""
    world, links = _links(3)
    c = _contact(links, 4, conn=7, delayed=True)
    world.add_conn(7, P[4])
    world.moved = (12, 0xBBF5)
    (withheld,) = links.climb(T.hang + 1)
    assert withheld == Notify(
        Kind.PEER_UNRESPONSIVE,
        P[4].key,
        "peer silent for 11s, but 12 collectives that need it completed here since on communicator "
        "000000000000bbf5: its training runs, no verdict",
    )
    assert not c.hung and c.vouched == T.hang + 1 and not links.holds_hung(P[4].key)
    assert links.climb(2 * T.hang) == []  # silence counted from the vouch
    world.moved = (0, None)  # the job's collectives stopped too
    assert links.climb(2 * T.hang + 2)[0] == Hung(P[4].key, "peer silent for 22s")
    assert c.hung


def test_the_reset_rung_drops_a_silent_ready_connection():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, delayed=True, hung=True, hung_refreshed=20.5, hung_since=11.0, heard=0.0)
    world.add_conn(7, P[4])
    assert links.climb(T.reset + 1) == [
        Notify(Kind.PEER_KEEPALIVE_TIMEOUT, P[4].addr, "keepalive timeout after 21s, terminating connection"),
        Drop(7),
    ]
    assert (c.conn, c.disconnected_since, c.next_connect) == (None, 0.0, T.reset + 1)


def test_the_dead_rung_hands_the_verdict_to_suspicion_and_ends_the_climb():
    world, links = _links(3)
    now = T.dead + 1
    c = _contact(links, 4, conn=7, delayed=True, hung=True, hung_since=now - 5, hung_refreshed=now - 5, heard=0.0)
    world.add_conn(7, P[4])  # ready and silent past the reset limit too: DEAD is final, no RESET after it
    assert links.climb(now) == [Silent(P[4].key)]
    assert c.conn == 7
    c.hung_since = now - 4.9  # our HUNG has not stood CONFIRM yet
    assert links.climb(now) == [
        Notify(Kind.PEER_KEEPALIVE_TIMEOUT, P[4].addr, "keepalive timeout after 61s, terminating connection"),
        Drop(7),
    ]


def test_the_ladder_leaves_a_process_already_gone_alone():
    world, links = _links(3)
    _contact(links, 4, conn=7, heard=0.0)
    world.add_conn(7, P[4])
    world.dead.add(P[4].key)
    assert links.climb(1000.0) == []


def test_seed_3432_last_call_floods_our_hung_once_more():
    world, links = _links(3)
    c = _contact(links, 4, conn=7, hung=True, hung_refreshed=1.0)
    links.on_keepalive(world.add_conn(7, P[4]), wire.Keepalive(0, 0, True, clock=3.0), 0.0)
    assert links.last_call(P[4].key, 70.0) == [Originate(wire.FloodKind.HUNG, P[4].key, 3.0)]
    assert c.hung_refreshed == 70.0
    assert links.last_call(peer(4, incarnation=1).key, 71.0) == []
    assert links.last_call(P[5].key, 71.0) == []


# --- keepalives and idle connections -------------------------------------------------------------------------------


def test_keepalives_flow_on_idle_used_connections_and_say_when_our_use_changes():
    world, links = _links(3)
    _contact(links, 4, conn=7)
    world.add_conn(7, P[4])
    world.add_conn(8, peer(9))  # not a link of ours
    world.add_conn(9, P[2], ConnState.INIT)  # not ready: never
    # First: each peer is told at once whether we use its connection.
    assert links.keepalives(0.5) == [
        SayFrame(7, _keepalive(world, True, 0.5)),
        SayFrame(8, _keepalive(world, False, 0.5)),
    ]
    assert links.keepalives(0.6) == []
    # Idle for a keepalive interval: both flow (the peer on 8 uses it, as far as we know).
    assert links.keepalives(1.5) == [
        SayFrame(7, _keepalive(world, True, 1.5)),
        SayFrame(8, _keepalive(world, False, 1.5)),
    ]
    # The peer on 8 says it does not use it either: no more keepalives there.
    links.on_keepalive(world.conns[8], wire.Keepalive(0, 0, wanted=False), 1.6)
    assert not links.peer_wants(8)
    world.conns[7].last_send = 1.5
    world.conns[8].last_send = 1.5
    assert links.keepalives(3.0) == [SayFrame(7, _keepalive(world, True, 3.0))]
    # We stop using 7: the peer hears so at once, not a keepalive interval later.
    world.conns[7].last_send = 3.0
    links.forget(P[4].key)
    assert links.keepalives(3.1) == [SayFrame(7, _keepalive(world, False, 3.1))]


def test_close_idle_drops_a_connection_nobody_uses():
    world, links = _links(3)
    _contact(links, 4, conn=7)
    world.add_conn(7, P[4])
    world.add_conn(8, peer(9))
    world.add_conn(9, peer(10))
    links.on_keepalive(world.conns[7], wire.Keepalive(0, 0, wanted=False), 0.0)
    links.on_keepalive(world.conns[8], wire.Keepalive(0, 0, wanted=False), 0.0)
    assert links.close_idle(T.idle) == []
    assert links.close_idle(T.idle + 1) == [Drop(8)]  # 7 is our link; the peer on 9 still uses it


def test_forgive_moves_every_contacts_clocks_forward():
    _, links = _links(3)
    c = _contact(links, 4, conn=7, heard=1.0, disconnected_since=2.0)
    links.forgive(10.0)
    assert (c.last_heard, c.disconnected_since) == (11.0, 12.0)


def test_the_climb_stops_at_each_contact_that_asks_something_of_others_and_goes_on_when_told():
    # Each contact's verdicts are carried out before the next contact is judged (node.py: effects depth first): the
    # climb returns the first one's effects and ClimbOn, and climb_on judges the rest in the world they left.
    _, links = _links(3)
    first = _contact(links, 2, heard_ever=True, disconnected_since=0.0, heard=0.0)
    second = _contact(links, 4, heard_ever=True, disconnected_since=0.0, heard=0.0)
    now = T.connect_warn + 1
    assert links.climb(now) == [
        Notify(Kind.PEER_UNRESPONSIVE, P[2].addr, "peer not responding for 6s (connect timeout)"),
        Relink(),
        ClimbOn(),
    ]
    assert first.delayed and not second.delayed
    del links.contacts[P[4].addr]  # a relink the first one led to dropped the second contact
    assert links.climb_on(now) == []
    assert not second.delayed  # judged no more: it is not a contact of ours now
    assert links.climb_on(now) == []  # the climb is over
