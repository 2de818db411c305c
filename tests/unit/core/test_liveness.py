"""The liveness ladder as a table: which rungs a contact reaches, at the exact limits, and in which order."""

from rasd.core.config import Timers
from rasd.core.liveness import CONFIRM, HUNG_REFRESH, LADDER, Contact, Observation, Rung, step
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
    unvouched: float | None = None,
    hung_for: float | None = None,
) -> Observation:
    """A contact silent for ``silence`` (nobody vouched since, unless ``unvouched`` says otherwise) whose HUNG
    verdict, if any, has stood since the hang limit."""
    unvouched = silence if unvouched is None else unvouched
    if hung_for is None:
        hung_for = max(0.0, unvouched - T.hang) if hung else 0.0
    return Observation(silence, disconnected, ready, delayed, hung, since_hung_refresh, heard_ever, unvouched, hung_for)


def test_the_ladder_lists_every_rung_once_in_the_order_they_apply():
    assert [rung for rung, _ in LADDER] == [
        Rung.UNRESPONSIVE,
        Rung.CONNECT_TIMEOUT,
        Rung.UNREACHED,
        Rung.HUNG,
        Rung.DEAD,
        Rung.RESET,
    ]


def test_each_rung_is_reached_just_past_its_limit_not_at_it():
    assert step(seen(T.unresponsive), T) == []
    assert step(seen(T.unresponsive + 0.01), T) == [Rung.UNRESPONSIVE]
    assert step(seen(T.hang + 0.01, delayed=True), T) == [Rung.HUNG]
    assert step(seen(T.reset + 0.01, delayed=True, hung=True), T) == [Rung.RESET]
    assert step(seen(T.dead, delayed=True, hung=True), T) == [Rung.RESET]
    assert step(seen(T.dead + 0.01, delayed=True, hung=True), T) == [Rung.DEAD]


def test_a_long_silence_is_flagged_hung_first_and_dead_only_after_the_hang_verdict_stood_unrefuted():
    # After a long gap (the first look at a contact in a while), the silence verdict starts as HUNG, so the job can
    # refute it; DEAD ends the climb once that verdict has stood CONFIRM unresponsive limits.
    assert step(seen(T.dead + 1), T) == [Rung.UNRESPONSIVE, Rung.HUNG, Rung.RESET]
    standing = dict(delayed=True, hung=True, since_hung_refresh=0.0)
    assert step(seen(T.dead + 1, **standing, hung_for=CONFIRM * T.unresponsive - 0.01), T) == [Rung.RESET]
    assert step(seen(T.dead + 1, **standing, hung_for=CONFIRM * T.unresponsive), T) == [Rung.DEAD]


def test_a_peer_somebody_vouched_for_is_neither_hung_nor_dead_whatever_our_own_silence():
    # We have not heard it for longer than the dead limit, but a RECOVERED flood (somebody hears it) came in lately.
    vouched = dict(delayed=True, ready=False, disconnected=T.dead + 1, unvouched=T.hang - 0.01)
    assert step(seen(T.dead + 1, **vouched), T) == []
    assert step(seen(T.dead + 1, **vouched, hung=True, hung_for=T.dead), T) == []
    assert step(seen(T.dead + 1, **{**vouched, "unvouched": T.hang + 0.01}), T) == [Rung.HUNG]


def test_a_peer_never_heard_is_flagged_hung_at_the_dead_limit_before_it_can_be_declared_dead():
    never = dict(ready=False, heard_ever=False)
    assert step(seen(T.dead, **never), T) == []
    assert step(seen(T.dead + 0.01, **never), T) == [Rung.HUNG]
    assert step(seen(T.dead + 6, **never, hung=True, since_hung_refresh=6.0, hung_for=6.0), T) == [Rung.DEAD]


def test_a_peer_without_a_connection_is_flagged_by_the_connect_timeout_only_if_it_was_ever_heard():
    gone = dict(ready=False, disconnected=T.connect_warn + 0.01)
    assert step(seen(**gone), T) == [Rung.CONNECT_TIMEOUT]
    # Never heard: only marked unreached (bridged by fallback links, no event), once.
    assert step(seen(**gone, heard_ever=False), T) == [Rung.UNREACHED]
    assert step(seen(**gone, heard_ever=False)._replace(unreached=True), T) == []
    assert step(seen(ready=False, disconnected=T.connect_warn), T) == []
    assert step(seen(ready=False, disconnected=T.connect_warn, heard_ever=False), T) == []
    # Silence past the reset limit resets only a ready connection; a peer never heard is not HUNG before the dead
    # limit.
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
    c.vouch(18.0)
    assert Observation.of(c, ready=False, now=20.0).unvouched == 2.0


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
