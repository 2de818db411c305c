"""The rasd mesh as the Wrapper's fastest fault source: its verdicts restart training in place, in seconds.

Every process of the job runs one RAS node (``rasd``), living across the restart iterations of a call. A wrapped
call joins it (starting it from the Wrapper's own store when none runs, unless ``TORCHRAS_ENABLE=0``), publishes
which mesh peer it is, and listens to the node's verdicts on a thread of its own. Each verdict becomes an
``inprocess.fault_source.ExternalVerdict`` applied through the store, which wakes every rank's monitor thread at
once (the store's ``wait`` is a push, not a poll). What each verdict means is the
table ``VERDICT_RULES`` below (docs/inprocess.md section 3 prints it):

    verdict      terminated ranks                        who restarts
    PEER_DEAD    the dead process's ranks                every survivor, now
    PEER_HUNG    the hung process's ranks                every other rank, now (if it resumes, it finds
                                                         itself terminated and leaves)
    COMM_STUCK   none                                    every rank; the log names the ranks behind and the op
    PEER_LEFT    none                                    nobody (a clean exit)

Who is who. A verdict names a mesh peer by (address, incarnation); a restarted process is a new peer. At the start
of a call each rank writes ``torchras_peer/<host>:<port>/<incarnation> = <initial rank>`` into the base store, so
a verdict about a peer is translated to the initial rank it ran, and a peer nobody published (another job's
process, a predecessor incarnation) is not ours and is ignored. Communicator verdicts name the ranks of the
iteration's default group; the iteration's ``initial_rank_<r>`` keys translate them.

Stale verdicts never hurt. A peer verdict is applied to the newest iteration in which the peer's initial rank took
part; if the rank was already terminated there, it is a repetition (HUNG verdicts are refreshed) and is ignored.
A communicator verdict is acted on only by members of that communicator, which hold it in the current iteration
(communicator hashes carry the iteration, see ``rasd.torch.hooks``): an old iteration's communicator is
destroyed by the restart, so its late verdicts find no member.

Nothing outlives a call. A node the Wrapper started itself (and ``rasd``'s torch hooks, if the Wrapper installed
them) belongs to the Wrapper's calls: when the last wrapped call of the process ends, the node leaves the mesh
(its peers record LEFT, which restarts nobody) and its thread ``torchras-rasd`` ends; the next call starts a new
one. A node the user asked for (``rasd.install()``, even if a call started the node before the user's first
``init_process_group`` did; ``rasd.start()``; ``python -m rasd.run``) is the user's: a call joins it and leaves it
running.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Protocol

from . import fault_source, logs

log = logs.get_logger(__name__)

PEER_KEY = "torchras_peer/{host}:{port}/{incarnation}"
MESH_PREFIX = "torchras_mesh"


class _Ownership:
    """What the Wrapper's calls started in this process, and how many calls use it (one lock for all)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0  # wrapped calls of this process joined to the mesh (MeshFaultSource.start .. close)
        self.node: Any = None  # the RasHandle of a node a call started, None if the running node is the user's
        self.hooks = False  # whether a call installed rasd's torch hooks


_OWNED = _Ownership()


@dataclasses.dataclass(frozen=True)
class VerdictRule:
    """What one kind of mesh verdict does to the job."""

    kind: fault_source.VerdictKind | None  # the external verdict it becomes; None: never a restart
    terminated: str
    restarts: str


#: The verdict table (docs/inprocess.md section 3). Keys are ``rasd.Kind`` values.
VERDICT_RULES: dict[str, VerdictRule] = {
    "PEER_DEAD": VerdictRule(fault_source.VerdictKind.PEER_DEAD, "the dead process's ranks", "every survivor, now"),
    "PEER_HUNG": VerdictRule(
        fault_source.VerdictKind.PEER_HUNG,
        "the hung process's ranks",
        "every other rank, now; the hung process leaves if it resumes",
    ),
    "COMM_STUCK": VerdictRule(
        fault_source.VerdictKind.COMM_STUCK, "none", "every rank; the log names the ranks behind and the op"
    ),
    "PEER_LEFT": VerdictRule(None, "none", "nobody"),
}


class VerdictSink(Protocol):
    """What the source needs of the running call (``CallWrapper``)."""

    @property
    def iteration(self) -> int: ...

    def report_fault(self, verdict: fault_source.ExternalVerdict) -> bool: ...


def mesh_enabled() -> bool:
    import rasd

    return rasd.enabled()  # rasd's own reading of TORCHRAS_ENABLE (0/false/no/off), so the two never disagree


class MeshFaultSource:
    """Joins this process's RAS node for one wrapped call and turns its verdicts into restarts.

    ``store`` is a connection of the call's own (base store, not an iteration namespace), used only from the
    source's thread. Nothing here raises into training: any failure to start leaves the call without mesh
    verdicts (one log line) and the Wrapper's own fault sources keep working.
    """

    def __init__(self, sink: VerdictSink, store: Any, initial_rank: int) -> None:
        self.sink = sink
        self.store = store
        self.initial_rank = initial_rank
        self.runtime: Any = None
        self._subscription: Any = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._handled_comms: set[int] = set()
        self._counted = False  # counted in _OWNED.calls (start), until close

    # ---- life cycle -------------------------------------------------------------------------------------------

    def start(self, bootstrap_store: Any) -> bool:
        """Join (or start) the node, publish who this rank is, listen. False when the mesh is off or unusable."""
        if not mesh_enabled():
            log.info("rasd is off (TORCHRAS_ENABLE=0): restarts come from the Wrapper's own fault sources only")
            return False
        with _OWNED.lock:
            _OWNED.calls += 1
        self._counted = True
        try:
            import rasd
            from rasd.torch import install, installed
            from rasd.torch.hooks import start_node

            with _OWNED.lock:
                if installed() is None:
                    _OWNED.hooks = True
                hooks = install(start_mesh=True)
                runtime = rasd.node()
                if runtime is None or not runtime.running:
                    runtime = start_node(hooks, bootstrap_store, rank=self.initial_rank, prefix=MESH_PREFIX)
                    # The user's rasd.install() asked for a node in this process (its first init_process_group
                    # would have started one): the node is theirs, even if this call started it first.
                    if _OWNED.hooks or not hooks.start_mesh:
                        _OWNED.node = runtime
            if runtime is None or not runtime.running:
                log.warning("rasd did not start: restarts come from the Wrapper's own fault sources only")
                self._uncount()
                return False
            me = runtime.peer
            self.store.set(
                PEER_KEY.format(host=me.addr.host, port=me.addr.port, incarnation=me.incarnation),
                str(self.initial_rank),
            )
            self.runtime = runtime
            self._subscription = runtime.subscribe({rasd.Kind.PEER_DEAD, rasd.Kind.PEER_HUNG, rasd.Kind.COMM_STUCK})
        except Exception:  # never raise into training
            log.warning(
                "cannot join the rasd mesh: restarts come from the Wrapper's own fault sources only", exc_info=True
            )
            self._uncount()
            return False
        self._thread = threading.Thread(target=self._listen, name="inprocess-mesh-verdicts", daemon=True)
        self._thread.start()
        return True

    def begin_iteration(self, iteration: int) -> None:
        """Communicators created from now on belong to ``iteration`` (their hashes carry it)."""
        try:
            from rasd.torch import installed

            hooks = installed()
            if hooks is not None:
                hooks.begin_epoch(iteration)
        except Exception:
            log.debug("cannot tag communicators with the iteration", exc_info=True)

    def close(self) -> None:
        """Stop listening; the last call of the process also stops what the Wrapper's calls started. Never raises."""
        self._closed.set()
        if self._subscription is not None:
            self._subscription.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None
        self._subscription = None
        self.store = None
        self.runtime = None
        self._uncount()

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            _release()

    # ---- verdicts ---------------------------------------------------------------------------------------------

    def _listen(self) -> None:
        subscription = self._subscription
        while not self._closed.is_set():
            try:
                event = subscription.get(timeout=0.2)
            except queue.Empty:
                continue
            if event is None:
                continue
            try:
                self.handle(event)
            except Exception:  # a broken store must not end the listener silently
                log.warning("could not act on the mesh verdict %s", event.kind, exc_info=True)

    def handle(self, event: Any) -> bool:
        """Act on one mesh event; True when it was applied as a fault of the current job."""
        rule = VERDICT_RULES.get(str(event.kind))
        if rule is None or rule.kind is None or self._closed.is_set():
            return False
        if rule.kind is fault_source.VerdictKind.COMM_STUCK:
            return self._comm_stuck(event)
        return self._peer_verdict(event, rule.kind)

    def _peer_verdict(self, event: Any, kind: fault_source.VerdictKind) -> bool:
        peer = event.peer
        if peer is None:
            return False
        key = PEER_KEY.format(host=peer.addr.host, port=peer.addr.port, incarnation=peer.incarnation)
        if not self.store.check([key]):
            log.debug(
                "%s of %s: not a rank of this job (or an earlier incarnation); ignored", kind.value, peer.describe()
            )
            return False
        initial_rank = int(self.store.get(key))
        if initial_rank == self.initial_rank:
            return False  # about this very process (a pause it survived): the others act on it
        if kind is fault_source.VerdictKind.PEER_DEAD:
            # torch's keep-alive expiry: a dead process leaves the rendezvous, so a process that died while it
            # waited to join is not admitted to the next round (docs/elastic.md section 5)
            leave = getattr(self.sink, "leave_rendezvous", None)
            if leave is not None:
                leave(initial_rank, self.store)
        reason = f"{kind.value} of rank {initial_rank} ({peer.describe()})"
        if event.details:
            reason += f": {event.details}"
        return self.sink.report_fault(
            fault_source.ExternalVerdict(
                iteration=fault_source.LATEST_ITERATION, ranks=frozenset({initial_rank}), reason=reason, kind=kind
            )
        )

    def _comm_stuck(self, event: Any) -> bool:
        comm_hash = event.comm_hash
        if comm_hash is None or comm_hash in self._handled_comms or not _holds_communicator(comm_hash):
            return False  # not a member, or this communicator's restart is done: the members act, once
        self._handled_comms.add(comm_hash)
        iteration = self.sink.iteration
        reason = f"COMM_STUCK on communicator {comm_hash:016x}: {event.details}"
        return self.sink.report_fault(
            fault_source.ExternalVerdict(
                iteration=iteration,
                ranks=frozenset(),
                reason=reason,
                kind=fault_source.VerdictKind.COMM_STUCK,
                iteration_ranks=frozenset(event.ranks),
            )
        )


def _release() -> None:
    """One wrapped call ends. The last one stops the node a call started (it leaves the mesh: LEFT, not DEAD) and
    takes out the torch hooks a call installed; a node or hooks of the user's stay. Never raises into training."""
    with _OWNED.lock:
        _OWNED.calls -= 1
        if _OWNED.calls > 0:
            return
        node, _OWNED.node = _OWNED.node, None
        hooks, _OWNED.hooks = _OWNED.hooks, False
        try:
            if node is not None:
                node.stop()
            if hooks:
                from rasd.torch import uninstall

                uninstall()
        except Exception:  # never raise into training
            log.warning("could not stop the RAS node the Wrapper started", exc_info=True)


def _holds_communicator(comm_hash: int) -> bool:
    from rasd.torch import installed

    hooks = installed()
    return hooks is not None and any(comm.comm_hash == comm_hash for comm in hooks.registry.comms())
