"""suspicion.py alone: silence deaths decided with a reachability gather, suspicions, their floods and refutations,
and the sweep seeds behind its rules.

Each test starts the reachability gathers itself (``silent`` or ``measure``) and ends them with ``reached`` at chosen
times; the gather hard limit is long here (``T``), so a ``tick`` in between decides without starting another gather
(a tick that starts one leaves the deciding to its end)."""

from rasd.core import wire
from rasd.core.config import Timers
from rasd.core.effects import (
    REACH_QUERY,
    Answered,
    Broadcast,
    Dead,
    Decide,
    LastCall,
    Measured,
    Notify,
    Originate,
    Side,
    StartGather,
)
from rasd.core.events import Kind
from rasd.core.suspicion import Suspicion, unreached_runs

from .world import FakeWorld, peer, snapshot

#: A reachability gather: it asks for nothing but who answers (``wire.Ask.REACH``).
REACH = StartGather(REACH_QUERY, ask=wire.Ask.REACH)

T = Timers(gather_extra=50.0)  # a gather again only every 55 s
CONFIRM = T.unresponsive  # liveness.CONFIRM unresponsive limits
ECHO = T.leg_timeout  # suspicion.ECHO leg timeouts
P = {i: peer(i) for i in range(1, 7)}
SUSPECT, HEARD = wire.FloodKind.SUSPECT, wire.FloodKind.HEARD
NOBODY_HEARD = "unreachable, and nobody reachable heard it for the dead limit"


def _suspicion(me: int = 1, n: int = 5):
    world = FakeWorld(P[me], [P[i] for i in range(1, n + 1)], T)
    return world, Suspicion(world)


def _flood(subject: int, origin: int = 2, flood_id: int = 1) -> wire.Flood:
    p = P[subject]
    return wire.Flood(P[origin].addr, flood_id, SUSPECT, p.addr, p.incarnation)


def _side(live: int, lowest: int = 1, complete: bool = True) -> Measured:
    return Measured(Side(live, P[lowest].addr), complete)


def _timeout_dead(i: int, silence: float) -> list:
    return [
        Notify(Kind.PEER_TIMEOUT_DEAD, P[i].key, f"peer failed to respond for {int(silence)}s, declaring dead"),
        Dead(P[i].key, None),
        Decide(),  # one silence death at a time: decide again once it is carried out
    ]


# --- the gather ----------------------------------------------------------------------------------------------------


def test_a_silent_link_is_pending_gathers_once_and_makes_its_last_call():
    _, s = _suspicion()
    assert s.silent(P[2].key, 100.0) == [REACH, LastCall(P[2].key)]
    assert s.pending == {P[2].key: 100.0} and s.gathering
    assert s.silent(P[2].key, 101.0) == []
    assert s.silent(P[3].key, 101.0) == [LastCall(P[3].key)]  # one gather at a time


def test_no_gather_once_expelled_or_leaving():
    world, s = _suspicion()
    world.leaving = True
    assert s.measure(1.0) == [] and not s.gathering
    assert s.silent(P[2].key, 1.0) == [LastCall(P[2].key)]
    assert s.reached(snapshot(P[1]), 2.0) == []


def test_the_larger_side_is_more_than_half_or_half_with_the_lowest_address():
    world, s = _suspicion(1, 4)
    s.measure(0.0)
    assert s.reached(snapshot(P[1], P[2]), 1.0)[0] == _side(2, 1)
    assert s.majority
    world, s = _suspicion(3, 4)
    s.measure(0.0)
    assert s.reached(snapshot(P[3], P[4], timeouts=1), 1.0)[0] == _side(2, 3, complete=False)
    assert not s.majority


def test_seed_121_our_side_is_what_the_gather_reached_not_whom_we_hold_alive():
    # We hold all six alive (their deaths not yet due), but the gather reached three: our side is three, lowest P2.
    world, s = _suspicion(2, 6)
    s.measure(0.0)
    assert s.reached(snapshot(P[2], P[3], P[4], timeouts=2), 1.0)[0] == _side(3, 2, complete=False)
    assert not s.majority  # 3 of 6 without the lowest address, P1


def test_a_pending_death_that_answers_the_gather_is_dropped():
    _, s = _suspicion()
    s.silent(P[2].key, 100.0)
    assert s.reached(snapshot(*P.values()), 101.0) == [_side(5), Answered(P[2].key)]
    assert s.pending == {} and s.runs == {} and not s.unreached


def test_the_unreached_are_suspected_and_declared_after_confirm_on_the_larger_side():
    _, s = _suspicion()
    assert s.measure(0.0) == [REACH]
    assert s.reached(snapshot(P[1], P[2], P[3], P[4]), 1.0) == [_side(4), Originate(SUSPECT, P[5].key)]
    assert s.suspects == {P[5].key: 1.0} and s.unreached
    assert s.tick(1.0 + CONFIRM - 0.1) == []
    assert s.tick(1.0 + CONFIRM) == [Dead(P[5].key, NOBODY_HEARD)]
    assert s.suspects == {}


def test_unreached_runs_are_stretches_of_the_table_that_wrap():
    live = list(P.values())
    keys = [p.key for p in live]
    run = frozenset(keys[3:] + keys[:2])
    assert unreached_runs(live, {P[3].addr}) == dict.fromkeys(run, run)
    a, b = frozenset(keys[1:3]), frozenset(keys[4:])
    assert unreached_runs(live, {P[1].addr, P[4].addr}) == {**dict.fromkeys(a, a), **dict.fromkeys(b, b)}
    assert unreached_runs(live, set()) == {}


def test_tick_forgets_what_was_declared_elsewhere_or_heard_again():
    world, s = _suspicion()
    world.silent_since[P[2].key] = 0.0
    s.silent(P[2].key, 100.0)
    s.reached(snapshot(P[1], P[3], P[4]), 101.0)
    assert set(s.suspects) == {P[5].key}
    world.dead.add(P[5].key)
    world.silent_since[P[2].key] = 101.0  # heard again
    assert s.tick(102.0) == []
    assert s.pending == {} and s.suspects == {}


def test_forgive_moves_pending_deaths_and_suspicions_forward():
    _, s = _suspicion()
    s.silent(P[2].key, 100.0)
    s.reached(snapshot(P[1], P[2], P[3], P[4]), 101.0)
    s.silent(P[3].key, 102.0)
    s.forgive(10.0)
    assert s.pending == {P[3].key: 112.0} and s.suspects == {P[5].key: 111.0}


# --- refutations ---------------------------------------------------------------------------------------------------


def test_seed_5482_the_suspect_answers_every_suspect_about_itself():
    _, s = _suspicion(3)
    assert s.on_suspect(7, _flood(3), P[3].key, 1.0) == [Originate(HEARD, P[3].key, 1.0)]
    assert s.on_suspect(7, _flood(3, flood_id=2), P[3].key, 1.1) == [Originate(HEARD, P[3].key, 1.1)]


def test_a_refuter_answers_once_per_echo_and_passes_the_suspect_on_towards_the_suspect():
    world, s = _suspicion()
    world.heard_at[P[3].addr] = 0.5
    world.clocks[P[3].key] = 0.4
    assert s.on_suspect(7, _flood(3), P[3].key, 1.0) == [Originate(HEARD, P[3].key, 0.4)]
    again = _flood(3, flood_id=2)
    assert s.on_suspect(8, again, P[3].key, 1.0 + ECHO - 0.1) == [Broadcast(again, 8)]
    third = _flood(3, flood_id=3)
    assert s.on_suspect(8, third, P[3].key, 1.0 + ECHO) == [Originate(HEARD, P[3].key, 0.4)]
    world.heard_at[P[3].addr] = -100.0  # not heard within the dead limit: no refutation, the flood goes on
    fourth = _flood(3, flood_id=4)
    assert s.on_suspect(8, fourth, P[3].key, 2 * ECHO + 1) == [Broadcast(fourth, 8)]


def test_seed_5482_a_suspicion_floods_its_own_suspect_when_none_came_after_it_began():
    # Another node's SUSPECT about P5 went by just before our gather: we flood none with our suspicion (ECHO), but a
    # death needs a SUSPECT sent or seen after the suspicion began, unrefuted for CONFIRM: ours goes out once CONFIRM
    # has passed, and the death waits CONFIRM after it (sweep seed 5482: the earlier flood never reached the suspect).
    _, s = _suspicion()
    early = _flood(5)
    assert s.on_suspect(7, early, P[5].key, 0.0) == [Broadcast(early, 7)]
    s.measure(0.5)
    assert s.reached(snapshot(P[1], P[2], P[3], P[4]), 1.0) == [_side(4)]  # suspected, no flood of ours
    assert s.tick(1.0 + CONFIRM) == [Originate(SUSPECT, P[5].key)]  # not a death: ours first
    assert s.tick(1.0 + 2 * CONFIRM - 0.1) == []
    assert s.tick(1.0 + 2 * CONFIRM) == [Dead(P[5].key, NOBODY_HEARD)]


def test_seed_5482_a_suspect_flood_seen_after_the_suspicion_began_is_its_call():
    _, s = _suspicion()
    s.on_suspect(7, _flood(5), P[5].key, 0.0)
    s.measure(0.5)
    s.reached(snapshot(P[1], P[2], P[3], P[4]), 1.0)
    later = _flood(5, origin=3, flood_id=9)
    assert s.on_suspect(7, later, P[5].key, 2.0) == [Broadcast(later, 7)]
    assert s.tick(1.0 + CONFIRM) == []  # the call (at 2.0) has not stood CONFIRM
    assert s.tick(2.0 + CONFIRM) == [Dead(P[5].key, NOBODY_HEARD)]


def test_seed_471_a_heard_flood_clears_the_suspects_whole_run():
    # HEARD ("heard within the dead limit") answers a suspicion; a refutation of one member clears its whole run,
    # which is suspected again (with floods) once ECHO has passed (sweep seed 471).
    _, s = _suspicion(1, 6)
    s.measure(0.0)
    effects = s.reached(snapshot(P[1], P[2], P[3], P[6]), 1.0)
    assert effects[0] == _side(4)
    assert set(effects[1:]) == {Originate(SUSPECT, P[4].key), Originate(SUSPECT, P[5].key)}  # the run's own order
    assert s.runs[P[4].key] == frozenset({P[4].key, P[5].key})
    assert s.refuted(P[5].key, 2.0) is None
    assert s.suspects == {}
    s.measure(2.5)
    assert s.reached(snapshot(P[1], P[2], P[3], P[6]), 2.0 + ECHO - 0.1) == [_side(4)]  # heard lately: not raised
    assert s.suspects == {}
    s.measure(2.0 + ECHO)
    effects = s.reached(snapshot(P[1], P[2], P[3], P[6]), 2.0 + ECHO)
    assert set(effects[1:]) == {Originate(SUSPECT, P[4].key), Originate(SUSPECT, P[5].key)}
    assert set(s.suspects) == {P[4].key, P[5].key}
    assert s.tick(2.0 + ECHO + CONFIRM - 0.1) == []
    assert set(s.tick(2.0 + ECHO + CONFIRM)) == {Dead(P[4].key, NOBODY_HEARD), Dead(P[5].key, NOBODY_HEARD)}
    assert s.suspects == {}


# --- the smaller side waits, and calls last ------------------------------------------------------------------------


def test_seed_46_the_smaller_side_makes_a_last_call_before_a_suspicions_death():
    # We are P2; P1, the lowest address, is cut off: half the job without the lowest address is the smaller side. Its
    # suspicion is due a dead limit later, and then only after one more SUSPECT flood stood CONFIRM unrefuted (sweep
    # seed 46: a suspicion raised during a partition came due after the heal and was declared about a live process).
    _, s = _suspicion(2, 2)
    s.measure(0.0)
    assert s.reached(snapshot(P[2]), 0.5) == [_side(1, 2), Originate(SUSPECT, P[1].key)]
    assert not s.majority
    s.measure(60.0)
    assert s.reached(snapshot(P[2]), 0.5 + T.dead) == [_side(1, 2), Originate(SUSPECT, P[1].key)]  # the last call
    assert s.tick(0.5 + T.dead + CONFIRM - 0.1) == []
    assert s.tick(0.5 + T.dead + CONFIRM) == [Dead(P[1].key, NOBODY_HEARD)]


def test_seed_46_a_last_call_answered_in_time_saves_the_process():
    _, s = _suspicion(2, 2)
    s.measure(0.0)
    s.reached(snapshot(P[2]), 0.5)
    s.measure(60.0)
    s.reached(snapshot(P[2]), 60.5)
    assert s.refuted(P[1].key, 62.0) is None  # a HEARD: somebody reachable hears it
    assert s.tick(65.5) == [] and s.suspects == {}


def test_seed_46_the_smaller_sides_pending_death_waits_a_dead_limit_and_its_last_call():
    world, s = _suspicion(2, 2)
    world.silent_since[P[1].key] = 0.0
    assert s.silent(P[1].key, 100.0) == [REACH, LastCall(P[1].key)]
    assert s.reached(snapshot(P[2]), 100.5) == [_side(1, 2)]
    s.measure(159.0)
    assert s.reached(snapshot(P[2]), 159.9) == [_side(1, 2)]  # not yet a dead limit since it was pending
    s.measure(160.0)
    assert s.reached(snapshot(P[2]), 160.0) == [_side(1, 2), Originate(SUSPECT, P[1].key)]
    assert s.tick(165.0) == _timeout_dead(1, 165.0)


def test_seed_3432_a_pending_death_waits_confirm_after_its_last_call():
    # The DEAD rung's last call (our HUNG once more, links.py) went out with the gather: no death before it stood
    # CONFIRM, even on the larger side where a pending death is otherwise due at once (sweep seed 3432).
    world, s = _suspicion()
    world.silent_since[P[2].key] = 0.0
    assert s.silent(P[2].key, 100.0) == [REACH, LastCall(P[2].key)]
    assert s.reached(snapshot(P[1], P[3], P[4], P[5]), 101.0) == [_side(4)]
    assert s.tick(100.0 + CONFIRM - 0.1) == []
    assert s.tick(100.0 + CONFIRM) == _timeout_dead(2, 105.0)
    assert s.pending == {}


def test_seed_3432_a_refuted_last_call_saves_the_process():
    world, s = _suspicion()
    world.silent_since[P[2].key] = 0.0
    s.silent(P[2].key, 100.0)
    s.reached(snapshot(P[1], P[3], P[4], P[5]), 101.0)
    world.silent_since[P[2].key] = 102.0  # refuted: vouched for by a RECOVERED (links.py's silence clock)
    assert s.tick(105.0) == [] and s.pending == {}


# --- a heal: the first majority after a minority -------------------------------------------------------------------


def test_seed_7705_the_first_majority_after_a_minority_calls_an_older_pending_death_again():
    # P2 went silent during a partition that left us on the smaller side; its last call went out there, where nobody
    # who hears P2 could refute it. The first gather after the heal puts us on the larger side: the death is called
    # again (LastCall) and waits CONFIRM from now, instead of being declared at once (sweep seed 7705).
    world, s = _suspicion()
    world.silent_since[P[2].key] = 0.0
    s.silent(P[2].key, 70.0)
    effects = s.reached(snapshot(P[1]), 71.0)
    assert effects[0] == _side(1) and not s.majority
    assert set(effects[1:]) == {Originate(SUSPECT, P[i].key) for i in (3, 4, 5)}
    assert s.measure(81.0) == [REACH]
    assert s.reached(snapshot(P[1], P[3], P[4], P[5]), 82.0) == [_side(4), LastCall(P[2].key)]
    assert s.majority and s.pending == {P[2].key: 82.0} and s.suspects == {}
    assert s.tick(82.0 + CONFIRM - 0.1) == []
    assert s.tick(82.0 + CONFIRM) == _timeout_dead(2, 87.0)


def test_seed_7705_the_first_majority_after_a_minority_raises_an_older_suspicion_afresh():
    _, s = _suspicion()
    s.measure(0.0)
    s.reached(snapshot(P[1]), 1.0)  # the smaller side: P2..P5 suspected, their SUSPECTs heard only there
    assert set(s.suspects) == {P[i].key for i in (2, 3, 4, 5)}
    s.measure(10.0)
    # The heal: P3 still unreached. Its suspicion, older than this gather, is dropped and raised afresh with a
    # SUSPECT flood that reaches the larger side; it is not declared at once.
    assert s.reached(snapshot(P[1], P[2], P[4], P[5]), 11.0) == [_side(4), Originate(SUSPECT, P[3].key)]
    assert s.suspects == {P[3].key: 11.0}
    assert s.tick(11.0 + CONFIRM - 0.1) == []
    assert s.tick(11.0 + CONFIRM) == [Dead(P[3].key, NOBODY_HEARD)]


def test_seed_7357_a_refutation_clears_the_run_and_its_silent_member_is_suspected_again_alone():
    # docs/reliability.md, seed 7357 (the checker's, not the core's): the run rule at work. P3 and P4 are unreached
    # together; P3 answers its SUSPECT after a heal, which clears the whole run, P4 with it, though nobody heard P4.
    # The next gather suspects P4 alone; a SUSPECT about it went by just before (ECHO), so ours goes out once CONFIRM
    # has passed, and P4 is declared only CONFIRM after that.
    _, s = _suspicion(1, 6)
    s.measure(0.0)
    s.reached(snapshot(P[1], P[2], P[5], P[6]), 1.0)
    assert set(s.suspects) == {P[3].key, P[4].key}
    s.refuted(P[3].key, 2.0)
    assert s.suspects == {}
    s.measure(3.0)
    assert s.reached(snapshot(P[1], P[2], P[3], P[5], P[6]), 4.0) == [_side(5)]
    assert s.suspects == {P[4].key: 4.0} and s.runs == {P[4].key: frozenset({P[4].key})}
    assert s.tick(4.0 + CONFIRM - 0.1) == []
    assert s.tick(4.0 + CONFIRM) == [Originate(SUSPECT, P[4].key)]
    assert s.tick(4.0 + 2 * CONFIRM - 0.1) == []
    assert s.tick(4.0 + 2 * CONFIRM) == [Dead(P[4].key, NOBODY_HEARD)]
