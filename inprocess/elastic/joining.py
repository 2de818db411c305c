"""Processes that join a running job: the rendezvous rules of ``rendezvous.py`` driven through the Wrapper's store.

What belongs here: the I/O around the pure rules (docs/elastic.md section 5). The rules themselves, who is admitted
to which round with which rank, live in ``rendezvous.py`` and nowhere else; this module only

* keeps the job's one ``Rendezvous`` value in the Wrapper's store (key ``elastic/rendezvous`` of the call's
  namespace, JSON), changed by read, ``step`` and ``compare_set`` (retried when another process got there first);
* feeds it the events of the Wrapper: a newcomer's ``Join``; at a restart, ``Leave`` for the terminated ranks and
  ``Join`` for every survivor (a participant asking for the next round); ``Tick`` while anybody waits (the last
  call, join timeouts); ``Close`` when the call completes; ``Leave`` when a process leaves the wrapper;
* reads what came out: a node is admitted when the round is complete and the node has a rank in it; a failure
  (timeout, closed) is written under ``elastic/failed/<node>`` by whoever applied the event that caused it.

Theory of operation
-------------------
Node ids are initial ranks written with eight digits, so the rules' node-id order is the initial-rank order, the
order ``ShiftRanks`` keeps: survivors keep their relative order, newcomers (who get initial ranks from the
initial world size up) come after them. The launcher's world is round 0, complete, written once by the initial
ranks (the launcher decided it; the initial barrier checks it). A round is one iteration of the Wrapper: the
survivors of a restart join the next round, and the round's ranks are the next iteration's ranks.

A newcomer finds the running call through a pointer key outside every call's namespace, takes the next initial
rank, joins (it lands in the wait list: the running round is complete, *exclusivity*), and polls with ``Tick``
until it is admitted or fails. The job notices it at a commit: every ``check_every``-th ``state.commit()``, rank 0
reads the waiting count (torch's ``num_nodes_waiting()``) and every rank learns the answer from one small
``all_reduce`` (Horovod's host-update check, a broadcast there). When processes wait, rank 0 records an
interruption that terminates nobody and every rank raises ``RankShouldRestart`` right there, at the same commit:
nobody is left inside a collective for the abort to cut (an asynchronous restart of ranks that are all alive can
leave one blocked in gloo). Every rank reaches the iteration boundary, the round admits the waiting processes,
and ``state.sync()`` in the next iteration gives them the state.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from .. import exception, logs
from ..store import CALL_NAMESPACE, NamespaceStore, launch_attempt
from . import discovery as discovery_module, rendezvous

log = logs.get_logger(__name__)

RENDEZVOUS_KEY = "elastic/rendezvous"
SETTINGS_KEY = "elastic/settings"
JOINED_KEY = "elastic/joined"
FAILED_KEY = "elastic/failed/{node}"
ROUND_ITERATION_KEY = "elastic/round/{round}/iteration"
HOST_KEY = "elastic/host/{node}"
REMOVED_KEY = "elastic/removed"  # "node,node," nodes the discovery hook removed: they leave at the next round
#: A launcher that respawns dead workers turns joining on with it (``Joining.from_environment``).
JOINING_ENVIRONMENT = "INPROCESS_JOINING"
#: Outside every call's namespace: where a newcomer finds the running call of the job.
CALL_POINTER_KEY = "_inprocess_elastic/{job}/call"
_CAS_ATTEMPTS = 1000


class JoinFailed(exception.RestartError):
    """torch elastic's ``RendezvousTimeoutError`` / ``RendezvousClosedError``: this process was not admitted.

    Not retryable: the join timeout passed, or the job is closed (it completed), so nobody will admit it.
    """

    def __init__(self, node: str, reason: str) -> None:
        self.node = node
        self.reason = reason
        what = (
            "the join timeout passed before a round admitted it"
            if reason == rendezvous.Failure.TIMEOUT.value
            else "the job is closed (its wrapped call completed): nobody joins it any more"
        )
        super().__init__(f"process {node} could not join the running job: {what}")


class HostRemoved(exception.RestartError):
    """The discovery hook no longer lists this process's host (or its slot): it left the job at a round, cleanly
    (the mesh records it as LEFT, not DEAD). Catch it and exit 0."""

    def __init__(self, node: str, host: str) -> None:
        self.node = node
        self.host = host
        super().__init__(f"process {node} on host {host} left the job: the discovery hook removed its host or slot")


@dataclasses.dataclass(frozen=True)
class Joining:
    """Let processes join a running job (``inprocess.Wrapper(joining=Joining(...))``); docs/elastic.md section 5.

    ``min_nodes``/``max_nodes``: torch elastic's bounds on a round (``max_nodes`` None: the initial world size).
    ``last_call``: how long a round with at least ``min_nodes`` but fewer than ``max_nodes`` waits for more
    (torch's default is 30 s for a whole-node re-launch; here the survivors wait at the boundary, already running).
    ``join_timeout``: a newcomer not admitted within it fails (``JoinFailed``, not retryable).
    ``check_every``: rank 0 looks for waiting processes at every ``check_every``-th ``state.commit()`` and tells the
    others with one 8-byte ``all_reduce`` (so every rank must commit at the same steps, as in Horovod).
    ``discovery``: Horovod's host discovery, a callable returning ``{host: slots}`` or an executable script printing
    ``host:slots`` lines (``inprocess.elastic.discovery``); asked on rank 0 at those commits, at most once every
    ``discovery_interval`` seconds. A process whose host (or slot) is gone leaves at the next round (``HostRemoved``).
    ``newcomer``: this process joins a running job (default: the ``INPROCESS_JOIN`` environment variable is 1).
    """

    min_nodes: int = 1
    max_nodes: int | None = None
    last_call: float = 1.0
    join_timeout: float = 600.0
    check_every: int = 1
    newcomer: bool | None = None
    poll_interval: float = 0.05
    discovery: discovery_module.Discovery | None = None
    discovery_interval: float = 1.0

    def __post_init__(self) -> None:
        if self.check_every < 1:
            raise ValueError(f"check_every ({self.check_every}) must be at least 1")
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval ({self.poll_interval}) must be positive")
        rendezvous.Settings(self.min_nodes, self.max_nodes or self.min_nodes, self.last_call, self.join_timeout)

    def is_newcomer(self) -> bool:
        if self.newcomer is not None:
            return self.newcomer
        import os

        return os.environ.get("INPROCESS_JOIN", "").strip() == "1"

    @classmethod
    def from_environment(cls) -> Joining | None:
        """The joining a launcher asks for, for a Wrapper built without ``joining=`` (``INPROCESS_JOINING``).

        ``rasd launch`` respawns a dead worker as a newcomer, which only a Wrapper with joining can admit; a script
        written for torchrun does not say ``joining=``, and should not have to (a user swaps the launcher's name
        and nothing else). The launcher sets ``INPROCESS_JOINING``: ``1`` for the defaults, or ``name=value`` pairs
        separated by commas for the numeric settings (``last_call=0.1,check_every=2``). Unset, empty or ``0``:
        None (the world only shrinks, as before). A value that cannot be read is logged and ignored: it must not
        stop training.
        """
        import os

        text = os.environ.get(JOINING_ENVIRONMENT, "").strip()
        if text in ("", "0"):
            return None
        if text == "1":
            return cls()
        numeric: dict[str, type[int] | type[float]] = dict.fromkeys(("min_nodes", "max_nodes", "check_every"), int)
        numeric.update(dict.fromkeys(("last_call", "join_timeout", "poll_interval", "discovery_interval"), float))
        try:
            settings: dict[str, Any] = {}
            for item in filter(None, (part.strip() for part in text.split(","))):
                name, _, value = item.partition("=")
                if name not in numeric:
                    raise ValueError(f"unknown setting {name!r} (known: {', '.join(sorted(numeric))})")
                settings[name] = numeric[name](value)
            return cls(**settings)
        except (TypeError, ValueError) as error:
            log.warning("%s=%r is not understood (%s): joining stays off", JOINING_ENVIRONMENT, text, error)
            return None


@dataclasses.dataclass(frozen=True)
class Admission:
    """What a round gave this process: the iteration it runs, its rank and the world size."""

    round: int
    iteration: int
    rank: int
    world_size: int


def node_id(initial_rank: int) -> str:
    """Initial ranks as node ids: their string order is their numeric order (the rules rank by node id)."""
    return f"{initial_rank:08d}"


def initial_rank_of(node: str) -> int:
    return int(node)


# ---- the value in the store -------------------------------------------------------------------------------------


def encode(state: rendezvous.Rendezvous) -> str:
    return json.dumps(
        dict(
            round=state.round,
            complete=state.complete,
            deadline=state.deadline,
            closed=state.closed,
            participants=list(state.participants),
            ranks=[list(item) for item in state.ranks],
            wait_list=sorted(state.wait_list),
            redundancy_list=sorted(state.redundancy_list),
            join_deadlines=[list(item) for item in state.join_deadlines],
        ),
        sort_keys=True,
    )


def decode(text: str) -> rendezvous.Rendezvous:
    raw = json.loads(text)
    return rendezvous.Rendezvous(
        round=int(raw["round"]),
        complete=bool(raw["complete"]),
        deadline=raw["deadline"],
        closed=bool(raw["closed"]),
        participants=tuple(raw["participants"]),
        ranks=tuple((node, int(rank)) for node, rank in raw["ranks"]),
        wait_list=frozenset(raw["wait_list"]),
        redundancy_list=frozenset(raw["redundancy_list"]),
        join_deadlines=tuple((node, float(deadline)) for node, deadline in raw["join_deadlines"]),
    )


class StoreRendezvous:
    """The job's rendezvous in a store: ``apply`` one event (compare-and-set), ``read`` the current value.

    ``store``: the call's namespace on the Wrapper's store; used from one thread only (the main thread).
    """

    def __init__(self, store: Any, settings: rendezvous.Settings) -> None:
        self.store = store
        self.settings = settings

    def _raw(self) -> str:
        return self.store.get(RENDEZVOUS_KEY).decode() if self.store.check([RENDEZVOUS_KEY]) else ""

    def read(self) -> rendezvous.Rendezvous | None:
        raw = self._raw()
        return decode(raw) if raw else None

    def seed(self, initial_world_size: int) -> None:
        """Round 0: the launcher's world, complete. Written by whichever initial rank comes first."""
        nodes = tuple(node_id(rank) for rank in range(initial_world_size))
        state = rendezvous.Rendezvous(
            round=0, complete=True, participants=nodes, ranks=tuple((node, rank) for rank, node in enumerate(nodes))
        )
        self.store.compare_set(RENDEZVOUS_KEY, "", encode(state))

    def apply(self, event: rendezvous.Event) -> rendezvous.Rendezvous:
        for _ in range(_CAS_ATTEMPTS):
            raw = self._raw()
            if not raw:
                raise exception.InternalError("the job's rendezvous is not in the store (no initial rank wrote it)")
            state, outcomes = rendezvous.step(self.settings, decode(raw), event)
            text = encode(state)
            if text == raw:
                self._deliver(outcomes)
                return state
            if _text(self.store.compare_set(RENDEZVOUS_KEY, raw, text)) == text:
                self._deliver(outcomes)
                return state
        raise exception.InternalError(f"could not apply {event} to the rendezvous: the store kept changing")

    def _deliver(self, outcomes: list[rendezvous.Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, rendezvous.Failed):
                self.store.set(FAILED_KEY.format(node=outcome.node), outcome.reason.value)
            log.debug("rendezvous: %s", outcome)

    def failure(self, node: str) -> str | None:
        key = FAILED_KEY.format(node=node)
        return self.store.get(key).decode() if self.store.check([key]) else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def admitted_in(state: rendezvous.Rendezvous | None, node: str, after_round: int) -> tuple[int, int, int] | None:
    """(round, rank, world size) when ``node`` has a rank in a complete round newer than ``after_round``."""
    if state is None or not state.complete or state.round <= after_round:
        return None
    rank = state.rank_of(node)
    return None if rank is None else (state.round, rank, len(state.ranks))


# ---- one process's side -----------------------------------------------------------------------------------------


class JoinDriver:
    """What one process of the job does with the rendezvous, from the Wrapper's main thread.

    ``check_waiting`` raises into training only what its collective raises (a fault); the boundary and a newcomer's
    wait raise ``JoinFailed`` when the rules fail this process (that ends its wrapped call, as torch's rendezvous
    errors end an agent).
    """

    def __init__(
        self, joining: Joining, store: Any, initial_rank: int, initial_world_size: int, settings: rendezvous.Settings
    ) -> None:
        self.joining = joining
        self.store = store
        self.initial_rank = initial_rank
        self.initial_world_size = initial_world_size
        self.node = node_id(initial_rank)
        self.rendezvous = StoreRendezvous(store, settings)
        self.round = 0  # the round this process was last admitted to
        self.members: tuple[str, ...] = tuple(node_id(rank) for rank in range(initial_world_size))  # by rank
        self.commits = 0
        self.left = False
        self.joined_at: float | None = None  # wall clock of a newcomer's join (bench/elastic.py measures from it)
        self.host = discovery_module.this_host()
        self.discovered_at = float("-inf")
        store.set(HOST_KEY.format(node=self.node), self.host)

    # ---- start ------------------------------------------------------------------------------------------------

    @classmethod
    def for_initial_rank(
        cls, joining: Joining, raw_store: Any, store: NamespaceStore, initial_rank: int, initial_world_size: int
    ) -> JoinDriver:
        """An initial rank: publish the call for newcomers, the settings, and round 0."""
        maximum = joining.max_nodes if joining.max_nodes is not None else initial_world_size
        if initial_world_size > maximum:
            raise ValueError(f"the initial world size ({initial_world_size}) exceeds max_nodes ({maximum})")
        settings = rendezvous.Settings(joining.min_nodes, maximum, joining.last_call, joining.join_timeout)
        raw_store.set(CALL_POINTER_KEY.format(job=launch_attempt()), store.prefix)
        store.set(
            SETTINGS_KEY,
            json.dumps(dict(min_nodes=settings.min_nodes, max_nodes=settings.max_nodes, last_call=settings.last_call)),
        )
        store.set("elastic/initial_world_size", str(initial_world_size))
        driver = cls(joining, store, initial_rank, initial_world_size, settings)
        driver.rendezvous.seed(initial_world_size)
        return driver

    @classmethod
    def for_newcomer(cls, joining: Joining, store: NamespaceStore) -> JoinDriver:
        """A newcomer: the job's settings (its own join timeout), the next initial rank."""
        shared = json.loads(store.get(SETTINGS_KEY).decode())
        settings = rendezvous.Settings(
            int(shared["min_nodes"]), int(shared["max_nodes"]), float(shared["last_call"]), joining.join_timeout
        )
        initial_world_size = int(store.get("elastic/initial_world_size"))
        initial_rank = initial_world_size - 1 + int(store.add(JOINED_KEY, 1))
        return cls(joining, store, initial_rank, initial_world_size, settings)

    # ---- waiting for a round ----------------------------------------------------------------------------------

    def join(self) -> None:
        """A newcomer's ``next_rendezvous()``: into the wait list while the running round is complete."""
        self.joined_at = time.time()
        self.rendezvous.apply(rendezvous.Join(self.node, self.joined_at))

    def wait_for_admission(self) -> Admission:
        """Poll (``Tick``) until a round newer than the last one admits this process; ``JoinFailed`` otherwise.

        The rules fail a join ``join_timeout`` after it began (``Tick``). This process keeps a deadline of its own
        on top, a little later, so that no wait here outlives it whatever the store holds (a rendezvous value that
        no longer lists this process, a job whose members all died with nobody left to record it): one line says
        what was waited for and for how long, and the process fails with ``JoinFailed`` (timeout)."""
        started = time.monotonic()
        limit = self.joining.join_timeout + 2 * self.rendezvous.settings.last_call + 5.0
        while True:
            state = self.rendezvous.read()
            found = admitted_in(state, self.node, self.round)
            if found is not None:
                round_number, rank, world_size = found
                self.round = round_number
                assert state is not None
                self.members = tuple(node for node, _ in sorted(state.ranks, key=lambda item: item[1]))
                iteration = int(self.store.get(ROUND_ITERATION_KEY.format(round=round_number)))
                return Admission(round_number, iteration, rank, world_size)
            reason = self.rendezvous.failure(self.node)
            if reason is not None:
                if reason == rendezvous.Failure.TIMEOUT.value:
                    log.warning(
                        "process %s waited its join timeout (%.0f s) and no round of the job admitted it: it gives up "
                        "(JoinFailed: timeout)",
                        self.node,
                        self.joining.join_timeout,
                    )
                raise JoinFailed(self.node, reason)
            waited = time.monotonic() - started
            if waited >= limit:
                log.warning(
                    "process %s waited %.0f s to be admitted to the running job (round %s) and no round admitted it "
                    "(is any member of the job left?): it gives up (JoinFailed: timeout)",
                    self.node,
                    waited,
                    state.round if state is not None else "unknown",
                )
                raise JoinFailed(self.node, rendezvous.Failure.TIMEOUT.value)
            time.sleep(self.joining.poll_interval)
            self.rendezvous.apply(rendezvous.Tick(time.time()))

    def next_round(self, terminated_ranks: set[int], next_iteration: int) -> Admission:
        """A survivor at the iteration boundary: the terminated ranks (this iteration's numbering, which is the
        round's) leave, this process asks for the next round (it leaves its round first; the last one to do so
        opens the next round, which the waiting processes join), and waits until the round completes (at once at
        ``max_nodes``, after the last call otherwise)."""
        now = time.time()
        for rank in sorted(terminated_ranks):
            if 0 <= rank < len(self.members):
                self.rendezvous.apply(rendezvous.Leave(self.members[rank], now))
        removed = self.removed_nodes()
        for node in sorted(removed & set(self.members)):
            self.rendezvous.apply(rendezvous.Leave(node, now))  # each leaves by itself too; either is enough
        if self.node in removed:
            self.left = True
            raise HostRemoved(self.node, self.host)
        # The round every survivor is about to form is the one after this process's (rounds advance one at a time:
        # only when every participant of the complete round has asked again).
        self.store.set(ROUND_ITERATION_KEY.format(round=self.round + 1), str(next_iteration))
        self.rendezvous.apply(rendezvous.Join(self.node, now))
        return self.wait_for_admission()

    # ---- the host-update check --------------------------------------------------------------------------------

    def check_waiting(self, rank: int | None, iteration: int, serial: int | None = None) -> str | None:
        """Horovod's host-update check at a commit: every ``check_every``-th commit (``serial``: the state's commit
        count, equal on every rank after ``sync``), rank 0 looks for waiting processes and asks the discovery hook,
        and every rank of the default process group learns its finding from one 8-byte ``all_reduce``. Returns the
        reason for a round when one is due (rank 0 has recorded it in ``iteration``): the caller raises
        ``RankShouldRestart`` at once, on every rank at the same commit, so no rank is left inside a collective."""
        self.commits += 1
        count = self.commits if serial is None else serial
        if count % self.joining.check_every:
            return None
        finding: str | None = None
        if rank == 0:
            try:
                finding = self._hosts_updated() or self._waiting()
            except Exception:  # a store hiccup must not stop training: no round this time
                log.warning("could not check for processes waiting to join", exc_info=True)
        kind = _agree(_KINDS.index(finding.split(":", 1)[0]) + 1 if finding else 0)
        if not kind:
            return None
        reason = finding or f"{_KINDS[kind - 1]}: found by rank 0 at this commit"
        if rank == 0:
            iteration_store = self.store.iteration_store(iteration)
            iteration_store.record_interrupted(reason=reason)
            log.info("%s: ending iteration %s at this commit", reason, iteration)
        return reason

    def _waiting(self) -> str | None:
        state = self.rendezvous.read()
        if state is None or not state.waiting:
            return None
        return f"JOIN_WAITING: {state.waiting} process(es) wait to join the job (round {state.round + 1})"

    def _hosts_updated(self) -> str | None:
        """Ask the discovery hook (rate-limited); record the members it removes. A hook that fails is logged and
        changes nothing (Horovod keeps the hosts it had)."""
        hook = self.joining.discovery
        now = time.monotonic()
        if hook is None or now - self.discovered_at < self.joining.discovery_interval:
            return None
        self.discovered_at = now
        try:
            hosts = discovery_module.discover(hook)
        except Exception:  # a broken hook must not stop training
            log.warning("the discovery hook failed; the hosts stay as they are", exc_info=True)
            return None
        keys = [HOST_KEY.format(node=node) for node in self.members]
        known = [node for node, key in zip(self.members, keys, strict=True) if self.store.check([key])]
        members = {node: self.store.get(HOST_KEY.format(node=node)).decode() for node in known}
        leaving = [node for node in discovery_module.removed(members, hosts) if node not in self.removed_nodes()]
        if not leaving:
            return None
        self.store.append(REMOVED_KEY, "".join(f"{node}," for node in leaving))
        gone = sorted({members[node] for node in leaving})
        return (
            f"HOSTS_UPDATED: the discovery hook removed host(s) {', '.join(gone)}; "
            f"initial ranks {', '.join(str(initial_rank_of(node)) for node in leaving)} leave the job"
        )

    def removed_nodes(self) -> set[str]:
        return set(self.store.get_packed(REMOVED_KEY, ","))

    # ---- leaving ----------------------------------------------------------------------------------------------

    def leave(self) -> None:
        """This process leaves the job (its call ends): nobody waits for it in a round."""
        if self.left:
            return
        self.left = True
        try:
            self.rendezvous.apply(rendezvous.Leave(self.node, time.time()))
        except Exception:  # the store may be gone
            log.debug("could not leave the rendezvous", exc_info=True)

    def close(self) -> None:
        """The call completed: close the rendezvous, pending joins fail (torch's ``set_closed()``)."""
        try:
            self.rendezvous.apply(rendezvous.Close(time.time()))
        except Exception:
            log.warning("could not close the rendezvous", exc_info=True)


#: What a host-update check can find, in the order of its code on the wire (the maximum wins).
_KINDS = ("JOIN_WAITING", "HOSTS_UPDATED")


def _agree(code: int) -> int:
    """The maximum of ``code`` over the default process group (rank 0's finding); ``code`` alone without one."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return code
    value = torch.tensor([code], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def find_running_call(factory: Any, kwargs: dict, timeout: float) -> tuple[NamespaceStore, Any]:
    """A newcomer's connection: the Wrapper's store and the namespace of the job's running call."""
    deadline = time.monotonic() + timeout
    key = CALL_POINTER_KEY.format(job=launch_attempt())
    while True:
        try:
            raw = factory(**kwargs)
            if raw.check([key]):
                namespace = raw.get(key).decode()
                if namespace.startswith(CALL_NAMESPACE.split("{", 1)[0]):
                    return NamespaceStore(namespace, raw), raw
        except RuntimeError as error:
            if time.monotonic() >= deadline:
                raise exception.TimeoutError(f"could not reach the job's store within {timeout} s: {error}") from error
        if time.monotonic() >= deadline:
            raise exception.TimeoutError(f"no running job with joining enabled found in the store within {timeout} s")
        time.sleep(0.2)
