"""The public face of rasd: one RAS node per process.

::

    import rasd
    rasd.start(store)                      # join the job's mesh through a torch.distributed Store
    with rasd.subscribe({rasd.Kind.PEER_DEAD, rasd.Kind.PEER_HUNG}) as verdicts:
        event = verdicts.get(timeout=1.0)
    rasd.record_restart(3, "PEER_DEAD of rank 2", [2], 0.4)  # training restarted in place (inprocess.Wrapper)
    rasd.stop()                            # leave: peers record LEFT, not DEAD (also done at exit)

``start`` returns at once; the node runs on its own daemon thread. Nothing here raises into the caller once the
node is started, and a process that forks leaves no copy of the node's sockets open in the child.
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
from typing import Any, Callable, Iterable, Sequence

from rasd.core.comms import ProcessData
from rasd.core.config import Timers
from rasd.core.events import Event, Kind
from rasd.core.peers import PeerInfo, new_incarnation
from rasd.net.bootstrap import StoreBootstrap
from rasd.net.runtime import Runtime, mesh_host
from rasd.net.subscriptions import Subscription

log = logging.getLogger("rasd")

# The one RAS node of this process (DESIGN.md: no module-level mutable state beyond it).
_runtime: Runtime | None = None
_lock = threading.Lock()
_hooks_installed = False


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
) -> Runtime | None:
    """Start this process's RAS node (once; later calls return the running one).

    ``store``: a torch.distributed Store (or any object with set/get/add/wait) to find the job's other processes
    and its secret; None starts a mesh of one. ``secret``: overrides ``TORCHRAS_SECRET`` and the store.
    ``TORCHRAS_ENABLE=0`` turns rasd off (returns None).
    """
    global _runtime
    if os.environ.get("TORCHRAS_ENABLE", "1").strip() == "0":
        return None
    with _lock:
        if _runtime is not None and _runtime.running:
            return _runtime
        _install_process_hooks()
        timers = timers or Timers.from_env()
        if secret is None and os.environ.get("TORCHRAS_SECRET"):
            secret = os.environ["TORCHRAS_SECRET"]
        if isinstance(secret, str):
            secret = secret.encode()
        if host is None:
            host = mesh_host(_store_host(store))
        bootstrap = StoreBootstrap(store, prefix) if store is not None else None
        # Ordered by start time: a later process at the same address is the newer peer (docs/architecture.md 2.6).
        incarnation = new_incarnation(time.time(), random.SystemRandom())
        hostname = socket.gethostname()
        dev = tuple(devices)
        pid = os.getpid()

        def info(port: int) -> PeerInfo:
            from rasd.core.peers import Addr
            return PeerInfo(addr=Addr(host, port), pid=pid, hostname=hostname, incarnation=incarnation,
                            devices=dev, rank=rank)

        rt = Runtime(info, secret, host, timers, bootstrap=bootstrap, local_data=local_data, services=services)
        rt.start()
        if rt.start_error is not None:
            return None
        _runtime = rt
        return rt


def stop(goodbye: bool = True) -> None:
    """Leave the mesh and end the node's thread. Safe to call twice, and at exit. ``goodbye=False`` leaves as a
    crash does (peers record DEAD, not LEFT)."""
    global _runtime
    with _lock:
        rt, _runtime = _runtime, None
    if rt is not None:
        try:
            rt.stop(goodbye=goodbye)
        except Exception:  # pragma: no cover - never raise at exit
            log.exception("rasd: error while stopping")


def runtime() -> Runtime | None:
    """The running node of this process, if any."""
    return _runtime


def subscribe(kinds: Iterable[Kind] | None = None, replay: bool = False) -> Subscription:
    """A queue of this node's events (all kinds, or those given); ``replay`` first delivers the recent events
    that happened before the call. Raises RuntimeError if no node runs."""
    rt = _require()
    return rt.subscribers.subscribe(kinds, replay)


def on_event(callback: Callable[[Event], None], kinds: Iterable[Kind] | None = None,
             replay: bool = False) -> Subscription:
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
        rt = _runtime
        if rt is None or not rt.running:
            log.debug("rasd: no RAS node runs: restart to iteration %s not recorded", iteration)
            return
        args = (int(iteration), str(cause), tuple(int(r) for r in terminated_ranks), float(seconds_lost))
        rt.call(lambda: rt._feed(lambda now: rt.node.restarted(*args, now)))
    except Exception:  # never into training
        log.debug("rasd: could not record a restart", exc_info=True)


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
