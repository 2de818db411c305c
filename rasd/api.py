"""The public face of rasd: one RAS node per process.

::

    import rasd
    node = rasd.start(store)               # join the job's mesh through a torch.distributed Store
    with rasd.subscribe({rasd.Kind.PEER_DEAD, rasd.Kind.PEER_HUNG}) as verdicts:
        event = verdicts.get(timeout=1.0)
    rasd.record_restart(3, "PEER_DEAD of rank 2", [2], 0.4)  # training restarted in place (inprocess.Wrapper)
    rasd.stop()                            # leave: peers record LEFT, not DEAD (also done at exit)

``start`` returns at once with a ``RasHandle`` (or None: rasd is off, or could not start); the node runs on its own
daemon thread. Nothing here raises into training: a setting that cannot be used, an address that cannot be bound,
a store that fails, each is one log line saying what was wrong and what rasd does instead (docs/operations.md §1).
A process that forks leaves no copy of the node's sockets open in the child.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from rasd.core import node as core
from rasd.core.comms import ProcessData
from rasd.core.config import Timers, read_switch
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo, new_incarnation
from rasd.net import work
from rasd.net.bootstrap import StoreBootstrap
from rasd.net.runtime import Runtime, mesh_host
from rasd.net.subscriptions import Subscription
from rasd.services import journal, metrics

log = logging.getLogger("rasd")

# The one RAS node of this process (docs/architecture.md §2.1: one node per process), the only state kept here.
_runtime: Runtime | None = None
_lock = threading.Lock()
_hooks_installed = False


class RasHandle:
    """This process's RAS node, as the code beside it sees it: who it is in the mesh, where it serves, its events.

    ``rasd.start`` and ``rasd.node`` return one. The node itself (the asyncio runtime and the protocol state)
    stays behind it, on the RAS thread, so nothing outside rasd depends on how the node is built.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def running(self) -> bool:
        """True until the node stops (``stop``, ``rasd.stop``, exit, or a failure of its thread)."""
        return self._runtime.running

    @property
    def peer(self) -> PeerInfo:
        """This process as the mesh knows it: mesh address, pid, host name, incarnation, rank."""
        return self._runtime.peer

    @property
    def address(self) -> Addr:
        """The mesh address (host, port) this node listens on."""
        return self._runtime.peer.addr

    @property
    def client_address(self) -> tuple[str, int] | None:
        """Where this process serves the client port (``rascli``, ``nc``): (host, port), or None without one."""
        return self._runtime.client_address

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """Where this process serves its Prometheus metrics (``TORCHRAS_METRICS_ADDR``): (host, port), or None."""
        return self._runtime.metrics_address

    def subscribe(self, kinds: Iterable[Kind] | None = None, replay: bool = False) -> Subscription:
        """A queue of this node's events (see ``rasd.subscribe``)."""
        return self._runtime.subscribers.subscribe(kinds, replay)

    def on_event(
        self, callback: Callable[[Event], None], kinds: Iterable[Kind] | None = None, replay: bool = False
    ) -> Subscription:
        """Call ``callback(event)`` on a dispatcher thread for each event (see ``rasd.on_event``)."""
        return self._runtime.subscribers.on_event(callback, kinds, replay)

    def owned_fds(self) -> set[int]:
        """The file descriptors of the node's sockets: code that tears down this process's connections (inprocess's
        abort) leaves these alone, so the mesh outlives a restart."""
        return self._runtime.owned_fds()

    def stop(self, goodbye: bool = True) -> None:
        """Leave the mesh and end the node (as ``rasd.stop``). Safe to call twice; never raises."""
        _stop(self._runtime, goodbye)

    def __repr__(self) -> str:
        where = f" {self.address}" if self._runtime.node is not None else ""
        return f"<RasHandle{where} {'running' if self.running else 'stopped'}>"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether rasd runs in this process: ``TORCHRAS_ENABLE`` is a switch (0/false/no/off turns rasd off; a value
    that is not a switch is logged, and rasd stays on)."""
    return read_switch(environ, "TORCHRAS_ENABLE", True, _warn)


def start(
    store: Any = None,
    *,
    rank: int = -1,
    secret: bytes | str | None = None,
    host: str | None = None,
    timers: Timers | None = None,
    devices: Iterable[int] = (),
    local_data: Callable[[], ProcessData] = ProcessData,
    services: list[Callable[[Runtime], Any]] | None = None,
    prefix: str | None = None,
) -> RasHandle | None:
    """Start this process's RAS node (once; later calls return the running one) and return its handle.

    ``store``: a torch.distributed Store (or any object with set/get/add/wait) to find the job's other processes
    and its secret; None starts a mesh of one. ``secret``: overrides ``TORCHRAS_SECRET`` and the store.
    Returns None, and never raises, when rasd is off (``TORCHRAS_ENABLE=0``) or the node cannot start: one
    WARNING line says why, and training runs on without RAS.
    """
    global _runtime
    if not enabled():
        return None
    try:
        with _lock:
            if _runtime is not None and _runtime.running:
                return RasHandle(_runtime)
            _install_process_hooks()
            rt = _new_runtime(store, rank, secret, host, timers, devices, local_data, services, prefix)
            rt.start()
            if rt.start_error is not None:
                return None  # the runtime logged the one line that says why
            _runtime = rt
            return RasHandle(rt)
    except Exception as e:  # noqa: BLE001 - never into training
        log.warning("rasd: could not start the RAS node (%s: %s); this process runs without RAS", type(e).__name__, e)
        return None


def _new_runtime(
    store: Any,
    rank: int,
    secret: bytes | str | None,
    host: str | None,
    timers: Timers | None,
    devices: Iterable[int],
    local_data: Callable[[], ProcessData],
    services: list[Callable[[Runtime], Any]] | None,
    prefix: str | None,
) -> Runtime:
    timers = timers or Timers.from_env(warn=_warn)
    if secret is None and os.environ.get("TORCHRAS_SECRET"):
        secret = os.environ["TORCHRAS_SECRET"]
    if isinstance(secret, str):
        secret = secret.encode()
    listen_host = host if host is not None else mesh_host(_store_host(store))
    bootstrap = StoreBootstrap(store, prefix) if store is not None else None
    # Ordered by start time: a later process at the same address is the newer peer (docs/architecture.md §2.6).
    incarnation = new_incarnation(time.time(), random.SystemRandom())
    hostname = socket.gethostname()
    dev = tuple(int(d) for d in devices)
    pid = os.getpid()

    def info(port: int) -> PeerInfo:
        return PeerInfo(
            addr=Addr(listen_host, port), pid=pid, hostname=hostname, incarnation=incarnation, devices=dev, rank=rank
        )

    # Metrics and the verdict journal first: services that do nothing unless TORCHRAS_METRICS_ADDR or
    # TORCHRAS_JOURNAL_DIR is set (docs/operations.md).
    services = [metrics.serve, journal.serve, *(services or [])]
    return Runtime(info, secret, listen_host, timers, bootstrap=bootstrap, local_data=local_data, services=services)


def _warn(problem: str) -> None:
    log.warning("rasd: %s", problem)


def stop(goodbye: bool = True) -> None:
    """Leave the mesh and end the node's thread. Safe to call twice, and at exit. ``goodbye=False`` leaves as a
    crash does (peers record DEAD, not LEFT)."""
    rt = _runtime
    if rt is not None:
        _stop(rt, goodbye)


def _stop(rt: Runtime, goodbye: bool) -> None:
    global _runtime
    with _lock:
        if _runtime is rt:
            _runtime = None
    try:
        rt.stop(goodbye=goodbye)
    except Exception:  # pragma: no cover - never raise at exit
        log.exception("rasd: error while stopping")


def node() -> RasHandle | None:
    """The handle of this process's running node, or None."""
    rt = _runtime
    return RasHandle(rt) if rt is not None else None


def subscribe(kinds: Iterable[Kind] | None = None, replay: bool = False) -> Subscription:
    """A queue of this node's events (all kinds, or those given); ``replay`` first delivers the recent events
    that happened before the call. Raises RuntimeError if no node runs."""
    rt = _require()
    return rt.subscribers.subscribe(kinds, replay)


def on_event(
    callback: Callable[[Event], None], kinds: Iterable[Kind] | None = None, replay: bool = False
) -> Subscription:
    """Call ``callback(event)`` on a dispatcher thread for each event (never on the RAS thread)."""
    rt = _require()
    return rt.subscribers.on_event(callback, kinds, replay)


def record_restart(iteration: int, cause: str, terminated_ranks: Sequence[int], seconds_lost: float) -> None:
    """Tell this process's node that training restarted in place: ``iteration`` is the one that runs now,
    ``cause`` what made it restart (e.g. ``PEER_DEAD of rank 2 (pid 4242)``), ``terminated_ranks`` the ranks it
    left behind and ``seconds_lost`` the training time it cost.

    The node emits a RESTART event to its subscribers and MONITOR clients, and its contribution to status reports
    carries the restart from then on (docs/protocol.md). inprocess.Wrapper calls this on the training thread after
    every restart, so it only hands the call to the RAS thread: it is cheap, never raises, and does nothing (a
    debug log line) when no node runs.
    """
    try:
        args = (int(iteration), str(cause), tuple(int(r) for r in terminated_ranks), float(seconds_lost))
    except Exception:  # never into training
        log.debug("rasd: could not record a restart", exc_info=True)
        return
    _notify_node(lambda node, now: node.restarted(*args, now), f"restart to iteration {iteration}")


def sync_journal(verdict: bool = False) -> bool:
    """Wait, at most 0.2 s (``rasd.services.journal.BUDGET_S``), until this process's verdict journal
    (``TORCHRAS_JOURNAL_DIR``) holds everything the node journaled before the call; with ``verdict``, first for a
    verdict that restarts training (PEER_DEAD, PEER_HUNG, COMM_STUCK) journaled since the last such call.

    inprocess's monitor thread calls it before a restart acts, so the verdict behind the restart is in the file
    before the restart's first line (docs/operations.md §11). True when the journal holds it all; False when the
    budget ran out, or no journal is kept (no node, or ``TORCHRAS_JOURNAL_DIR`` unset or failed). Never raises.
    """
    try:
        rt = _runtime
        kept = journal.of(rt) if rt is not None else None
        return kept.sync(journal.BUDGET_S, verdict) if kept is not None else False
    except Exception:  # never into training
        log.debug("rasd: could not wait for the journal", exc_info=True)
        return False


def phase(name: str, limit: float | None = None) -> AbstractContextManager[None]:
    """Name a phase of this process for the mesh, as a context manager, where the mesh cannot infer it::

        with rasd.phase("checkpoint", limit=600):
            save_checkpoint()  # the other ranks wait in a barrier meanwhile

    While it runs, a communicator that this process's ranks hold behind is SLOW, never COMM_STUCK, until the phase
    has lasted ``limit`` seconds (None: the busy limit, ``TORCHRAS_BUSY_LIMIT``, 300 s); the report, ``rascli``,
    MONITOR and the stacks name the phase. Most long phases need no name: a rank behind whose process works (its
    CPU or I/O moving) is SLOW by itself (docs/operations.md §5). Costs nothing without a RAS node; never raises
    (a bad ``limit`` is one WARNING and the busy limit)."""
    return work.phase(name, limit)


class WorkState(NamedTuple):
    """What ``work_state`` tells: whether this process is busy rather than hung, as the mesh measures it."""

    #: Seconds since this process last worked (its CPU or I/O moving, or its main thread's position; measured by
    #: the node twice a second, less the RAS thread's own); None where it cannot be measured (no ``/proc``).
    idle: float | None
    #: Whether one of its ranks is inside an operation of a communicator the mesh holds SLOW (``COMM_SLOW``): it
    #: waits in a collective for a peer that works (rank 0 writing a checkpoint while the others wait in a barrier).
    slow: bool
    #: The busy limit in seconds (``TORCHRAS_BUSY_LIMIT``, scaled by ``TORCHRAS_TIMEOUT_FACTOR``): how long the mesh
    #: lets a working rank hold a communicator before COMM_STUCK.
    busy_limit: float
    #: Seconds between two measurements of the work (``idle`` is known to within this).
    interval: float


def work_state() -> WorkState | None:
    """Whether this process works or waits for a working peer, for a watchdog of its own (``inprocess.Wrapper``'s
    soft and hard timeouts, which must not restart a rank busy in a 2-minute checkpoint that does not ping).

    None when no RAS node runs (``TORCHRAS_ENABLE=0``, or rasd not started). Cheap (it reads what the RAS thread
    measured; no ``/proc`` read, no message), callable from any thread, never raises (None on any error)."""
    try:
        rt = _runtime
        if rt is None or not rt.running or rt.node is None:
            return None
        node = rt.node
        meter = node.work_meter
        worked = meter.worked_at
        idle = max(0.0, time.monotonic() - worked) if worked is not None else None
        return WorkState(idle, _waits_on_slow(node), float(rt.timers.busy), float(meter.interval))
    except Exception:  # never into training
        log.debug("rasd: could not read the work state", exc_info=True)
        return None


def _waits_on_slow(node: core.Node) -> bool:
    """This process's rank is among those inside the operation of a communicator the mesh holds SLOW (the verdict's
    ``global_inside``, made from the counters of the sweep that confirmed it, and cleared by the next sweep once they
    move). Reads only the verdicts: never this process's counters, which the RAS thread refreshes (a read from the
    watchdog's thread would race it). The verdicts are read from the RAS thread's dict: a change under the read is
    retried, and after three it says False (the next call reads again)."""
    rank = node.me.rank
    if rank < 0:
        return False
    for _ in range(3):
        try:
            return any(v.slow and rank in v.global_inside for v in list(node.standing_stuck().values()))
        except RuntimeError:  # the RAS thread changed the dict while it was read
            continue
    return False


def record_waiting(waiting: bool) -> None:
    """Tell this process's node whether it waits to be admitted into a running job (a newcomer between joining the
    mesh and the rendezvous round that admits it: inprocess.elastic.Joining). Status reports mark such processes
    WAITING and count them. Cheap, never raises, nothing when no node runs (as ``record_restart``)."""
    flag = bool(waiting)
    _notify_node(lambda node, now: node.set_waiting(flag, now), f"waiting={flag}")


def _notify_node(step: Callable[[core.Node, float], list[core.Action]], what: str) -> None:
    """Hand a local notification to the RAS thread (``Runtime.submit``): the training thread's side of
    ``record_*``. Cheap, never raises; a debug line and nothing else when no node runs."""
    try:
        rt = _runtime
        if rt is None or not rt.running:
            log.debug("rasd: no RAS node runs: %s not recorded", what)
            return
        rt.submit(step)
    except Exception:  # never into training
        log.debug("rasd: could not record %s", what, exc_info=True)


def _require() -> Runtime:
    rt = _runtime
    if rt is None:
        raise RuntimeError("no RAS node runs in this process: call rasd.start() first")
    return rt


def _store_host(store: Any) -> str | None:
    for attr in ("host",):
        value = getattr(store, attr, None)
        if isinstance(value, str) and value:
            return value
    return os.environ.get("MASTER_ADDR")


def _after_fork_in_child() -> None:
    global _runtime
    rt = _runtime
    _runtime = None
    if rt is not None:
        rt.close_fds_in_child()


def _install_process_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    previous = sys.excepthook

    def died_of_an_exception(*exc_info: Any) -> None:
        # An uncaught exception ends the process: a fault, not a clean exit. Leave without a goodbye, so the
        # job records this process DEAD (at once, by the fast-death rule) rather than LEFT.
        stop(goodbye=False)
        previous(*exc_info)

    sys.excepthook = died_of_an_exception
