"""Rank assignment policies, one rank's view at a time, and Tree on whole topologies."""

from __future__ import annotations

import random
import threading
import time

import pytest

from inprocess import Compose, Mode, State, rank_assignment as ra
from inprocess.store import HashStore


def ctx(rank: int, world_size: int, terminated: set[int] = frozenset(), store=None) -> ra.RankAssignmentCtx:
    return ra.RankAssignmentCtx(State(rank, world_size), store, set(terminated))


def assign(policy, world_size: int, terminated: set[int]) -> dict[int, State]:
    """Run ``policy`` for every surviving rank; returns old rank -> new state."""
    result = {}
    for rank in range(world_size):
        if rank in terminated:
            with pytest.raises(ra.RankDiscarded):
                policy(ctx(rank, world_size, terminated))
            continue
        result[rank] = policy(ctx(rank, world_size, terminated)).state
    return result


def test_shift_ranks_closes_gaps():
    states = assign(ra.ShiftRanks(), 8, {1, 4, 5})
    assert {old: s.rank for old, s in states.items()} == {0: 0, 2: 1, 3: 2, 6: 3, 7: 4}
    assert all(s.world_size == 5 for s in states.values())


def test_shift_ranks_clears_terminated_ranks():
    out = ra.ShiftRanks()(ctx(0, 4, {3}))
    assert out.terminated_ranks == set()


def test_fill_gaps_moves_ranks_as_the_reference_computes():
    """The reference's own tests pin these numbers (8 ranks, {1, 4, 5} terminated: 6->4, 7->5)."""
    states = assign(ra.FillGaps(), 8, {1, 4, 5})
    assert {old: s.rank for old, s in states.items()} == {0: 0, 2: 2, 3: 3, 6: 4, 7: 5}
    assert {s.world_size for s in states.values()} == {5}
    states = assign(ra.FillGaps(), 8, {1, 2, 7})
    assert {old: s.rank for old, s in states.items()} == {0: 0, 3: 3, 4: 4, 5: 1, 6: 2}


@pytest.mark.parametrize("policy", [ra.ShiftRanks(), ra.FillGaps()], ids=["ShiftRanks", "FillGaps"])
def test_renumbering_touches_only_rank_and_world_size(policy):
    before = State(6, 8, active_rank=3, active_world_size=4, iteration=2, mode=Mode.INACTIVE)
    after = policy(ra.RankAssignmentCtx(before, None, {1, 4, 5})).state
    assert (after.active_rank, after.active_world_size, after.mode, after.iteration) == (3, 4, Mode.INACTIVE, 2)
    assert after.world_size == 5 and after.initial_rank == 6
    # every rank terminated, and an empty set given as {} (the reference's tests do both)
    assert assign(policy, 8, set(range(8))) == {}
    assert policy(ra.RankAssignmentCtx(State(3, 8), None, {})).state.rank == 3


def test_activate_all_ranks():
    state = ra.ActivateAllRanks()(ctx(2, 4)).state
    assert (state.mode, state.active_rank, state.active_world_size) == (Mode.ACTIVE, 2, 4)


def test_max_active_world_size_leaves_reserves():
    policy = Compose(ra.MaxActiveWorldSize(3), ra.ShiftRanks())
    states = assign(policy, 5, set())
    assert [states[r].mode for r in range(5)] == [Mode.ACTIVE] * 3 + [Mode.INACTIVE] * 2
    assert [states[r].active_rank for r in range(5)] == [0, 1, 2, None, None]
    assert {s.active_world_size for s in states.values()} == {3}


def test_a_reserve_replaces_a_dead_active_rank():
    policy = Compose(ra.MaxActiveWorldSize(3), ra.ShiftRanks())
    states = assign(policy, 4, {1})
    assert states[3].mode == Mode.ACTIVE and states[3].active_rank == 2
    assert {s.active_world_size for s in states.values()} == {3}


def test_active_world_size_divisible_by():
    policy = Compose(ra.ActiveWorldSizeDivisibleBy(4), ra.ShiftRanks())
    states = assign(policy, 11, {0})
    assert sum(s.mode == Mode.ACTIVE for s in states.values()) == 8
    assert {s.active_world_size for s in states.values()} == {8}


def test_filter_count_grouped_by_key_terminates_incomplete_groups():
    """Groups of 2 by rank // 2; rank 3 is dead, so its partner 2 must go too. Four ranks, one store."""
    store = HashStore()
    world_size, dead = 5, {3}
    policy = Compose(ra.ShiftRanks(), ra.FilterCountGroupedByKey(lambda s: s.rank // 2, lambda n: n == 2))
    results: dict[int, object] = {}

    def run(rank: int) -> None:
        try:
            results[rank] = policy(ra.RankAssignmentCtx(State(rank, world_size), store, set(dead))).state
        except ra.RankDiscarded as error:
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world_size) if rank not in dead]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert isinstance(results[2], ra.RankDiscarded)
    assert isinstance(results[4], ra.RankDiscarded)  # group {4} has one member
    assert results[0].rank == 0 and results[1].rank == 1 and results[0].world_size == 2


# ---- Tree ------------------------------------------------------------------------------------------------------
# The cases below are the reference's own Tree tests (tests/inprocess/test_rank_assignment.py upstream): the same
# topologies, the same terminations, the same expected active ranks.


class PublishedStore:
    """What Tree reads from the store on its first call: every rank's state and layer keys, already published."""

    def __init__(self, states: dict[int, State], keys: dict[int, list]) -> None:
        self.states, self.keys = states, keys

    def send_state(self, state, rank) -> None:
        pass

    def get_states(self, ranks):
        return [self.states[rank] for rank in ranks]

    def send_key(self, key, rank) -> None:
        pass

    def get_keys(self, ranks):
        return [self.keys[rank] for rank in ranks]


def build(world_size: int, layers: list) -> tuple[ra.Tree, ra.RankAssignmentCtx]:
    states = {rank: State(rank, world_size) for rank in range(world_size)}
    keys = {
        rank: [layer.key_or_fn(state) if callable(layer.key_or_fn) else layer.key_or_fn for layer in layers]
        for rank, state in states.items()
    }
    return ra.Tree(layers), ra.RankAssignmentCtx(states[0], PublishedStore(states, keys), set())


def active_ranks(tree: ra.Tree) -> list:
    """Active rank of every initial rank (None: idle or terminated); every leaf agrees on the active world size."""
    ranks = [tree.init_rank_map[rank].state.active_rank for rank in range(len(tree.init_rank_map))]
    sizes = {leaf.state.active_world_size for leaf in tree.init_rank_map.values()}
    assert sizes == {sum(rank is not None for rank in ranks)}
    return ranks


def call(tree: ra.Tree, context: ra.RankAssignmentCtx, terminated: set[int]) -> ra.RankAssignmentCtx:
    context.terminated_ranks = set(terminated)
    try:
        return tree(context)
    except ra.RankDiscarded:
        return context


BACKFILL, RESERVE = ra.LayerFlag.BACKFILL, ra.LayerFlag.RESERVE


def by_four(state: State) -> int:
    return state.rank // 4


@pytest.mark.parametrize(
    "flags, expected",
    [
        ((BACKFILL, BACKFILL), [0, None, 2, 3, 4, 5, 6, 1]),
        ((None, BACKFILL), [0, None, 2, 1, 3, 4, 5, 6]),
        ((None, None), [0, None, 1, 2, 3, 4, 5, 6]),
    ],
    ids=["full", "partial", "none"],
)
def test_tree_backfill_honours_terminations_at_its_first_call(flags, expected):
    tree, context = build(8, [ra.Layer(flag=flags[0]), ra.Layer(key_or_fn=lambda s: s.rank // 4, flag=flags[1])])
    call(tree, context, {1})
    assert active_ranks(tree) == expected


def test_tree_backfills_groups_in_order():
    tree, context = build(8, [ra.Layer(flag=BACKFILL), ra.Layer(key_or_fn=lambda s: s.rank // 2, flag=BACKFILL)])
    call(tree, context, {2, 3})
    assert active_ranks(tree) == [0, 1, None, None, 4, 5, 2, 3]


def test_tree_takes_reserves_most_recently_idle_first():
    tree, context = build(8, [ra.Layer(flag=RESERVE), ra.Layer(max_ranks=3, key_or_fn=by_four, flag=RESERVE)])
    context = call(tree, context, {1})
    assert active_ranks(tree) == [0, None, 2, 1, 3, 4, 5, None]
    context = call(tree, context, {3})
    assert active_ranks(tree) == [0, None, 2, 1, None, 4, 5, 3]
    call(tree, context, {1})
    assert active_ranks(tree) == [0, None, None, 1, None, 3, 4, 2]


def test_tree_min_ranks_terminates_a_branch_and_the_root():
    tree, context = build(8, [ra.Layer(), ra.Layer(min_ranks=3, key_or_fn=lambda s: s.rank // 4)])
    with pytest.raises(ra.RankDiscarded):
        tree(ra.RankAssignmentCtx(context.state, context.store, {0, 2}))
    assert active_ranks(tree) == [None] * 4 + [0, 1, 2, 3]
    tree, context = build(8, [ra.Layer(min_ranks=7), ra.Layer(min_ranks=1, key_or_fn=lambda s: s.rank // 4)])
    with pytest.raises(ra.RankDiscarded):
        tree(ra.RankAssignmentCtx(context.state, context.store, {0, 5}))
    assert active_ranks(tree) == [None] * 8


def test_tree_without_terminations_and_with_all_terminated():
    layers = [ra.Layer(), ra.Layer(key_or_fn=lambda s: s.rank // 4)]
    tree, context = build(8, layers)
    assert tree(context).state.active_rank == 0
    assert active_ranks(tree) == list(range(8))
    tree, context = build(8, layers)
    with pytest.raises(ra.RankDiscarded):
        tree(ra.RankAssignmentCtx(context.state, context.store, set(range(8))))
    assert active_ranks(tree) == [None] * 8


def test_tree_propagates_then_reserves_then_backfills():
    both = RESERVE | BACKFILL
    tree, context = build(12, [ra.Layer(flag=both), ra.Layer(min_ranks=2, max_ranks=3, key_or_fn=by_four, flag=both)])
    context = tree(context)
    with pytest.raises(ra.RankDiscarded):
        tree(ra.RankAssignmentCtx(context.state, context.store, {0, 1, 2}))
    assert active_ranks(tree) == [None, None, None, None, 3, 4, 5, 1, 6, 7, 2, 0]


def test_tree_sets_world_sizes_of_every_leaf_and_renumbers_depth_first():
    tree, context = build(8, [ra.Layer(flag=RESERVE), ra.Layer(max_ranks=3, key_or_fn=by_four, flag=RESERVE)])
    context = call(tree, context, {1})
    assert {leaf.state.world_size for leaf in tree.init_rank_map.values()} == {7}
    assert tree.init_rank_map[1].state.mode == Mode.TERMINATED
    assert [tree.init_rank_map[rank].state.rank for rank in range(8)] == [0, 7, 1, 2, 3, 4, 5, 6]
    assert context.state.rank == 0 and context.state.world_size == 7 and context.terminated_ranks == set()


def test_tree_needs_a_single_root_and_warns_on_a_mismatched_topology():
    tree, context = build(8, [ra.Layer(key_or_fn=lambda s: s.rank % 2)])
    with pytest.raises(RuntimeError):
        tree(context)
    tree, context = build(8, [ra.Layer(), ra.Layer(key_or_fn=lambda s: s.rank % 2)])
    with pytest.warns(UserWarning):
        tree(context)


def test_tree_world_size_filter_makes_reserves_from_the_first_call():
    tree, context = build(5, [ra.Layer(flag=RESERVE)])
    tree.world_size_filter = lambda n: n // 2 * 2
    context = tree(context)
    assert active_ranks(tree) == [0, 1, 2, 3, None]
    context = call(tree, context, {0})
    assert active_ranks(tree) == [None, 1, 2, 3, 0]


def random_tree_case(generator: random.Random) -> None:
    """The reference's randomised invariants: sizes agree on every leaf, active ranks are dense."""
    exponent = generator.randint(4, 8)
    depth = generator.randint(1, exponent)
    world_size = 2**exponent
    boundaries = sorted(generator.sample(range(1, exponent), depth - 1))
    layers = [ra.Layer(key_or_fn="root")]
    leaf_counts = [world_size]
    previous = total = 0
    for boundary in boundaries:
        total += boundary - previous
        previous = boundary
        leaf_counts.append(world_size // 2**total)
        layers.append(ra.Layer(key_or_fn=lambda s, size=world_size // 2**total: s.rank // size))
    reserve_up_to = generator.randint(0, len(layers))
    backfill_up_to = generator.randint(0, len(layers))
    for index, layer in enumerate(reversed(layers)):
        if index < reserve_up_to:
            layer.flag = (layer.flag or RESERVE) | RESERVE
            leaf_count = leaf_counts[-index - 1]
            layer.max_ranks = generator.randint(leaf_count // 2, leaf_count)
        if index < backfill_up_to:
            layer.flag = (layer.flag or BACKFILL) | BACKFILL
    tree, context = build(world_size, layers)
    context = tree(context)
    alive = world_size
    for _ in range(generator.randint(1, 16)):
        if alive == 1:
            break
        count = min(generator.randint(1, 32), alive - 1)
        alive -= count
        context = call(tree, context, set(generator.sample(range(1, context.state.world_size), count)))
        leaves = list(tree.init_rank_map.values())
        assert len(leaves) == world_size
        assert {leaf.state.world_size for leaf in leaves} == {alive}
        (active_world_size,) = {leaf.state.active_world_size for leaf in leaves}
        assert active_world_size == alive if reserve_up_to == 0 else active_world_size <= alive
        active = {leaf.state.active_rank for leaf in leaves if leaf.state.mode == Mode.ACTIVE}
        assert active == set(range(active_world_size))


def test_tree_random_topologies_keep_the_invariants():
    generator = random.Random(1)
    for _ in range(128):
        random_tree_case(generator)


def test_tree_call_through_a_real_store_and_discard():
    """First call through HashStore (JSON states and keys), as in the wrapper; then rank 2 terminated."""
    store = HashStore()
    world_size = 4
    layers = [ra.Layer(key_or_fn="job", flag=RESERVE), ra.Layer(key_or_fn=lambda s: s.rank // 2)]
    trees = {rank: ra.Tree(layers) for rank in range(world_size)}
    states: dict[int, State] = {}

    def first_call(rank: int) -> None:
        states[rank] = trees[rank](ctx(rank, world_size, store=store)).state

    threads = [threading.Thread(target=first_call, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [states[r].active_rank for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ra.RankDiscarded):
        trees[2](ra.RankAssignmentCtx(states[2], store, {2}))
    after = trees[3](ra.RankAssignmentCtx(states[3], store, {2})).state
    assert (after.rank, after.world_size, after.active_rank, after.active_world_size) == (2, 3, 2, 3)


def test_tree_at_16384_ranks_with_1024_terminated():
    """The reference's performance case (it allows 1 s per call); the CPU time is printed (run with -s)."""
    world_size, flag = 2**14, RESERVE | BACKFILL
    layers = [
        ra.Layer(flag=flag),
        ra.Layer(min_ranks=32, max_ranks=64, key_or_fn=lambda s: s.rank // 64, flag=flag),
        ra.Layer(min_ranks=8, max_ranks=8, key_or_fn=lambda s: s.rank // 8, flag=flag),
    ]
    tree, context = build(world_size, layers)
    started = time.process_time()
    context = tree(context)
    built = time.process_time() - started
    started = time.process_time()
    context = call(tree, context, set(random.Random(7).sample(range(world_size), 2**10)))
    restarted = time.process_time() - started
    leaves = list(tree.init_rank_map.values())
    (active_world_size,) = {leaf.state.active_world_size for leaf in leaves}
    active = {leaf.state.active_rank for leaf in leaves if leaf.state.mode == Mode.ACTIVE}
    assert active == set(range(active_world_size))
    print(f"\nTree at 16,384 ranks ({flag}): first call {built:.3f} s, 1,024 terminated {restarted:.3f} s (CPU)")
