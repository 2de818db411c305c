"""The liveness ladder as a table: which rungs a contact reaches, at the exact limits, and in which order."""

from rasd.core.config import Timers
from rasd.core.liveness import HUNG_REFRESH, LADDER, Contact, Observation, Rung, step
from rasd.core.peers import Addr

T = Timers()


def seen(
    silence: float = 0.0,
    ready: bool = True,
    disconnected: float | None = None,
    delayed: bool = False,
    hung: bool = False,
    since_hung_refresh: float = 0.0,
    heard_ever: bool = True,
) -> Observation:
    return Observation(silence, disconnected, ready, delayed, hung, since_hung_refresh, heard_ever)


def test_the_ladder_lists_every_rung_once_in_the_order_they_apply():
    assert [rung for rung, _ in LADDER] == [Rung.UNRESPONSIVE, Rung.CONNECT_TIMEOUT, Rung.HUNG, Rung.DEAD, Rung.RESET]


def test_each_rung_is_reached_just_past_its_limit_not_at_it():
    assert step(seen(T.unresponsive), T) == []
    assert step(seen(T.unresponsive + 0.01), T) == [Rung.UNRESPONSIVE]
    assert step(seen(T.hang + 0.01, delayed=True), T) == [Rung.HUNG]
    assert step(seen(T.reset + 0.01, delayed=True, hung=True), T) == [Rung.RESET]
    assert step(seen(T.dead, delayed=True, hung=True), T) == [Rung.RESET]
    assert step(seen(T.dead + 0.01, delayed=True, hung=True), T) == [Rung.DEAD]


def test_a_long_silence_climbs_every_rung_in_one_step_and_dead_ends_the_climb():
    assert step(seen(T.dead + 1), T) == [Rung.UNRESPONSIVE, Rung.HUNG, Rung.DEAD]


def test_a_peer_without_a_connection_is_flagged_by_the_connect_timeout_only_if_it_was_ever_heard():
    gone = dict(ready=False, disconnected=T.connect_warn + 0.01)
    assert step(seen(**gone), T) == [Rung.CONNECT_TIMEOUT]
    assert step(seen(**gone, heard_ever=False), T) == []
    assert step(seen(ready=False, disconnected=T.connect_warn), T) == []
    # Silence past the reset limit resets only a ready connection; a peer never heard is never HUNG.
    assert step(seen(T.reset + 1, ready=False, heard_ever=False), T) == []


def test_a_standing_hang_is_flagged_again_every_refresh_interval():
    standing = dict(ready=False, delayed=True, hung=True)  # silent for 30 s, its connection already reset
    assert step(seen(T.hang * 3, **standing, since_hung_refresh=HUNG_REFRESH * T.hang - 0.01), T) == []
    assert step(seen(T.hang * 3, **standing, since_hung_refresh=HUNG_REFRESH * T.hang), T) == [Rung.HUNG]


def test_an_observation_reads_the_contact():
    c = Contact(
        addr=Addr("10.0.0.1", 1),
        last_heard=10.0,
        wanted_since=0.0,
        incarnation=7,
        disconnected_since=12.0,
        hung_refreshed=11.0,
        heard_ever=True,
    )
    assert Observation.of(c, ready=False, now=20.0) == seen(10.0, ready=False, disconnected=8.0, since_hung_refresh=9.0)


def test_the_contact_retry_rules():
    c = Contact(addr=Addr("10.0.0.1", 1), last_heard=3.0, wanted_since=0.0, conn=5)
    c.retry_later(10.0, T.connect_retry)
    assert (c.conn, c.disconnected_since, c.next_connect, c.lost_connection) == (
        None,
        10.0,
        10.0 + T.connect_retry,
        False,
    )
    c.retry_later(12.0, T.connect_retry)
    assert c.disconnected_since == 10.0  # disconnected since the first failure
    c.conn = 6
    c.lost(20.0)
    assert (c.conn, c.disconnected_since, c.next_connect, c.lost_connection) == (None, 20.0, 20.0, True)
    c.conn = 7
    c.reset(30.0)
    assert (c.conn, c.disconnected_since, c.next_connect) == (None, 3.0, 30.0)  # silent since it was last heard
