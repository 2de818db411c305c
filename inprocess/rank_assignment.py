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
import bisect
import dataclasses
import datetime
import enum
import heapq
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from . import exception, logs, utils  # noqa: F401 - names of the reference's module
from .state import Mode, State
from .store import StoreMixin  # noqa: F401 - names of the reference's module

log = logs.get_logger(__name__)


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


def _held(value: int | None) -> int:
    """A rank that is set at this step of an assignment (State's ranks are None only for a rank that left, or a
    process that has not been assigned one yet); says so to the type checker, and fails loudly if it is not."""
    assert value is not None, "a rank the assignment needs is not set"
    return value


def _discard_if_terminated(ctx: RankAssignmentCtx) -> None:
    if ctx.state.rank in ctx.terminated_ranks:
        raise RankDiscarded(
            f"rank {ctx.state.rank} (initial rank {ctx.state.initial_rank}) was terminated: "
            f"terminated_ranks={sorted(ctx.terminated_ranks)}"
        )


class ShiftRanks(RankAssignment):
    """Close the gaps: every healthy rank moves down by the number of terminated ranks below it.

    Only ``rank`` and ``world_size`` change, as in the reference; who is active is the business of a filter
    (``ActivateAllRanks``, ``MaxActiveWorldSize``, ...) listed before it in ``Compose``::

        +---+---+---+---+---+---+      +---+---+---+---+
        | 0 | X | 2 | 3 | X | 5 |  --> | 0 | 1 | 2 | 3 |
        +---+---+---+---+---+---+      +---+---+---+---+
                / / ______/            (2->1, 3->2, 5->3)
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        _discard_if_terminated(ctx)
        state, terminated = ctx.state, ctx.terminated_ranks
        rank = _held(state.rank)
        new_rank = rank - sum(1 for other in terminated if other < rank)
        ctx.state = dataclasses.replace(state, rank=new_rank, world_size=state.world_size - len(terminated))
        ctx.terminated_ranks = set()
        return ctx


class FillGaps(RankAssignment):
    """Keep the first ``world_size - #terminated`` ranks in place; the ranks above move into terminated slots.

    The rank ``r`` at or above the new world size takes the ``(r - new world size)``-th smallest terminated rank,
    exactly as the reference computes it (its tests pin 8 ranks, {1, 4, 5} terminated: 6->4, 7->5). Note what
    that implies when terminated ranks lie at or above the new world size: the result is the reference's, not
    a dense numbering. Only ``rank`` and ``world_size`` change::

        |<--- preserved --->|<- moved ->|
        +---+---+---+---+---+---+---+---+
        | 0 | X | 2 | 3 | X | X | 6 | 7 |
        +---+---+---+---+---+---+---+---+
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        _discard_if_terminated(ctx)
        state, terminated = ctx.state, ctx.terminated_ranks
        new_world_size = state.world_size - len(terminated)
        new_rank = _held(state.rank)
        if new_rank >= new_world_size:
            new_rank = sorted(terminated)[new_rank - new_world_size]
        ctx.state = dataclasses.replace(state, rank=new_rank, world_size=new_world_size)
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
    """Ranks below ``limit`` are active (active rank = rank), the others idle reserves."""
    state = ctx.state
    if state.rank is not None and state.rank < limit:
        ctx.state = dataclasses.replace(state, mode=Mode.ACTIVE, active_rank=state.rank, active_world_size=limit)
    else:
        ctx.state = dataclasses.replace(state, mode=Mode.INACTIVE, active_rank=None, active_world_size=limit)
    return ctx


def _current_active_world_size(state: State) -> int:
    if state.active_world_size is None:
        return state.world_size
    return min(state.active_world_size, state.world_size)


class MaxActiveWorldSize(RankFilter):
    """At most ``max_active_world_size`` active ranks; the ranks above are idle reserves.

    ::

        max_active_world_size=4
        +---+---+---+---+---+---+      +---+---+---+---+ - - - +
        | 0 | 1 | 2 | 3 | 4 | 5 |  --> | 0 | 1 | 2 | 3 | reserve |
        +---+---+---+---+---+---+      +---+---+---+---+ - - - +
    """

    def __init__(self, max_active_world_size: int | None = None) -> None:
        self.max_active_world_size = max_active_world_size

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        size = _current_active_world_size(ctx.state)
        if self.max_active_world_size is not None:
            size = min(size, self.max_active_world_size)
        return _limit_active(ctx, size)


class ActiveWorldSizeDivisibleBy(RankFilter):
    """Round the active world size down to a multiple of ``divisor``; the ranks above become reserves."""

    def __init__(self, divisor: int = 1) -> None:
        self.divisor = divisor

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        size = _current_active_world_size(ctx.state)
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
        key_or_fn: Any | Callable[[State], Any],
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
    max_ranks: int | None = None
    key_or_fn: Any | Callable[[State], Any] = ""
    flag: LayerFlag | None = None

    def key(self, state: State) -> Any:
        return self.key_or_fn(state) if callable(self.key_or_fn) else self.key_or_fn


def _hashable(key: Any) -> Any:
    """Layer keys travel through the store as JSON: lists come back where tuples went in."""
    if isinstance(key, list):
        return tuple(_hashable(item) for item in key)
    return key


def _as_state(value: Any) -> State:
    """A rank's published state: a ``State`` (in-memory stores of tests) or its JSON form (``send_state``)."""
    if isinstance(value, State):
        state = State.__new__(State)  # a plain copy of the fields; dataclasses.replace costs 16k __init__ calls
        state.__dict__.update(vars(value))
        return state
    names = {field.name for field in dataclasses.fields(State)}
    return State(**{name: item for name, item in dict(value).items() if name in names and name != "mode"})


class _Node:
    """A branch of the Tree: one key of one layer. ``reserve``: its idle leaves, oldest first."""

    __slots__ = ("key", "layer", "parent", "children", "leaves", "reserve", "chain", "is_reserve", "is_backfill")

    def __init__(self, key: Any, layer: Layer, parent: _Node | None) -> None:
        self.key = key
        self.layer = layer
        self.parent = parent
        self.children: dict[Any, _Node] = {}
        self.leaves: list[_Leaf] = []  # the leaves directly below (the last layer's nodes only)
        self.reserve: dict[int, _Leaf] = {}  # initial rank -> idle leaf anywhere below, in insertion order
        self.chain: tuple[_Node, ...] = (self,) + (parent.chain if parent is not None else ())  # self to root
        flag = layer.flag
        self.is_reserve = flag is not None and bool(flag & LayerFlag.RESERVE)  # enum arithmetic once, not per rank
        self.is_backfill = flag is not None and bool(flag & LayerFlag.BACKFILL)

    def iter_leaves(self) -> Iterator[_Leaf]:
        """Every leaf below, depth first (children in order of first appearance, leaves in rank order)."""
        yield from self.leaves
        for child in self.children.values():
            yield from child.iter_leaves()

    def __repr__(self) -> str:
        return f"_Node({self.key!r})"


class _Leaf:
    """One rank. ``state`` is the rank's state as the Tree assigns it (terminated leaves keep theirs)."""

    __slots__ = ("state", "parent", "backfill_domain")

    def __init__(self, state: State, parent: _Node) -> None:
        self.state = state
        self.parent = parent
        self.backfill_domain: _Node | None = None

    def ancestors(self) -> tuple[_Node, ...]:
        """The branches above this leaf, nearest first."""
        return self.parent.chain

    def activate(self, active_rank: int) -> None:
        self.state.mode = Mode.ACTIVE
        self.state.active_rank = active_rank
        self._leave_reserve()

    def deactivate(self) -> None:
        self.state.mode = Mode.INACTIVE
        self.state.active_rank = None
        for node in self.ancestors():
            node.reserve[_held(self.state.initial_rank)] = self

    def terminate(self) -> None:
        self.state.mode = Mode.TERMINATED
        self._leave_reserve()

    def _leave_reserve(self) -> None:
        for node in self.ancestors():
            node.reserve.pop(_held(self.state.initial_rank), None)


class Tree(RankAssignment):
    """Topology-aware assignment: ranks are leaves of a tree of layers (e.g. job / rack / node / rank).

    It assigns ranks and activity by itself and cannot be composed with other assignments. The algorithm is the
    reference's, step by step, so the same inputs give the same ranks.

    First call: every rank publishes its state and its layer keys, the tree is built (one root key required; a
    ``UserWarning`` if the depth-first order of the leaves differs from the rank order), and leaves are activated
    in depth-first order while every ancestor is below its ``max_ranks``. Then, on the first call as on every
    later one, given the terminated ranks:

    1. bottom-up, a branch with fewer than ``min_ranks`` healthy leaves is terminated entirely;
    2. in ascending rank order, a terminated active rank is replaced by the idle rank most recently made idle
       in the nearest ancestor flagged RESERVE (walking up while the flag holds)::

           node A (RESERVE)              node A
           [0] [X] [1] (idle)    -->     [0] [1]<-took X's place

    3. the terminations left over are filled, inside the highest contiguous BACKFILL ancestor, by that domain's
       active ranks with the largest active ranks;
    4. the remaining gaps close by shifting the active ranks down;
    5. ``world_size_filter(n) -> m <= n`` turns active ranks ``>= m`` into reserves;
    6. every leaf gets the new world size, and ``rank`` is renumbered in depth-first order, survivors first
       (terminated leaves keep a rank past the world size, for bookkeeping).

    A terminated caller gets ``RankDiscarded``. ``init_rank_map`` (initial rank -> leaf), ``rank_map`` (rank ->
    leaf) and ``tree`` (the root) are public, as in the reference; a leaf's ``state`` is its assigned State.
    """

    def __init__(self, layers: list[Layer], world_size_filter: Callable[[int], int] | None = None) -> None:
        if not layers:
            raise ValueError("Tree needs at least one layer")
        self.layers = layers
        self.world_size_filter = world_size_filter
        self.tree: _Node | None = None
        self.rank_map: dict[int, _Leaf] = {}
        self.init_rank_map: dict[int, _Leaf] = {}

    # ---- building ---------------------------------------------------------------------------------------------

    def _layer_keys(self, state: State) -> list:
        return [layer.key_or_fn(state) if callable(layer.key_or_fn) else layer.key_or_fn for layer in self.layers]

    def _build(self, state: State, store: Any) -> None:
        fields = ("rank", "world_size", "initial_rank", "initial_world_size")
        published = {field: getattr(state, field) for field in fields}
        ranks = list(range(state.world_size))
        store.send_state(published, state.rank)
        states = store.get_states(ranks)
        store.send_key(self._layer_keys(state), state.rank)
        keys = store.get_keys(ranks)
        self.build_from_keys(keys, state.world_size, states)

    def build_from_keys(self, all_keys: list[list], world_size: int, states: list | None = None) -> None:
        """Build and activate the tree from every rank's layer keys (``all_keys[rank]``) and published states."""
        if states is None:
            states = [State(rank, world_size) for rank in range(world_size)]
        roots = {_hashable(keys[0]) for keys in all_keys}
        if len(roots) != 1:
            raise RuntimeError(
                "all distributed ranks are required to share the same grouping key at the root level of the "
                f"topology tree, but got root_keys={sorted(map(repr, roots))[:8]}"
            )
        root = _Node(roots.pop(), self.layers[0], None)
        self.rank_map, self.init_rank_map = {}, {}
        for keys, published in zip(all_keys, states, strict=True):
            node = root
            for key, layer in zip(keys[1:], self.layers[1:], strict=True):
                key = _hashable(key)
                child = node.children.get(key)
                if child is None:
                    child = node.children[key] = _Node(key, layer, node)
                node = child
            leaf = _Leaf(_as_state(published), node)
            node.leaves.append(leaf)
            self.init_rank_map[_held(leaf.state.initial_rank)] = leaf
            self.rank_map[_held(leaf.state.rank)] = leaf
        self.tree = root
        for position, leaf in enumerate(root.iter_leaves()):
            if position != leaf.state.rank:
                warnings.warn(
                    "Initial environment rank assignment does not match the specified topology: "
                    f"topology_rank={position} environment_rank={leaf.state.rank}",
                    UserWarning,
                    stacklevel=2,
                )
                break
        active_world_size = self._activate(root)
        domains: dict[int, _Node | None] = {}
        for leaf in root.iter_leaves():
            leaf.state.active_world_size = active_world_size
            parent = leaf.parent
            if id(parent) not in domains:
                domain = None
                for node in parent.chain:
                    if not node.is_backfill:
                        break
                    domain = node
                domains[id(parent)] = domain
            leaf.backfill_domain = domains[id(parent)]

    def _activate(self, root: _Node) -> int:
        """Depth first, activate each leaf while every ancestor is below its ``max_ranks``; returns the count."""
        counts: dict[int, int] = {}
        active = 0
        for leaf in root.iter_leaves():
            chain = leaf.parent.chain
            if all(node.layer.max_ranks is None or counts.get(id(node), 0) < node.layer.max_ranks for node in chain):
                leaf.activate(active)
                active += 1
                for node in chain:
                    counts[id(node)] = counts.get(id(node), 0) + 1
            else:
                leaf.deactivate()
        return active

    # ---- one call ---------------------------------------------------------------------------------------------

    def _propagate_terminations(self, node: _Node, terminated: set[int]) -> int:
        """Step 1, children before parents; adds to ``terminated``, returns the healthy leaves below ``node``."""
        healthy = sum(self._propagate_terminations(child, terminated) for child in node.children.values())
        healthy += sum(
            1 for leaf in node.leaves if leaf.state.mode != Mode.TERMINATED and leaf.state.rank not in terminated
        )
        if healthy < node.layer.min_ranks:
            live = (leaf for leaf in node.iter_leaves() if leaf.state.mode != Mode.TERMINATED)
            terminated.update(_held(leaf.state.rank) for leaf in live)
            return 0
        return healthy

    def _replace_with_reserve(self, terminated_active: set[int]) -> set[int]:
        """Step 2; returns the terminated active ranks whose place an idle rank took."""
        replaced = set()
        for rank in sorted(terminated_active):
            dead = self.rank_map[rank]
            for node in dead.ancestors():
                if not node.is_reserve:
                    break
                if node.reserve:
                    _, idle = node.reserve.popitem()
                    idle.activate(_held(dead.state.active_rank))
                    replaced.add(rank)
                    break
        return replaced

    def _backfill(self, unhandled: set[int]) -> set[int]:
        """Step 3; returns the active ranks that became free (to be closed by the shift of step 4)."""
        freed: set[int] = set()
        domains: dict[int, tuple[_Node, list[_Leaf]]] = {}
        for rank in sorted(unhandled):
            dead = self.rank_map[rank]
            if dead.backfill_domain is None:
                freed.add(_held(dead.state.active_rank))
            else:
                domains.setdefault(id(dead.backfill_domain), (dead.backfill_domain, []))[1].append(dead)
        for domain, dead_leaves in domains.values():
            largest = heapq.nlargest(
                len(dead_leaves),
                (leaf for leaf in domain.iter_leaves() if leaf.state.mode == Mode.ACTIVE),
                key=lambda leaf: _held(leaf.state.active_rank),
            )
            largest.reverse()
            for position, dead in enumerate(dead_leaves):
                if position < len(largest):
                    mover = largest[position]
                    freed.add(_held(mover.state.active_rank))
                    mover.state.active_rank = dead.state.active_rank
                else:
                    freed.add(_held(dead.state.active_rank))
        return freed

    def _shift(self, freed: set[int], unhandled_count: int) -> None:
        """Step 4: every active rank moves down by the number of freed positions below it."""
        ordered = sorted(freed)
        for leaf in self.rank_map.values():
            leaf.state.active_world_size = _held(leaf.state.active_world_size) - unhandled_count
            if leaf.state.active_rank is not None:
                leaf.state.active_rank -= bisect.bisect_left(ordered, leaf.state.active_rank)

    def _filter_active_world_size(self) -> None:
        """Step 5."""
        assert self.world_size_filter is not None and self.tree is not None
        current = _held(next(iter(self.rank_map.values())).state.active_world_size)
        limit = self.world_size_filter(current)
        if limit > current:
            raise ValueError(f"world_size_filter returned {limit} > {current}")
        for leaf in self.tree.iter_leaves():
            leaf.state.active_world_size = limit
            if leaf.state.mode == Mode.ACTIVE and _held(leaf.state.active_rank) >= limit:
                leaf.deactivate()

    def _renumber(self, world_size: int, terminated: set[int]) -> None:
        """Step 6."""
        assert self.tree is not None
        leaves = list(self.tree.iter_leaves())
        for leaf in leaves:
            leaf.state.world_size = world_size
        for rank in terminated:
            self.rank_map[rank].state.rank = None
            self.rank_map[rank].state.active_rank = None
        leaves.sort(key=lambda leaf: leaf.state.mode == Mode.TERMINATED)
        self.rank_map = {}
        for rank, leaf in enumerate(leaves):
            leaf.state.rank = rank
            self.rank_map[rank] = leaf

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        state = ctx.state
        if self.tree is None:
            self._build(state, ctx.store)
        assert self.tree is not None
        for leaf in self.tree.iter_leaves():
            leaf.state.copy_from(state, fields=("fn_exception", "iteration"))

        terminated = {rank for rank in ctx.terminated_ranks if rank in self.rank_map}
        self._propagate_terminations(self.tree, terminated)
        terminated_active = {rank for rank in terminated if self.rank_map[rank].state.mode == Mode.ACTIVE}
        for rank in terminated:
            self.rank_map[rank].terminate()
        unhandled = terminated_active - self._replace_with_reserve(terminated_active)
        if unhandled:
            self._shift(self._backfill(unhandled), len(unhandled))
        if self.world_size_filter is not None:
            self._filter_active_world_size()
        self._renumber(state.world_size - len(terminated), terminated)

        leaf = self.init_rank_map[_held(state.initial_rank)]
        if leaf.state.mode == Mode.TERMINATED:
            raise RankDiscarded(
                f"rank {state.rank} (initial rank {state.initial_rank}) was terminated by Tree: "
                f"terminated_ranks={sorted(terminated)}"
            )
        ctx.state = dataclasses.replace(leaf.state)
        ctx.terminated_ranks = set()
        return ctx
