"""The rendezvous rules (inprocess/elastic/rendezvous.py): one test per rule, then properties over random histories.

No sockets, no sleeps: time is a number carried by each event.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from inprocess.elastic.rendezvous import (
    JOIN_RULES,
    Action,
    Admitted,
    Close,
    Failed,
    Failure,
    Join,
    Leave,
    Rendezvous,
    Settings,
    Tick,
    Waiting,
    decide,
    step,
)


def run(settings: Settings, events: Iterable, state: Rendezvous = Rendezvous()) -> tuple[Rendezvous, list]:
    outcomes: list = []
    for event in events:
        state, produced = step(settings, state, event)
        outcomes.extend(produced)
    return state, outcomes


def admitted(outcomes: list) -> dict[str, tuple[int, int, int]]:
    return {item.node: (item.round, item.rank, item.world_size) for item in outcomes if isinstance(item, Admitted)}


def test_settings_are_validated_as_torch_does() -> None:
    with pytest.raises(ValueError, match="greater than zero"):
        Settings(0, 2)
    with pytest.raises(ValueError, match="greater than or equal"):
        Settings(3, 2)
    with pytest.raises(ValueError, match="must be positive"):
        Settings(1, 2, last_call=0)


def test_min_not_reached_the_join_timeout_fails_every_pending_join_and_not_before() -> None:
    rules = Settings(min_nodes=3, max_nodes=4, last_call=5, join_timeout=60)
    state, outcomes = run(rules, [Join("a", 0), Join("b", 10), Tick(60)])
    assert outcomes == [] and state.participants == ("a", "b")
    state, outcomes = run(rules, [Tick(60.5)], state)
    assert outcomes == [Failed("a", Failure.TIMEOUT)] and state.participants == ("b",)
    state, outcomes = run(rules, [Tick(71)], state)
    assert outcomes == [Failed("b", Failure.TIMEOUT)] and state.participants == () and not state.complete


def test_max_reached_completes_at_once() -> None:
    rules = Settings(min_nodes=2, max_nodes=3, last_call=30)
    state, outcomes = run(rules, [Join("c", 0), Join("a", 1), Join("b", 2)])
    assert state.complete and state.deadline is None
    assert admitted(outcomes) == {"a": (0, 0, 3), "b": (0, 1, 3), "c": (0, 2, 3)}


def test_the_last_call_wait_admits_a_late_process_and_starts_at_min() -> None:
    rules = Settings(min_nodes=2, max_nodes=4, last_call=10)
    state, outcomes = run(rules, [Join("b", 0), Join("a", 1)])
    assert state.deadline == 11 and not state.complete and outcomes == []
    state, outcomes = run(rules, [Join("c", 6), Tick(11)], state)  # the deadline itself is not past it
    assert outcomes == [] and state.participants == ("b", "a", "c")
    state, outcomes = run(rules, [Tick(11.01)], state)
    assert admitted(outcomes) == {"a": (0, 0, 3), "b": (0, 1, 3), "c": (0, 2, 3)}


def test_below_min_again_the_last_call_is_cancelled_and_restarts_at_min() -> None:
    rules = Settings(min_nodes=2, max_nodes=4, last_call=10)
    state, _ = run(rules, [Join("a", 0), Join("b", 1), Leave("b", 5)])
    assert state.deadline is None
    state, outcomes = run(rules, [Tick(20), Join("c", 20)], state)
    assert outcomes == [] and state.deadline == 30
    state, outcomes = run(rules, [Tick(31)], state)
    assert admitted(outcomes) == {"a": (0, 0, 2), "c": (0, 1, 2)}


def test_a_participant_joining_again_leaves_and_rejoins_its_open_round_as_torch_does() -> None:
    rules = Settings(min_nodes=2, max_nodes=4, last_call=10, join_timeout=100)
    state, _ = run(rules, [Join("a", 0), Join("b", 1)])
    assert state.deadline == 11
    state, outcomes = run(rules, [Join("a", 5)], state)  # exit (below min: no deadline), join (min again)
    assert outcomes == [] and state.deadline == 15 and state.participants == ("b", "a")
    assert state.join_deadline("a") == 105 and state.join_deadline("b") == 101
    state, outcomes = run(rules, [Tick(12)], state)
    assert outcomes == []
    state, outcomes = run(rules, [Tick(15.5)], state)
    assert admitted(outcomes) == {"a": (0, 0, 2), "b": (0, 1, 2)}


def test_exclusivity_a_late_process_waits_while_a_round_is_complete() -> None:
    rules = Settings(min_nodes=2, max_nodes=4, last_call=1)
    state, _ = run(rules, [Join("a", 0), Join("b", 0), Tick(2)])
    state, outcomes = run(rules, [Join("d", 3), Join("e", 4), Tick(100), Join("d", 101)], state)
    assert outcomes == [Waiting("d", 0), Waiting("e", 0)]
    assert state.waiting == 2 and state.participants == ("a", "b") and state.round == 0
    # The next round: every participant asks again (torch's exit then join); the late ones join it.
    state, outcomes = run(rules, [Join("b", 200)], state)
    assert outcomes == [Waiting("b", 0)] and state.complete
    state, outcomes = run(rules, [Join("a", 201)], state)
    assert admitted(outcomes) == {"a": (1, 0, 4), "b": (1, 1, 4), "d": (1, 2, 4), "e": (1, 3, 4)}
    assert state.round == 1 and state.waiting == 0


def test_a_full_round_keeps_late_processes_as_uncounted_spares_until_there_is_room() -> None:
    rules = Settings(min_nodes=1, max_nodes=2, last_call=1)
    state, _ = run(rules, [Join("a", 0), Join("b", 0)])
    state, outcomes = run(rules, [Join("c", 1)], state)
    assert outcomes == [Waiting("c", 0, spare=True)] and state.waiting == 0
    state, outcomes = run(rules, [Tick(10_000)], state)  # a spare has no join deadline
    assert outcomes == []
    state, outcomes = run(rules, [Leave("b", 10_001)], state)
    assert outcomes == [Waiting("c", 0)] and state.waiting == 1
    state, outcomes = run(rules, [Join("a", 10_002), Tick(10_004)], state)
    assert admitted(outcomes) == {"a": (1, 0, 2), "c": (1, 1, 2)}


def test_consistency_ranks_follow_the_node_ids_whatever_the_join_order() -> None:
    rules = Settings(min_nodes=4, max_nodes=4)
    for order in (["d", "c", "b", "a"], ["b", "d", "a", "c"]):
        state, outcomes = run(rules, [Join(node, time) for time, node in enumerate(order)])
        assert state.ranks == (("a", 0), ("b", 1), ("c", 2), ("d", 3))
        assert admitted(outcomes) == {node: (0, rank, 4) for node, rank in state.ranks}


def test_closing_nobody_joins_a_closed_job_and_the_running_round_keeps_going() -> None:
    rules = Settings(min_nodes=2, max_nodes=3, last_call=1)
    state, _ = run(rules, [Join("a", 0), Join("b", 0), Tick(2), Join("c", 3)])
    assert state.waiting == 1
    state, outcomes = run(rules, [Close(4)], state)
    assert outcomes == [Failed("c", Failure.CLOSED)] and state.closed and state.waiting == 0
    assert state.complete and state.ranks == (("a", 0), ("b", 1))
    state, outcomes = run(rules, [Join("d", 5), Join("a", 6)], state)
    assert outcomes == [Failed("d", Failure.CLOSED), Failed("a", Failure.CLOSED)]


def test_closing_fails_the_joins_of_an_open_round() -> None:
    rules = Settings(min_nodes=3, max_nodes=3)
    state, outcomes = run(rules, [Join("b", 0), Join("a", 0), Close(1), Tick(10_000)])
    assert outcomes == [Failed("a", Failure.CLOSED), Failed("b", Failure.CLOSED)] and state.participants == ()


def test_a_dead_participant_leaves_its_round_and_the_survivors_form_the_next() -> None:
    rules = Settings(min_nodes=2, max_nodes=4, last_call=5)
    state, _ = run(rules, [Join(node, 0) for node in "abcd"])
    assert state.complete
    state, outcomes = run(rules, [Leave("d", 1), Join("a", 2), Join("b", 2), Join("c", 2)], state)
    assert admitted(outcomes) == {} and state.round == 1 and state.deadline == 7
    state, outcomes = run(rules, [Tick(7.5)], state)
    assert admitted(outcomes) == {"a": (1, 0, 3), "b": (1, 1, 3), "c": (1, 2, 3)}


def test_a_waiting_node_times_out_like_any_join() -> None:
    rules = Settings(min_nodes=1, max_nodes=3, last_call=1, join_timeout=50)
    state, _ = run(rules, [Join("a", 0), Tick(2), Join("b", 3)])
    state, outcomes = run(rules, [Tick(53.5)], state)
    assert outcomes == [Failed("b", Failure.TIMEOUT)] and state.waiting == 0


def test_the_rule_table_reads_first_match_wins() -> None:
    rules = Settings(min_nodes=1, max_nodes=1)
    assert [rule.action for rule in JOIN_RULES][0] is Action.ERROR_CLOSED
    full, _ = run(rules, [Join("a", 0)])
    assert decide(full, "b", rules) is Action.ADD_TO_REDUNDANCY_LIST
    assert decide(Rendezvous(closed=True), "b", rules) is Action.ERROR_CLOSED
    assert decide(Rendezvous(), "b", rules) is Action.ADD_TO_PARTICIPANTS


# ---- properties over random histories ---------------------------------------------------------------------------

NODES = ["n0", "n1", "n2", "n3", "n4", "n5"]

events_strategy = st.lists(
    st.tuples(
        st.sampled_from(["join", "join", "join", "leave", "tick", "close"]),
        st.sampled_from(NODES),
        st.floats(min_value=0, max_value=40, allow_nan=False),
    ),
    max_size=40,
)


@hypothesis_settings(max_examples=100, deadline=None)
@given(
    min_nodes=st.integers(1, 4),
    extra=st.integers(0, 3),
    last_call=st.floats(0.5, 20),
    join_timeout=st.floats(5, 100),
    history=events_strategy,
)
def test_every_history_keeps_the_rules(
    min_nodes: int, extra: int, last_call: float, join_timeout: float, history: list
) -> None:
    rules = Settings(min_nodes, min_nodes + extra, last_call, join_timeout)
    state = Rendezvous()
    now = 0.0
    closed_at = None
    joined_at: dict[str, float] = {}  # the start of each node's current join
    min_reached_at: dict[int, float] = {}
    admitted_rounds: dict[int, set[str]] = {}
    for kind, node, delta in history:
        now += delta
        event = {"join": Join(node, now), "leave": Leave(node, now), "tick": Tick(now), "close": Close(now)}[kind]
        before = state
        state, outcomes = step(rules, state, event)

        # Lists are disjoint; an open or complete round never holds more than max_nodes.
        members = [set(state.participants), set(state.wait_list), set(state.redundancy_list)]
        assert sum(len(group) for group in members) == len(set().union(*members))
        assert len(state.participants) <= rules.max_nodes
        assert state.waiting == len(state.wait_list)
        if not state.complete and len(state.participants) >= rules.min_nodes:
            assert state.deadline is not None
            min_reached_at.setdefault(state.round, state.deadline - rules.last_call)
        if state.complete:  # the roster given at completion, in node-id order, kept while members leave the round
            roster = [member for member, _ in state.ranks]
            assert roster == sorted(roster) and set(state.participants) <= set(roster)
            assert [rank for _, rank in state.ranks] == list(range(len(roster)))
        if state.closed:
            assert not state.wait_list and not state.redundancy_list

        round_admissions = [item for item in outcomes if isinstance(item, Admitted)]
        if round_admissions:
            assert closed_at is None, "nobody is admitted after close"
            rounds = {item.round for item in round_admissions}
            assert len(rounds) <= 2  # the passage of time completes one, a participant's new join the next
            for round_number in rounds:
                group = [item for item in round_admissions if item.round == round_number]
                # exclusivity: one group per round, admitted all at once, with ranks 0..n-1
                assert round_number not in admitted_rounds
                admitted_rounds[round_number] = {item.node for item in group}
                assert sorted(item.rank for item in group) == list(range(len(group)))
                assert {item.world_size for item in group} == {len(group)}
                assert rules.min_nodes <= len(group) <= rules.max_nodes
                if len(group) < rules.max_nodes:  # below max only after the last call
                    assert (
                        now - min_reached_at.get(round_number, now) >= rules.last_call
                        or before.deadline is not None
                        and before.deadline < now
                    )
        for item in outcomes:
            rejoined = kind == "join" and item.node == node  # timed out, then joined again in the same event
            if isinstance(item, Failed) and item.reason is Failure.TIMEOUT:
                assert now - joined_at.get(item.node, now) > rules.join_timeout
                assert rejoined or item.node not in state.participants
            if isinstance(item, (Admitted, Failed)):
                joined_at.pop(item.node, None)
        # A join pends in the open round, on the wait list, or as a spare (torch's join timeout covers all three).
        pending = (
            state.wait_list | state.redundancy_list | (frozenset() if state.complete else frozenset(state.participants))
        )
        if kind == "join" and node not in joined_at and node in pending:
            joined_at[node] = now
        if kind == "close":
            closed_at = now
        if kind == "leave":
            joined_at.pop(node, None)
            assert node not in state.participants and node not in state.wait_list
        # Every pending join still has its deadline in the future.
        assert all(deadline >= now for _, deadline in state.join_deadlines)


@hypothesis_settings(max_examples=30, deadline=None)
@given(order=st.permutations(NODES[:4]), late=st.sampled_from(NODES[4:]))
def test_a_late_node_is_admitted_exactly_at_the_next_round(order: list[str], late: str) -> None:
    rules = Settings(min_nodes=2, max_nodes=5, last_call=3, join_timeout=600)
    state, outcomes = run(rules, [Join(node, 0) for node in order] + [Tick(4)])
    assert set(admitted(outcomes)) == set(order)
    state, outcomes = run(
        rules, [Join(late, 5)] + [Join(node, 6 + index) for index, node in enumerate(order[:-1])], state
    )
    assert admitted(outcomes) == {} and state.round == 0  # not before every participant asked for the next round
    state, outcomes = run(rules, [Join(order[-1], 20)], state)
    everyone = sorted(order + [late])
    assert admitted(outcomes) == {node: (1, rank, 5) for rank, node in enumerate(everyone)}


def test_a_member_that_reads_a_complete_round_late_finds_the_roster_it_completed_with():
    """Round 1 completes with n0, n1, n2 and the newcomer n3; n3 dies and the fast survivors leave it (n3's Leave,
    their own Join for the next round) before the slow n2 has looked: n2 still finds round 1 with 4 ranks, the
    world n0 and n1 trained in, not a world of its own."""
    rules = Settings(1, 4, 1.0, 60.0)
    state = Rendezvous(round=1)
    for node in ("n0", "n1", "n2", "n3"):
        state, _ = step(rules, state, Join(node, 0.0))
    assert state.complete and len(state.ranks) == 4
    for event in (Leave("n3", 1.0), Join("n0", 1.0), Join("n1", 1.0)):
        state, _ = step(rules, state, event)
    assert state.complete and state.round == 1 and state.participants == ("n2",)
    assert state.rank_of("n2") == 2 and len(state.ranks) == 4
