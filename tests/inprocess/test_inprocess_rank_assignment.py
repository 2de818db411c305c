"""Rank assignment policies, one rank's view at a time, and Tree on whole topologies."""

from __future__ import annotations

import random
import threading
import time

import pytest

from inprocess import Compose, Mode, State
from inprocess import rank_assignment as ra
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
    states = assign(ra.ShiftRanks(), 6, {1, 4})
    assert {old: s.rank for old, s in states.items()} == {0: 0, 2: 1, 3: 2, 5: 3}
    assert all(s.world_size == 4 and s.mode == Mode.ACTIVE for s in states.values())


def test_shift_ranks_clears_terminated_ranks():
    out = ra.ShiftRanks()(ctx(0, 4, {3}))
    assert out.terminated_ranks == set()


def test_fill_gaps_moves_the_surplus_into_the_holes():
    # | 0 | X | 2 | 3 | X | X | 6 | 7 | --> | 0 | 6 | 2 | 3 | 7 |
    states = assign(ra.FillGaps(), 8, {1, 4, 5})
    assert {old: s.rank for old, s in states.items()} == {0: 0, 2: 2, 3: 3, 6: 1, 7: 4}
    assert {s.world_size for s in states.values()} == {5}


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


# ---- Tree ----------------------------------------------------------------------------------------------------


def node_tree(world_size: int, per_node: int, max_per_node=None, node_flag=ra.LayerFlag.RESERVE, min_per_node=1):
    tree = ra.Tree(
        [
            ra.Layer(key_or_fn="job", flag=ra.LayerFlag.RESERVE | ra.LayerFlag.BACKFILL),
            ra.Layer(min_ranks=min_per_node, max_ranks=max_per_node, key_or_fn=lambda s: s.rank // per_node, flag=node_flag),
        ]
    )
    keys = [["job", str(rank // per_node)] for rank in range(world_size)]
    tree.build_from_keys(keys, world_size)
    return tree


def active_map(tree: ra.Tree) -> dict[int, int]:
    """initial rank -> active rank, for active leaves."""
    return {
        initial: leaf.state.active_rank
        for initial, leaf in tree.init_rank_map.items()
        if leaf.state.mode == Mode.ACTIVE
    }


def test_tree_activates_in_dfs_order_under_max_ranks():
    tree = node_tree(8, per_node=4, max_per_node=2)
    assert active_map(tree) == {0: 0, 1: 1, 4: 2, 5: 3}
    assert tree.init_rank_map[2].state.mode == Mode.INACTIVE


def test_tree_replaces_a_dead_rank_from_its_own_node():
    """
    node 0: [0] [X] [2 idle] [3 idle]    node 1: [4] [5] [6 idle] [7 idle]
    -->     [0] [2 takes active 1]               unchanged
    """
    tree = node_tree(8, per_node=4, max_per_node=2)
    tree.reassign({1})
    assert active_map(tree) == {0: 0, 2: 1, 4: 2, 5: 3}
    assert tree.init_rank_map[1].state.mode == Mode.TERMINATED
    assert tree.init_rank_map[2].state.rank == 1  # renumbered over the 7 survivors
    assert tree.init_rank_map[7].state.world_size == 7


def test_tree_min_ranks_terminates_a_whole_node():
    tree = node_tree(8, per_node=4, min_per_node=4)
    tree.reassign({5})
    assert all(tree.init_rank_map[rank].state.mode == Mode.TERMINATED for rank in (4, 5, 6, 7))
    assert active_map(tree) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_tree_backfill_moves_the_highest_active_rank_into_the_hole():
    tree = node_tree(6, per_node=3, node_flag=ra.LayerFlag.BACKFILL)
    # every rank active; no reserve anywhere; root is BACKFILL
    tree.reassign({1})
    assert active_map(tree) == {0: 0, 5: 1, 2: 2, 3: 3, 4: 4}


def test_tree_without_healing_shifts():
    tree = ra.Tree([ra.Layer(key_or_fn="job"), ra.Layer(key_or_fn=lambda s: s.rank // 2)])
    tree.build_from_keys([["job", str(rank // 2)] for rank in range(6)], 6)
    tree.reassign({0})
    assert active_map(tree) == {1: 0, 2: 1, 3: 2, 4: 3, 5: 4}


def test_tree_world_size_filter_makes_reserves():
    tree = ra.Tree([ra.Layer(key_or_fn="job")], world_size_filter=lambda n: n // 2 * 2)
    tree.build_from_keys([["job"] for _ in range(5)], 5)
    tree.reassign({4})
    assert active_map(tree) == {0: 0, 1: 1, 2: 2, 3: 3}
    tree.reassign({0})
    assert active_map(tree) == {1: 0, 2: 1}
    assert tree.init_rank_map[3].state.mode == Mode.INACTIVE


def test_tree_needs_a_single_root():
    tree = ra.Tree([ra.Layer(key_or_fn=lambda s: s.rank)])
    with pytest.raises(RuntimeError):
        tree.build_from_keys([[str(rank)] for rank in range(2)], 2)


def test_tree_warns_when_dfs_order_differs_from_rank_order():
    tree = ra.Tree([ra.Layer(key_or_fn="job"), ra.Layer(key_or_fn=lambda s: s.rank % 2)])
    with pytest.warns(UserWarning):
        tree.build_from_keys([["job", str(rank % 2)] for rank in range(4)], 4)


def test_tree_call_through_the_store_and_discard():
    store = HashStore()
    world_size = 4
    for rank in range(world_size):
        store.send_key(["job", str(rank // 2)], rank)
    layers = [ra.Layer(key_or_fn="job", flag=ra.LayerFlag.RESERVE), ra.Layer(key_or_fn=lambda s: s.rank // 2)]
    trees = {rank: ra.Tree(layers) for rank in range(world_size)}
    states = {rank: trees[rank](ctx(rank, world_size, store=store)).state for rank in range(world_size)}
    assert [states[r].active_rank for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ra.RankDiscarded):
        trees[2](ra.RankAssignmentCtx(states[2], store, {2}))
    after = trees[3](ra.RankAssignmentCtx(states[3], store, {2})).state
    assert (after.rank, after.world_size, after.active_rank, after.active_world_size) == (2, 3, 2, 3)


def test_tree_at_16384_ranks_with_1024_terminated():
    """Job / 16 racks / 8-rank nodes, 1,024 idle reserves; 1,024 ranks die at once, three restarts in a row.

    The per-call time is printed (run with -s); bench/README.restart.md records it. Asserted: the invariants.
    """
    world_size, per_node, per_rack = 16384, 8, 1024
    layers = [
        ra.Layer(key_or_fn="job", max_ranks=world_size - 1024, flag=ra.LayerFlag.RESERVE | ra.LayerFlag.BACKFILL),
        ra.Layer(key_or_fn=lambda s: s.rank // per_rack, flag=ra.LayerFlag.RESERVE | ra.LayerFlag.BACKFILL),
        ra.Layer(key_or_fn=lambda s: s.rank // per_node, flag=ra.LayerFlag.RESERVE),
    ]
    keys = [["job", str(rank // per_rack), str(rank // per_node)] for rank in range(world_size)]
    tree = ra.Tree(layers)
    started = time.perf_counter()
    tree.build_from_keys(keys, world_size)
    timings = [time.perf_counter() - started]
    generator = random.Random(7)
    alive = world_size
    for restart in range(3):
        dead = set(generator.sample(range(alive), 1024))
        started = time.perf_counter()
        tree.reassign(dead)
        timings.append(time.perf_counter() - started)
        alive -= len(dead)
        leaves = list(tree.rank_map.values())
        assert len(leaves) == alive
        assert sorted(leaf.state.rank for leaf in leaves) == list(range(alive))
        active = sorted(leaf.state.active_rank for leaf in leaves if leaf.state.mode == Mode.ACTIVE)
        assert active == list(range(len(active)))
        assert {leaf.state.active_world_size for leaf in leaves} == {len(active)}
        if restart == 0:
            assert len(active) == world_size - 1024  # the reserves healed every hole
    # The first restart is fully healed by the reserves: the active world keeps its size.
    print(f"\nTree at 16,384 ranks: build {timings[0]:.3f} s, restarts with 1,024 terminated: "
          + ", ".join(f"{t:.3f} s" for t in timings[1:]))
