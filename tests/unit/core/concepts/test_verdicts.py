"""verdicts.py alone: who is dead, departed or hung, the fast-death rule and retiring older incarnations, as effects."""

from hypothesis import given, settings, strategies as st

from rasd.core import wire
from rasd.core.actions import ProbePid
from rasd.core.config import Timers
from rasd.core.connections import ConnState
from rasd.core.effects import Drop, Expel, Forget, Notify, Originate, Relink
from rasd.core.events import Kind
from rasd.core.liveness import HUNG_EXPIRY
from rasd.core.peers import PeerKey, key_set_hash
from rasd.core.verdicts import Verdicts

from .world import FakeWorld, peer

ME, P2, P3 = peer(1), peer(2), peer(3)
P2_NEW = peer(2, incarnation=9002)  # a newer process at P2's address


def _verdicts(*peers, timers=Timers()):
    world = FakeWorld(ME, peers or (P2, P3), timers)
    return world, Verdicts(world)


def test_declare_dead_closes_the_processs_connections_tells_the_job_and_relinks():
    world, v = _verdicts()
    world.add_conn(1, P2)  # READY, to P2's incarnation
    world.add_conn(2, P2, ConnState.INIT, incarnation=None)  # still in its handshake: reaches whoever holds P2
    world.add_conn(3, P3)
    v.hung[P2.key] = 0.0
    before = v.dead_hash
    assert v.declare_dead(P2.key, 5.0, "why") == [
        Forget(P2.key),
        Drop(1),
        Drop(2),
        Notify(Kind.PEER_DEAD, P2.key, "why"),
        Originate(wire.FloodKind.DEAD, P2.key),
        Relink(),
    ]
    assert v.dead == {P2.key} and P2.key not in v.hung
    assert v.dead_hash != before and v.dead_hash == v.gone_hash()
    assert v.gone(P2.key) and v.gone_addresses() == {P2.addr}


def test_declare_dead_of_a_replaced_process_keeps_the_newer_incarnations_connections():
    world, v = _verdicts(P2, P3)
    world.merge(P2_NEW)
    world.add_conn(1, P2)  # the old process's connection
    world.add_conn(2, P2_NEW)  # the new one's
    world.add_conn(3, P2.addr, ConnState.AUTH, incarnation=None)  # in its handshake: would reach the new process
    assert v.declare_dead(P2.key, 5.0, None) == [
        Forget(P2.key),
        Drop(1),
        Notify(Kind.PEER_DEAD, P2.key, ""),
        Originate(wire.FloodKind.DEAD, P2.key),  # known (a former entry): the job is told
        Relink(),
    ]
    assert v.gone_addresses() == set()  # the current process at that address is alive


def test_declare_dead_floods_only_a_process_in_the_table_and_only_when_asked():
    world, v = _verdicts()
    stranger = PeerKey(peer(9).addr, 1)
    assert v.declare_dead(stranger, 1.0, "x") == [Forget(stranger), Notify(Kind.PEER_DEAD, stranger, "x"), Relink()]
    assert v.declare_dead(P3.key, 1.0, "y", flood=False) == [
        Forget(P3.key),
        Notify(Kind.PEER_DEAD, P3.key, "y"),
        Relink(),
    ]
    assert v.dead == {stranger, P3.key}


def test_a_repeated_death_and_our_own_are_no_ops():
    _, v = _verdicts()
    v.declare_dead(P2.key, 1.0, None)
    hash_after = v.dead_hash
    assert v.declare_dead(P2.key, 2.0, "again") == []
    assert v.declare_dead(ME.key, 2.0, "us") == []
    assert v.dead == {P2.key} and v.dead_hash == hash_after


def test_mark_left_then_a_death_replaces_the_departure_but_not_the_other_way():
    world, v = _verdicts()
    world.add_conn(4, P3)
    assert v.mark_left(P3.key, 1.0) == [
        Forget(P3.key),
        Drop(4),
        Notify(Kind.PEER_LEFT, P3.key, "process left the job"),
        Relink(),
    ]
    assert v.mark_left(P3.key, 2.0) == []
    assert v.left == {P3.key}
    v.declare_dead(P2.key, 3.0, None)
    assert v.mark_left(P2.key, 4.0) == []  # dead is final
    assert v.declare_dead(P3.key, 5.0, None, flood=False)[-2:] == [Notify(Kind.PEER_DEAD, P3.key, ""), Relink()]
    assert v.left == set() and v.dead == {P2.key, P3.key}


def test_retire_declares_the_older_incarnations_dead_without_a_flood():
    world, v = _verdicts()
    world.add_conn(1, P2)
    world.merge(P2_NEW)
    assert v.retire(frozenset({P2.addr}), 3.0) == [
        Forget(P2.key),
        Drop(1),
        Notify(Kind.PEER_DEAD, P2.key, "a newer process holds its address"),
        Relink(),
    ]
    assert v.retire(frozenset({P2.addr}), 4.0) == []  # already gone


def test_retire_expels_us_when_a_newer_incarnation_holds_our_address():
    world, v = _verdicts()
    assert v.retire(frozenset({ME.addr}), 1.0) == []  # our own entry is the current one
    newer_me = peer(1, incarnation=ME.incarnation + 1)
    world.merge(newer_me)
    assert v.retire(frozenset({ME.addr}), 2.0) == [Expel()]  # our own key is never declared dead here


def test_a_refused_reconnect_after_a_lost_connection_is_a_death():
    world, v = _verdicts()
    world.add_conn(1, P2, ConnState.CONNECTING)
    assert v.refused(P2.key, lost_connection=True, now=2.0) == [
        Forget(P2.key),
        Drop(1),
        Notify(Kind.PEER_DEAD, P2.key, "connection closed and reconnect refused"),
        Originate(wire.FloodKind.DEAD, P2.key),
        Relink(),
    ]


def test_a_refused_first_connect_only_probes_a_process_on_this_host():
    far = peer(4, host="10.0.0.2")
    world, v = _verdicts(P2, far)
    assert v.refused(P2.key, lost_connection=False, now=1.0) == [ProbePid(P2.addr, P2.pid)]
    assert v.refused(far.key, lost_connection=False, now=1.0) == []
    other_hostname = peer(5, hostname="another")  # same IP, another host name: not ours to probe
    world.merge(other_hostname)
    assert v.refused(other_hostname.key, lost_connection=False, now=1.0) == []
    assert v.dead == set()


def test_without_fast_death_a_refusal_neither_kills_nor_probes():
    _, v = _verdicts(timers=Timers(fast_death=False))
    assert v.refused(P2.key, lost_connection=True, now=1.0) == []
    assert v.probe_if_local(P2.addr) == []
    assert v.pid_gone(P2.addr, 2.0) == []
    assert v.dead == set()


def test_pid_gone_kills_the_incarnation_the_probe_asked_about():
    _, v = _verdicts()
    assert v.probe_if_local(P2.addr) == [ProbePid(P2.addr, P2.pid)]
    assert v.pid_gone(P2.addr, 2.0) == [
        Forget(P2.key),
        Notify(Kind.PEER_DEAD, P2.key, "process no longer exists"),
        Originate(wire.FloodKind.DEAD, P2.key),
        Relink(),
    ]
    assert v.pid_gone(P2.addr, 3.0) == []  # already dead


def test_pid_gone_spares_a_newer_process_that_took_the_address_since_the_probe():
    world, v = _verdicts()
    v.probe_if_local(P2.addr)
    world.merge(P2_NEW)
    assert v.pid_gone(P2.addr, 2.0) == []  # the probe was about P2, which is no longer current
    assert v.dead == set()
    assert v.pid_gone(peer(8).addr, 2.0) == []  # an address nobody holds


def test_a_hung_verdict_is_announced_once_and_refreshed_after():
    _, v = _verdicts()
    assert v.hung_verdict(P2.key, 10.0, "silent") == [Notify(Kind.PEER_HUNG, P2.key, "silent")]
    assert v.hung_verdict(P2.key, 30.0, "silent again") == []
    assert v.hung == {P2.key: 30.0}


def test_recovered_ends_a_verdict_only_where_it_was_held():
    _, v = _verdicts()
    assert v.recovered(P2.key, 1.0) == []
    v.hung_verdict(P2.key, 1.0, "silent")
    assert v.recovered(P2.key, 2.0) == [Notify(Kind.PEER_RECOVERED, P2.key, "peer responding again")]
    assert v.hung == {}
    v.hung_verdict(P3.key, 3.0, "silent")
    assert v.hung_ended(P3.key) is None and v.hung == {}  # links.py tells the job: no effect here


def test_expire_hung_drops_unconfirmed_verdicts_but_keeps_our_own():
    world, v = _verdicts()
    v.hung_verdict(P2.key, 0.0, "theirs")
    v.hung_verdict(P3.key, 0.0, "ours")
    world.held_hung.add(P3.key)  # our own ladder holds P3 hung
    limit = HUNG_EXPIRY * world.timers.hang
    assert v.expire_hung(limit) == []  # not past the limit yet
    assert v.expire_hung(limit + 0.1) == [Notify(Kind.PEER_RECOVERED, P2.key, "hang verdict no longer confirmed")]
    assert v.hung == {P3.key: 0.0}
    assert v.expire_hung(10 * limit) == []


def test_forgive_moves_every_confirmation_forward():
    _, v = _verdicts()
    v.hung_verdict(P2.key, 1.0, "x")
    v.forgive(4.0)
    assert v.hung == {P2.key: 5.0}


_KEYS = [ME.key, P2.key, P3.key, P2_NEW.key, PeerKey(peer(9).addr, 1), PeerKey(peer(9).addr, 2)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["dead", "left"]), st.integers(0, len(_KEYS) - 1)), max_size=20))
def test_the_kept_dead_hash_is_always_the_recomputed_one(calls):
    """``dead_hash`` is kept up to date verdict by verdict (issue 30): whatever the sequence of deaths and departures
    (repeats, our own key, a departed process later declared dead, which moves it from one set to the other), it
    equals the hash recomputed from the two sets."""
    world, v = _verdicts(P2, P3)
    world.merge(P2_NEW)
    dead, left = set(), set()  # what the sets should hold
    for i, (call, k) in enumerate(calls):
        key = _KEYS[k]
        if call == "dead":
            v.declare_dead(key, float(i), "test")
            if key != ME.key:
                dead.add(key)
                left.discard(key)
        else:
            v.mark_left(key, float(i))
            if key != ME.key and key not in dead:
                left.add(key)
        assert v.dead == dead and v.left == left
        assert v.dead_hash == v.gone_hash()
    # The sets, not the path to them: the same verdicts reached directly hash the same.
    _, direct = _verdicts(P2, P3)
    for key in sorted(left):
        direct.mark_left(key, 0.0)
    for key in sorted(dead):
        direct.declare_dead(key, 0.0, None)
    assert direct.dead_hash == v.dead_hash


def test_a_departed_process_declared_dead_moves_between_the_sets_in_the_hash():
    _, v = _verdicts()
    v.mark_left(P2.key, 1.0)
    assert v.dead_hash == v.gone_hash() != 0
    v.declare_dead(P2.key, 2.0, "after all")
    assert v.left == set() and v.dead == {P2.key}
    assert v.dead_hash == v.gone_hash() == key_set_hash([P2.key])
    assert v.mark_left(P2.key, 3.0) == [] and v.dead_hash == key_set_hash([P2.key])  # dead stays dead
