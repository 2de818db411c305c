"""Rank assignment: who the survivors of a restart are, what their ranks become, and who is active.

An assignment is a callable ``RankAssignmentCtx -> RankAssignmentCtx``. ``ctx.terminated_ranks`` holds the ranks,
in the numbering of the iteration that just ended (``state.rank``), that must leave; a step that renumbers
(``ShiftRanks``, ``FillGaps``) removes them and clears the set, a filter (``RankFilter``) only decides who is
active. With ``Compose`` the last listed step runs first, so list filters *before* the step that renumbers::

    Compose(MaxActiveWorldSize(8), ShiftRanks())     # ShiftRanks runs, then MaxActiveWorldSize

Every rank runs the same assignment on the same inputs and must reach the same answer.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import enum
import heapq
import itertools
import logging
import warnings
from typing import Any, Callable, Optional, Union

from . import exception
from .state import Mode, State

log = logging.getLogger(__name__)


class RankDiscarded(exception.RestartError):
    """The calling rank was dropped by the rank assignment; it leaves the wrapper with this exception."""


@dataclasses.dataclass
class RankAssignmentCtx:
    """Input and output of every assignment step."""

    state: State
    store: Any
    terminated_ranks: set[int]


class RankAssignment(abc.ABC):
    @abc.abstractmethod
    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        raise NotImplementedError


class RankFilter(RankAssignment):
    """Marker base of steps that only decide active/inactive; they run after the steps that renumber."""


def _discard_if_terminated(ctx: RankAssignmentCtx) -> None:
    if ctx.state.rank in ctx.terminated_ranks:
        raise RankDiscarded(f"rank {ctx.state.rank} (initial rank {ctx.state.initial_rank}) was terminated")


def _renumbered(state: State, rank: int, world_size: int) -> State:
    return dataclasses.replace(
        state, rank=rank, world_size=world_size, active_rank=rank, active_world_size=world_size, mode=Mode.ACTIVE
    )


class ShiftRanks(RankAssignment):
    """Close the gaps: every healthy rank moves down by the number of terminated ranks below it.

    ::

        +---+---+---+---+---+---+      +---+---+---+---+
        | 0 | X | 2 | 3 | X | 5 |  --> | 0 | 1 | 2 | 3 |
        +---+---+---+---+---+---+      +---+---+---+---+
                / / ______/            (2->1, 3->2, 5->3)
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        _discard_if_terminated(ctx)
        state = ctx.state
        terminated = {rank for rank in ctx.terminated_ranks if 0 <= rank < state.world_size}
        new_rank = state.rank - sum(1 for rank in terminated if rank < state.rank)
        ctx.state = _renumbered(state, new_rank, state.world_size - len(terminated))
        ctx.terminated_ranks = set()
        return ctx


class FillGaps(RankAssignment):
    """Keep the first ``world_size - #terminated`` ranks in place; the surplus healthy ranks fill the holes.

    ::

        |<--- preserved --->|<- moved ->|     |<--new world size->|
        +---+---+---+---+---+---+---+---+     +---+---+---+---+---+
        | 0 | X | 2 | 3 | X | X | 6 | 7 | --> | 0 | 6 | 2 | 3 | 7 |
        +---+---+---+---+---+---+---+---+     +---+---+---+---+---+
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        _discard_if_terminated(ctx)
        state = ctx.state
        terminated = {rank for rank in ctx.terminated_ranks if 0 <= rank < state.world_size}
        new_world_size = state.world_size - len(terminated)
        new_rank = state.rank
        if state.rank >= new_world_size:
            holes = sorted(rank for rank in terminated if rank < new_world_size)
            movers = [rank for rank in range(new_world_size, state.world_size) if rank not in terminated]
            new_rank = dict(zip(movers, holes))[state.rank]
        ctx.state = _renumbered(state, new_rank, new_world_size)
        ctx.terminated_ranks = set()
        return ctx


class ActivateAllRanks(RankFilter):
    """Every rank is active and sees its wrapper rank."""

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        ctx.state = dataclasses.replace(
            ctx.state, mode=Mode.ACTIVE, active_rank=ctx.state.rank, active_world_size=ctx.state.world_size
        )
        return ctx


def _limit_active(ctx: RankAssignmentCtx, limit: int) -> RankAssignmentCtx:
    state = ctx.state
    current = state.active_rank if state.mode == Mode.ACTIVE and state.active_rank is not None else state.rank
    if current is not None and current < limit:
        ctx.state = dataclasses.replace(state, mode=Mode.ACTIVE, active_rank=current, active_world_size=limit)
    else:
        ctx.state = dataclasses.replace(state, mode=Mode.INACTIVE, active_rank=None, active_world_size=limit)
    return ctx


class MaxActiveWorldSize(RankFilter):
    """At most ``max_active_world_size`` active ranks; the ranks above are idle reserves.

    ::

        max_active_world_size=4
        +---+---+---+---+---+---+      +---+---+---+---+ - - - +
        | 0 | 1 | 2 | 3 | 4 | 5 |  --> | 0 | 1 | 2 | 3 | reserve |
        +---+---+---+---+---+---+      +---+---+---+---+ - - - +
    """

    def __init__(self, max_active_world_size: Optional[int] = None) -> None:
        self.max_active_world_size = max_active_world_size

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        state = ctx.state
        size = state.active_world_size if state.active_world_size is not None else state.world_size
        if self.max_active_world_size is not None:
            size = min(size, self.max_active_world_size)
        return _limit_active(ctx, size)


class ActiveWorldSizeDivisibleBy(RankFilter):
    """Round the active world size down to a multiple of ``divisor``; the ranks above become reserves."""

    def __init__(self, divisor: int = 1) -> None:
        self.divisor = divisor

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        state = ctx.state
        size = state.active_world_size if state.active_world_size is not None else state.world_size
        return _limit_active(ctx, size // self.divisor * self.divisor)


class FilterCountGroupedByKey(RankAssignment):
    """Terminate every rank whose group (ranks sharing a key) has a size failing ``condition``.

    Example: keep only whole nodes of 8 ranks: ``FilterCountGroupedByKey(lambda s: s.initial_rank // 8,
    lambda count: count == 8)``. Distributed: every surviving rank takes part, the result lands in
    ``ctx.terminated_ranks`` for a later ``ShiftRanks``/``FillGaps``. All ranks must create the same
    instances in the same order (the store keys are named after a per-class instance counter).
    """

    _instance_counter = itertools.count()  # shared by design (the key names must agree across ranks)

    def __init__(
        self,
        key_or_fn: Union[Any, Callable[[State], Any]],
        condition: Callable[[int], bool],
        timeout: datetime.timedelta = datetime.timedelta(seconds=60),
    ) -> None:
        self.key_or_fn = key_or_fn
        self.condition = condition
        self.timeout = timeout
        self.name = f"FilterCountGroupedByKey_{next(FilterCountGroupedByKey._instance_counter)}"

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        state, store = ctx.state, ctx.store
        if state.rank in ctx.terminated_ranks:
            return ctx
        alive = state.world_size - len({rank for rank in ctx.terminated_ranks if 0 <= rank < state.world_size})
        key = self.key_or_fn(state) if callable(self.key_or_fn) else self.key_or_fn
        count_key = f"filter_grouped_by_key_{self.name}_{key}"
        store.add(count_key, 1)
        store.reentrant_barrier([state.rank], f"count_alive_barrier_{self.name}", alive, self.timeout)
        if not self.condition(int(store.add(count_key, 0))):
            store.append(f"ranks_to_terminate_{self.name}", f"{state.rank},")
        store.reentrant_barrier([state.rank], f"submit_mismatching_barrier_{self.name}", alive, self.timeout)
        mismatching = {int(rank) for rank in store.get_packed(f"ranks_to_terminate_{self.name}", ",")}
        ctx.terminated_ranks = set(ctx.terminated_ranks) | mismatching
        return ctx


class LayerFlag(enum.Flag):
    """How a Tree layer may heal itself.

    RESERVE: a dead active rank may be replaced by an idle rank found in this subtree.
    BACKFILL: inside this subtree, the highest active rank may move into a hole.
    """

    RESERVE = enum.auto()
    BACKFILL = enum.auto()


@dataclasses.dataclass
class Layer:
    """One level of a Tree: ranks with the same key share a subtree.

    ``min_ranks``: fewer healthy ranks in a subtree terminate the whole subtree. ``max_ranks``: at most this many
    active ranks in a subtree (``None``: no limit). ``key_or_fn``: a constant or a function of ``State``.
    """

    min_ranks: int = 1
    max_ranks: Optional[int] = None
    key_or_fn: Union[Any, Callable[[State], Any]] = ""
    flag: Optional[LayerFlag] = None

    def key(self, state: State) -> Any:
        return self.key_or_fn(state) if callable(self.key_or_fn) else self.key_or_fn


class _Node:
    __slots__ = ("key", "layer", "parent", "children", "leaves", "depth")

    def __init__(self, key: Any, layer: Layer, parent: Optional["_Node"], depth: int) -> None:
        self.key = key
        self.layer = layer
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.leaves: list[_Leaf] = []  # every leaf of the subtree, in DFS order (filled after the build)
        self.depth = depth

    def has(self, flag: LayerFlag) -> bool:
        return self.layer.flag is not None and bool(self.layer.flag & flag)

    def ancestors(self) -> list["_Node"]:
        node, chain = self, []
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain


class _Leaf:
    __slots__ = ("state", "parent", "dfs_index")

    def __init__(self, state: State, parent: _Node, dfs_index: int) -> None:
        self.state = state
        self.parent = parent
        self.dfs_index = dfs_index

    def terminate(self) -> None:
        self.state = dataclasses.replace(self.state, mode=Mode.TERMINATED, rank=None, active_rank=None)


class Tree(RankAssignment):
    """Topology-aware assignment: ranks are leaves of a tree of layers (e.g. job / rack / node / rank).

    It assigns ranks and activity by itself and cannot be composed with other assignments. First call: every
    rank publishes its layer keys, the tree is built (one root key required), and leaves are activated in DFS
    order while every ancestor is below its ``max_ranks``. Every later call, given the terminated ranks:

    1. a subtree with fewer than ``min_ranks`` healthy leaves is terminated entirely (bottom-up);
    2. a dead active rank is replaced by an idle rank from the nearest ancestors flagged RESERVE::

           node A (RESERVE)              node A
           [0] [X] [1] (idle)    -->     [0] [1]<-took X's place

    3. the holes left over are filled, inside the highest contiguous BACKFILL ancestor, by the active ranks with
       the largest active rank;
    4. the remaining active ranks shift down to close the gaps;
    5. ``world_size_filter(n) -> m <= n`` turns active ranks ``>= m`` into reserves;
    6. ``rank`` is renumbered over the surviving leaves in their previous order.

    A terminated caller gets ``RankDiscarded``.
    """

    def __init__(self, layers: list[Layer], world_size_filter: Optional[Callable[[int], int]] = None) -> None:
        if not layers:
            raise ValueError("Tree needs at least one layer")
        self.layers = layers
        self.world_size_filter = world_size_filter
        self.tree: Optional[_Node] = None
        self.rank_map: dict[int, _Leaf] = {}
        self.init_rank_map: dict[int, _Leaf] = {}

    # ---- building ---------------------------------------------------------------------------------------------

    def _build(self, ctx: RankAssignmentCtx) -> None:
        state, store = ctx.state, ctx.store
        keys = [str(layer.key(state)) for layer in self.layers]
        store.send_key(keys, state.rank)
        all_keys = store.get_keys(list(range(state.world_size)))
        self.build_from_keys(all_keys, state.world_size)

    def build_from_keys(self, all_keys: list[list], world_size: int) -> None:
        """Build the tree from every rank's layer keys (``all_keys[rank]``)."""
        roots = {str(keys[0]) for keys in all_keys}
        if len(roots) != 1:
            raise RuntimeError(f"Tree needs a single root key, got {sorted(roots)[:8]}")
        root = _Node(roots.pop(), self.layers[0], None, 0)
        leaf_parents: list[_Node] = []
        for rank in range(world_size):
            node = root
            for depth in range(1, len(self.layers)):
                key = str(all_keys[rank][depth])
                child = node.children.get(key)
                if child is None:
                    child = node.children[key] = _Node(key, self.layers[depth], node, depth)
                node = child
            leaf_parents.append(node)
        # DFS order of leaves: children in order of first appearance, leaves of a node in rank order.
        by_parent: dict[int, list[int]] = {}
        for rank, parent in enumerate(leaf_parents):
            by_parent.setdefault(id(parent), []).append(rank)
        order: list[int] = []
        stack = [root]
        while stack:
            node = stack.pop()
            order.extend(by_parent.get(id(node), ()))
            stack.extend(reversed(list(node.children.values())))
        if order != list(range(world_size)):
            warnings.warn("Tree: the DFS order of the leaves differs from the rank order", UserWarning)
        leaves: dict[int, _Leaf] = {}
        for dfs_index, rank in enumerate(order):
            leaf_state = State(rank=rank, world_size=world_size, initial_rank=rank, initial_world_size=world_size)
            leaves[rank] = _Leaf(leaf_state, leaf_parents[rank], dfs_index)
        for rank in order:
            for node in leaf_parents[rank].ancestors():
                node.leaves.append(leaves[rank])
        self.tree = root
        self.rank_map = dict(leaves)
        self.init_rank_map = dict(leaves)
        # Activation in DFS order while every ancestor is below its max_ranks.
        active_count: dict[int, int] = {}
        next_active = 0
        for rank in order:
            leaf = leaves[rank]
            chain = leaf.parent.ancestors()
            if all(node.layer.max_ranks is None or active_count.get(id(node), 0) < node.layer.max_ranks for node in chain):
                for node in chain:
                    active_count[id(node)] = active_count.get(id(node), 0) + 1
                leaf.state = dataclasses.replace(leaf.state, mode=Mode.ACTIVE, active_rank=next_active)
                next_active += 1
            else:
                leaf.state = dataclasses.replace(leaf.state, mode=Mode.INACTIVE, active_rank=None)
        self._finish_activity(next_active)

    def _finish_activity(self, active_world_size: int) -> None:
        for leaf in self.rank_map.values():
            leaf.state = dataclasses.replace(leaf.state, active_world_size=active_world_size)

    # ---- a restart ----------------------------------------------------------------------------------------------

    def _propagate_terminations(self, dead: set[int]) -> set[int]:
        """Step 1: bottom-up, a subtree below ``min_ranks`` healthy leaves dies entirely."""
        assert self.tree is not None
        dead_leaves = {id(self.rank_map[rank]) for rank in dead}
        post_order: list[_Node] = []
        stack = [self.tree]
        while stack:
            node = stack.pop()
            post_order.append(node)
            stack.extend(node.children.values())
        for node in reversed(post_order):  # children before parents
            healthy = sum(1 for leaf in node.leaves if id(leaf) not in dead_leaves)
            if 0 < healthy < node.layer.min_ranks or (healthy == 0 and node.layer.min_ranks > 0):
                dead_leaves.update(id(leaf) for leaf in node.leaves)
        return {rank for rank, leaf in self.rank_map.items() if id(leaf) in dead_leaves}

    def reassign(self, terminated_ranks: set[int]) -> None:
        """Apply one restart's terminations to the whole tree (the same on every rank)."""
        dead = self._propagate_terminations({rank for rank in terminated_ranks if rank in self.rank_map})
        leaves_by_position: dict[int, _Leaf] = {}
        for leaf in self.rank_map.values():
            if leaf.state.mode == Mode.ACTIVE:
                leaves_by_position[leaf.state.active_rank] = leaf
        holes: list[tuple[int, _Node]] = []
        for rank in sorted(dead):
            leaf = self.rank_map[rank]
            if leaf.state.mode == Mode.ACTIVE:
                holes.append((leaf.state.active_rank, leaf.parent))
                del leaves_by_position[leaf.state.active_rank]
            leaf.terminate()
        holes.sort(key=lambda hole: hole[0])

        # Step 2: idle replacements from RESERVE ancestors.
        idle_cursor: dict[int, int] = {}
        unfilled: list[tuple[int, _Node]] = []
        for position, dead_leaf_parent in holes:
            node: Optional[_Node] = dead_leaf_parent
            replacement = None
            while node is not None and node.has(LayerFlag.RESERVE):
                replacement = self._take_idle(node, idle_cursor)
                if replacement is not None:
                    break
                node = node.parent
            if replacement is not None:
                replacement.state = dataclasses.replace(replacement.state, mode=Mode.ACTIVE, active_rank=position)
                leaves_by_position[position] = replacement
            else:
                unfilled.append((position, dead_leaf_parent))

        # Step 3: backfill inside the highest contiguous BACKFILL ancestor, largest active ranks first.
        heaps: dict[int, list[tuple[int, int, _Leaf]]] = {}
        for position, parent in unfilled:
            top = None
            node = parent
            while node is not None and node.has(LayerFlag.BACKFILL):
                top = node
                node = node.parent
            if top is None:
                continue
            heap = heaps.get(id(top))
            if heap is None:
                heap = [(-leaf.state.active_rank, leaf.dfs_index, leaf) for leaf in top.leaves if leaf.state.mode == Mode.ACTIVE]
                heapq.heapify(heap)
                heaps[id(top)] = heap
            while heap:
                negative, _, leaf = heap[0]
                if leaf.state.mode != Mode.ACTIVE or leaf.state.active_rank != -negative:
                    heapq.heappop(heap)  # stale entry
                    continue
                break
            if heap and -heap[0][0] > position:
                _, index, leaf = heapq.heappop(heap)
                del leaves_by_position[leaf.state.active_rank]
                leaf.state = dataclasses.replace(leaf.state, active_rank=position)
                leaves_by_position[position] = leaf
                heapq.heappush(heap, (-position, index, leaf))

        # Step 4: shift the remaining active ranks down.
        ordered = [leaves_by_position[position] for position in sorted(leaves_by_position)]
        for new_position, leaf in enumerate(ordered):
            leaf.state = dataclasses.replace(leaf.state, active_rank=new_position)
        active_world_size = len(ordered)

        # Step 5: optional world size filter.
        if self.world_size_filter is not None:
            limit = self.world_size_filter(active_world_size)
            if limit > active_world_size:
                raise ValueError(f"world_size_filter returned {limit} > {active_world_size}")
            for leaf in ordered[limit:]:
                leaf.state = dataclasses.replace(leaf.state, mode=Mode.INACTIVE, active_rank=None)
            active_world_size = limit

        # Step 6: renumber the surviving leaves in their previous order.
        survivors = [self.rank_map[rank] for rank in sorted(self.rank_map) if rank not in dead]
        self.rank_map = {}
        for new_rank, leaf in enumerate(survivors):
            leaf.state = dataclasses.replace(leaf.state, rank=new_rank, world_size=len(survivors))
            self.rank_map[new_rank] = leaf
        self._finish_activity(active_world_size)

    def _take_idle(self, node: _Node, cursor: dict[int, int]) -> Optional[_Leaf]:
        index = cursor.get(id(node), 0)
        leaves = node.leaves
        while index < len(leaves):
            leaf = leaves[index]
            index += 1
            if leaf.state.mode == Mode.INACTIVE:
                cursor[id(node)] = index
                return leaf
        cursor[id(node)] = index
        return None

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        state = ctx.state
        if self.tree is None:
            self._build(ctx)
            leaf = self.rank_map[state.rank]
        else:
            leaf = self.rank_map.get(state.rank)
            if leaf is None:
                raise exception.InternalError(f"Tree: unknown rank {state.rank}")
            self.reassign(set(ctx.terminated_ranks))
            if leaf.state.mode == Mode.TERMINATED:
                raise RankDiscarded(f"rank {state.rank} (initial rank {state.initial_rank}) was terminated by Tree")
        ctx.state = dataclasses.replace(
            state,
            rank=leaf.state.rank,
            world_size=leaf.state.world_size,
            active_rank=leaf.state.active_rank,
            active_world_size=leaf.state.active_world_size,
            mode=leaf.state.mode,
        )
        ctx.terminated_ranks = set()
        return ctx
