"""The rendezvous rules of torch.distributed.elastic's dynamic rendezvous, as a sans-I/O state machine.

Everything that decides who is admitted to which round lives in this file, and nothing else does: no sockets, no
threads, no clock reads (time comes in with each event), no knowledge of where the state is stored. A driver
keeps one ``Rendezvous`` value for the job (in a store, behind compare-and-set), feeds it events and delivers the
outcomes to the nodes they name. The rules are torch elastic's (the ``torch.distributed.elastic.rendezvous``
module documentation, kept in docs/elastic.md section 4, and ``dynamic_rendezvous.py``):

Theory of operation
-------------------
A *round* gathers participants. It is **open** until it completes: at once when ``max_nodes`` have joined, or
``last_call`` seconds after the ``min_nodes``-th joined (so nodes arriving at about the same time are not left
out). Completion assigns the ranks ``0..n-1`` in the order of the node ids, the same for everyone
(**consistency**). A completed round is **exclusive**: a node arriving late never forms a second group; it
waits in the *wait list* (counted by ``waiting``, so the job can decide to start a new round) or, when the round
already has ``max_nodes``, in the *redundancy list* (spare capacity, not counted). A participant that asks to
join again leaves its round first; when the last participant of a completed round has left, the next round
opens and every waiting node, then every spare, joins it. A node whose join has not been admitted
``join_timeout`` seconds after it began fails with a timeout, which is **not retryable** (a fail-safe that
releases resources when ``min_nodes`` is never reached). A **closed** rendezvous admits nobody: pending joins
fail with ``closed``. A node that leaves or is found dead is removed; below ``min_nodes`` an open round loses its
last-call deadline.

Where this differs from torch, on purpose: torch's nodes poll the shared state once a second and act on what
they see; here each event settles the state at once (every node's next poll is taken to have happened), in
node-id order where torch would race. Closing removes the pending nodes from the lists (torch leaves them until
their keep-alives expire). Dead nodes arrive as ``Leave`` events (the rasd mesh's PEER_DEAD) instead of expired
keep-alives.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Settings:
    """torch elastic's ``min_nodes``, ``max_nodes`` and ``RendezvousTimeout`` (join 600 s, last call 30 s)."""

    min_nodes: int
    max_nodes: int
    last_call: float = 30.0
    join_timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.min_nodes < 1:
            raise ValueError(f"The minimum number of nodes ({self.min_nodes}) must be greater than zero.")
        if self.max_nodes < self.min_nodes:
            raise ValueError(
                f"The maximum number of nodes ({self.max_nodes}) must be greater than or equal to the "
                f"minimum number of nodes ({self.min_nodes})."
            )
        for name in ("last_call", "join_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"The {name} timeout ({getattr(self, name)}) must be positive.")


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """The shared state of one job's rendezvous (torch's ``_RendezvousState``), immutable.

    ``participants`` of the current round, in join order until it completes; ``ranks`` once it is complete.
    ``join_deadlines``: when each pending join (participant of the open round, waiting node) fails.
    """

    round: int = 0
    complete: bool = False
    deadline: float | None = None  # the last call: when an open round with at least min_nodes completes
    closed: bool = False
    participants: tuple[str, ...] = ()
    ranks: tuple[tuple[str, int], ...] = ()
    wait_list: frozenset[str] = frozenset()
    redundancy_list: frozenset[str] = frozenset()
    join_deadlines: tuple[tuple[str, float], ...] = ()

    @property
    def waiting(self) -> int:
        """torch's ``num_nodes_waiting()``: late nodes that can take part in the next round."""
        return len(self.wait_list)

    def rank_of(self, node: str) -> int | None:
        return dict(self.ranks).get(node)

    def join_deadline(self, node: str) -> float | None:
        return dict(self.join_deadlines).get(node)


# ---- events in, outcomes out ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Join:
    """``next_rendezvous()`` on ``node``: a first join, or a participant of a completed round asking for the next."""

    node: str
    now: float


@dataclasses.dataclass(frozen=True)
class Leave:
    """``node`` left (shut down, removed by the discovery hook) or was found dead by the mesh."""

    node: str
    now: float


@dataclasses.dataclass(frozen=True)
class Tick:
    """Time passed: last-call completions and join timeouts up to ``now`` happen."""

    now: float


@dataclasses.dataclass(frozen=True)
class Close:
    """``set_closed()``: nobody joins any more."""

    now: float


Event = Join | Leave | Tick | Close


@dataclasses.dataclass(frozen=True)
class Admitted:
    node: str
    round: int
    rank: int
    world_size: int


@dataclasses.dataclass(frozen=True)
class Waiting:
    """Joined late: waits in the wait list for the next round (``spare``: in the redundancy list, not counted)."""

    node: str
    round: int
    spare: bool = False


class Failure(str, enum.Enum):
    TIMEOUT = "timeout"  # the join timeout: not retryable
    CLOSED = "closed"


@dataclasses.dataclass(frozen=True)
class Failed:
    node: str
    reason: Failure


Outcome = Admitted | Waiting | Failed


# ---- the rules --------------------------------------------------------------------------------------------------


class Action(enum.Enum):
    """What a joining node does next (torch's ``_Action``)."""

    ERROR_CLOSED = "fail: closed"
    KEEP_WAITING = "nothing: already pending"
    ADD_TO_PARTICIPANTS = "join the open round"
    ADD_TO_WAIT_LIST = "wait for the next round"
    ADD_TO_REDUNDANCY_LIST = "wait as a spare"


@dataclasses.dataclass(frozen=True)
class Rule:
    situation: str
    applies: Callable[[Rendezvous, str, Settings], bool]
    action: Action


#: What a node asking to join does, first match wins (after it left the round it took part in, if any).
JOIN_RULES: tuple[Rule, ...] = (
    Rule("the rendezvous is closed", lambda state, node, settings: state.closed, Action.ERROR_CLOSED),
    Rule("the round is open", lambda state, node, settings: not state.complete, Action.ADD_TO_PARTICIPANTS),
    Rule("the node already waits", lambda state, node, settings: node in state.wait_list, Action.KEEP_WAITING),
    Rule(
        "the round is complete with room below max_nodes",
        lambda state, node, settings: len(state.participants) < settings.max_nodes,
        Action.ADD_TO_WAIT_LIST,
    ),
    Rule(
        "the node is already a spare", lambda state, node, settings: node in state.redundancy_list, Action.KEEP_WAITING
    ),
    Rule("the round is complete with max_nodes", lambda state, node, settings: True, Action.ADD_TO_REDUNDANCY_LIST),
)

#: What the count of participants does to a round (checked after every change).
ROUND_RULES: tuple[tuple[str, str], ...] = (
    ("an open round reaches min_nodes participants", "the last call starts: deadline = now + last_call"),
    ("an open round reaches max_nodes participants", "complete now"),
    ("an open round with min..max participants passes its deadline", "complete"),
    ("an open round drops below min_nodes", "no deadline"),
    ("the last participant leaves a complete round", "round + 1, open; waiting nodes join, then spares"),
    ("a complete round has fewer than max_nodes participants", "spares move to the wait list"),
    ("a pending join passes its join deadline", "the node is removed and fails: timeout (not retryable)"),
    ("close", "pending joins fail: closed; a complete round keeps running"),
)


def decide(state: Rendezvous, node: str, settings: Settings) -> Action:
    """The action of the first rule in ``JOIN_RULES`` that applies."""
    for rule in JOIN_RULES:
        if rule.applies(state, node, settings):
            return rule.action
    raise AssertionError("the last rule always applies")


def step(settings: Settings, state: Rendezvous, event: Event) -> tuple[Rendezvous, list[Outcome]]:
    """Apply one event: first the passage of time up to ``event.now``, then the event itself."""
    machine = _Transition(settings, state)
    machine.advance(event.now)
    if isinstance(event, Join):
        machine.join(event.node, event.now)
    elif isinstance(event, Leave):
        machine.leave(event.node, event.now)
    elif isinstance(event, Close):
        machine.close()
    machine.settle(event.now)
    return machine.state, machine.outcomes


class _Transition:
    """One step's worth of changes to an immutable state, and the outcomes they produce."""

    def __init__(self, settings: Settings, state: Rendezvous) -> None:
        self.settings = settings
        self.state = state
        self.outcomes: list[Outcome] = []

    # ---- time -------------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Everything due before ``now``, in time order: the last call (torch: ``deadline < now``) and each pending
        join's timeout (torch: ``now > deadline``)."""
        while True:
            due: list[tuple[float, int, str]] = []
            state = self.state
            if (
                not state.complete
                and state.deadline is not None
                and state.deadline < now
                and self.settings.min_nodes <= len(state.participants) <= self.settings.max_nodes
            ):
                due.append((state.deadline, 0, ""))
            due.extend((deadline, 1, node) for node, deadline in state.join_deadlines if deadline < now)
            if not due:
                return
            when, kind, node = min(due)
            if kind == 0:
                self.complete()
            else:
                self.remove(node, when)
                self.outcomes.append(Failed(node, Failure.TIMEOUT))
            self.settle(when)

    # ---- events -----------------------------------------------------------------------------------------------

    def join(self, node: str, now: float) -> None:
        if node in self.state.participants:
            self.remove(node, now)  # torch's exit op: a participant asking again leaves its round first
        action = decide(self.state, node, self.settings)
        if action is Action.KEEP_WAITING and node in self.state.wait_list:
            self.set_join_deadline(node, now, fresh=True)  # a new call, a new join timeout (torch: per call)
        self.apply(action, node, now, fresh=True)

    def apply(self, action: Action, node: str, now: float, fresh: bool = False) -> None:
        """``fresh``: the action starts a new join (its timeout counts from now); otherwise a pending join goes on."""
        state = self.state
        if action is Action.ERROR_CLOSED:
            self.outcomes.append(Failed(node, Failure.CLOSED))
        elif action is Action.ADD_TO_PARTICIPANTS:
            self.state = dataclasses.replace(
                self.state,
                participants=state.participants + (node,),
                wait_list=state.wait_list - {node},
                redundancy_list=state.redundancy_list - {node},
            )
            self.set_join_deadline(node, now, fresh)
            count = len(self.state.participants)
            if count == self.settings.min_nodes:
                self.state = dataclasses.replace(self.state, deadline=now + self.settings.last_call)
            if count == self.settings.max_nodes:
                self.complete()
        elif action is Action.ADD_TO_WAIT_LIST:
            self.state = dataclasses.replace(
                self.state, wait_list=state.wait_list | {node}, redundancy_list=state.redundancy_list - {node}
            )
            self.set_join_deadline(node, now, fresh)
            self.outcomes.append(Waiting(node, self.state.round))
        elif action is Action.ADD_TO_REDUNDANCY_LIST:
            self.state = dataclasses.replace(self.state, redundancy_list=state.redundancy_list | {node})
            self.clear_join_deadline(node)  # a spare waits without a deadline; it gets a fresh one when it moves
            self.outcomes.append(Waiting(node, self.state.round, spare=True))

    def leave(self, node: str, now: float) -> None:
        self.remove(node, now)

    def close(self) -> None:
        state = self.state
        joining = frozenset() if state.complete else frozenset(state.participants)
        pending = sorted(state.wait_list | state.redundancy_list | joining)
        self.outcomes.extend(Failed(node, Failure.CLOSED) for node in pending)
        self.state = dataclasses.replace(
            self.state,
            closed=True,
            wait_list=frozenset(),
            redundancy_list=frozenset(),
            join_deadlines=(),
            deadline=None,
            participants=state.participants if state.complete else (),
        )

    # ---- the round --------------------------------------------------------------------------------------------

    def complete(self) -> None:
        state = self.state
        ordered = sorted(state.participants)
        ranks = tuple((node, rank) for rank, node in enumerate(ordered))
        admitted = set(ordered)
        self.state = dataclasses.replace(
            self.state,
            complete=True,
            deadline=None,
            participants=tuple(ordered),
            ranks=ranks,
            join_deadlines=tuple(item for item in state.join_deadlines if item[0] not in admitted),
        )
        self.outcomes.extend(Admitted(node, state.round, rank, len(ordered)) for node, rank in ranks)

    def remove(self, node: str, now: float) -> None:
        state = self.state
        self.clear_join_deadline(node)
        if node in state.participants:
            participants = tuple(member for member in state.participants if member != node)
            # A complete round keeps the roster it completed with (``ranks``): a member that reads it late (a slow
            # survivor, after a newcomer of the round died and the others already left it) must find the world the
            # others found, or the two sides of one iteration count different world sizes at its barriers.
            self.state = dataclasses.replace(
                self.state,
                participants=participants,
                ranks=state.ranks if state.complete else tuple(item for item in state.ranks if item[0] != node),
            )
            if state.complete:
                if not participants:
                    self.state = dataclasses.replace(self.state, complete=False, round=state.round + 1, ranks=())
            elif len(participants) < self.settings.min_nodes:
                self.state = dataclasses.replace(self.state, deadline=None)
        self.state = dataclasses.replace(
            self.state, wait_list=self.state.wait_list - {node}, redundancy_list=self.state.redundancy_list - {node}
        )

    def settle(self, now: float) -> None:
        """Every pending node's next look at the state: waiting nodes join an open round (node-id order), spares
        leave the redundancy list whenever the round has room."""
        while not self.state.closed:
            state = self.state
            if not state.complete and state.wait_list:
                node = min(state.wait_list)
                self.apply(Action.ADD_TO_PARTICIPANTS, node, now)
                continue
            if state.redundancy_list and len(state.participants) < self.settings.max_nodes:
                node = min(state.redundancy_list)
                self.state = dataclasses.replace(self.state, redundancy_list=state.redundancy_list - {node})
                self.apply(decide(self.state, node, self.settings), node, now, fresh=True)
                continue
            return

    def set_join_deadline(self, node: str, now: float, fresh: bool = False) -> None:
        deadlines = dict(self.state.join_deadlines)
        if fresh or node not in deadlines:
            deadlines[node] = now + self.settings.join_timeout
        self.state = dataclasses.replace(self.state, join_deadlines=tuple(sorted(deadlines.items())))

    def clear_join_deadline(self, node: str) -> None:
        self.state = dataclasses.replace(
            self.state, join_deadlines=tuple(item for item in self.state.join_deadlines if item[0] != node)
        )
