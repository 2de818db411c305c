"""The monitor process: a watcher outside the training process, one per call of the wrapped function.

It is started fresh with ``subprocess`` (a new interpreter running this file), never forked from the threaded,
torch-initialised trainer, and it talks to the trainer over a socket pair in JSON lines; every hand-shake has a
timeout. It does three things:

* **trainer death**: the socket pair reports end-of-file the moment the trainer dies (kill -9 included). The
  monitor then records ``TERMINATED`` in the current iteration, marks the rank terminated, registers it at the
  iteration barrier and its initial rank at the termination barrier, so survivors neither wait for it nor
  count it in the next iteration.
* **soft timeout**: no progress stamp for ``soft_timeout`` records ``SOFT_TIMEOUT`` (once per iteration), which
  restarts every rank.
* **hard timeout**: no progress for ``hard_timeout`` records ``HARD_TIMEOUT``, marks the rank terminated and kills
  the trainer (SIGCONT+SIGTERM, ``termination_grace_time``, then SIGKILL until it is gone). The time without
  progress carries over the restarts that this rank's own soft timeouts caused: a function that blocks again in
  every iteration (the wake signal takes it out of its call, the restart puts it back in) is still ended at its
  hard timeout, as the reference ends it, instead of restarting for ever. The carry is dropped when the trainer
  reports progress (``PROGRESS``: a step or commit beyond any before, ``inprocess.repeated_faults``), or stamps
  progress more than ``soft_timeout`` into an iteration (it got past where it blocked before).
* **busy is not hung**: both timeouts wait while the trainer's stamps carry evidence that it works, or waits in a
  collective for a rank that works (``inprocess.busy``), for at most the busy limit without a progress stamp; one
  INFO line says so (``postpone``). Then the ladder goes on from where it waited: soft, then hard.

* **sibling heartbeats**: the monitor bumps a counter ``heartbeat_{rank}`` every ``heartbeat_interval`` and
  watches its successor's counter in the ring of the iteration's ranks. A counter that does not move for
  ``heartbeat_timeout`` (measured on the *watcher's* clock: no wall clocks of two hosts are ever compared) means
  the successor's trainer and monitor are both gone (a dead node): the watcher records ``UNRESPONSIVE`` and
  does what the dead rank's own monitor would have done, then watches the next rank of the ring.

Timeouts are evaluated against deadlines on *every* turn of the loop, whatever arrives on the socket, so no
choice of intervals can starve them (the reference skips its checks while stamps keep arriving).

This file imports only the standard library at module level. For the default store (``inprocess.store.TCPStore``, and
a TCPStore from a factory the monitor cannot import) the process never imports torch: it talks to the store server
with ``inprocess.tcpstore_client`` and uses the restart vocabulary of ``inprocess.store_mixin``, which saves every
rank's monitor seconds of start-up and hundreds of MB of memory. For any other store (etcd, a file, a user's own
factory, which the monitor calls as the reference's does), or if that client's hand-shake fails, it imports torch
and opens the store as the trainer does.
"""

from __future__ import annotations

if __name__ == "__main__":  # run as a script: keep this package's folder off sys.path (its module names are generic)
    import os as _os
    import sys as _sys

    if _sys.path and _os.path.abspath(_sys.path[0]) == _os.path.dirname(_os.path.abspath(__file__)):
        _sys.path.pop(0)

import base64
import enum
import importlib
import json
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from typing import Any

log = logging.getLogger("inprocess.monitor_process")

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: The longest the monitor's loop waits is ``monitor_process_interval``, but never less than this (``next_wakeup``).
#: How long a rank whose busy evidence just lapsed (the peer it waited for finished, its collective completed) has to
#: stamp progress before the postponed timeout fires: half the soft timeout at most.
AFTER_EXCUSE_GRACE = 10.0
POLL_FLOOR = 0.05

# The monitor's start-up (a fresh interpreter, importing torch for stores other than a TCPStore) may take this long
# whatever barrier_timeout is.
STARTUP_BUDGET = 120.0


class Message(str, enum.Enum):
    """The kinds of message on the socket pair (the ``t`` of each JSON line), named as the reference's messages
    where they mean the same. The reference's ``RECORD_INTERRUPTED`` (the trainer writes its own records here) and
    ``DISABLE_SIBLING_MONITOR`` (a sibling monitor here lives exactly one iteration) have no use here."""

    CONFIG = "config"  # trainer -> monitor: the settings, first
    STORE_READY = "store_ready"  # trainer -> monitor: connect to the call's namespace of the store
    ITERATION_START = "iteration"  # trainer -> monitor: rank, world size and iteration of the iteration that starts
    TIMESTAMP = "ts"  # trainer -> monitor: the progress watchdog's stamps
    PROGRESS = "progress"  # trainer -> monitor: the training got further than ever (the first time in an iteration)
    DISABLE_TIMEOUTS = "disable_timeouts"  # trainer -> monitor: no soft or hard timeout until enabled
    ENABLE_TIMEOUTS = "enable_timeouts"
    TERMINATE = "stop"  # trainer -> monitor: the call ended, leave
    DAEMON_PID = "booted"  # monitor -> trainer: started (with its pid), the pid file written
    READY = "ready"  # monitor -> trainer: connected to the store
    ERROR = "error"  # monitor -> trainer: could not connect


def _encode(message: dict) -> bytes:
    return (json.dumps(message) + "\n").encode()


def is_process_active(process: Any) -> bool:
    """Whether ``process`` (a ``psutil.Process`` or a pid) still runs: it exists and is not a zombie."""
    try:
        import psutil

        if not isinstance(process, psutil.Process):
            process = psutil.Process(int(process))
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - NoSuchProcess and friends: not running
        return False


def terminate_process(process: Any, termination_grace_time: Any, log: logging.Logger | None = None) -> None:
    """End ``process`` (a ``psutil.Process`` or a pid) as the hard timeout does: SIGCONT and SIGTERM, then, after
    ``termination_grace_time`` (a ``datetime.timedelta`` or seconds), SIGCONT, SIGTERM and SIGKILL until it is gone.
    """
    pid = int(getattr(process, "pid", process))
    grace = (
        termination_grace_time.total_seconds()
        if hasattr(termination_grace_time, "total_seconds")
        else float(termination_grace_time)
    )
    if log is not None:
        log.info("terminating pid %s (grace %.3f s)", pid, grace)

    def send(*signals: int) -> None:
        for sig in signals:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    send(signal.SIGCONT, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and is_process_active(pid):
        time.sleep(0.02)
    while is_process_active(pid):
        send(signal.SIGCONT, signal.SIGTERM, signal.SIGKILL)
        time.sleep(0.05)


#: The reference module's other names, from this package (loaded on first use: this file also runs as the monitor's
#: script, which imports nothing of the package at module level).
_REEXPORTS = {
    "Interruption": "attribution",
    "InterruptionRecord": "attribution",
    "Timestamp": "progress_watchdog",
    "SiblingMonitor": "sibling_monitor",
    "PrefixStore": "store",
    "StoreMixin": "store",
}


def __getattr__(name: str) -> Any:
    if name == "utils":
        return importlib.import_module("inprocess.utils")
    if name in _REEXPORTS:
        return getattr(importlib.import_module(f"inprocess.{_REEXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ==== trainer side ==============================================================================================


def _factory_by_reference(factory: Any, kwargs: dict) -> str | None:
    """``(factory, kwargs)`` pickled, if a fresh interpreter can import the factory by name; None otherwise."""
    qualname = getattr(factory, "__qualname__", "")
    if getattr(factory, "__module__", "__main__") == "__main__" or "<locals>" in qualname:
        return None  # __main__ is the monitor's own script there; a local class has no importable name
    try:
        return base64.b64encode(pickle.dumps((factory, kwargs))).decode()
    except Exception:  # noqa: BLE001 - unpicklable kwargs: plain connection parameters instead
        return None


#: The one-line reasons every rank prints at the restart (``fault_reasons`` in the store), by what was found.
_REASONS = {
    "TERMINATED": "PEER_DEAD of rank {rank} (pid {pid} exited, seen by its monitor process)",
    "HARD_TIMEOUT": "HARD_TIMEOUT of rank {rank} (pid {pid} made no progress, its monitor process ends it)",
    "SOFT_TIMEOUT": "SOFT_TIMEOUT of rank {rank} (pid {pid} made no progress)",
}


class MonitorProcess:
    """Handle held by the trainer: start the monitor, feed it stamps and iteration changes, stop it."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        soft_timeout: float,
        hard_timeout: float,
        termination_grace_time: float,
        barrier_timeout: float,
        interval: float,
        heartbeat_interval: float,
        heartbeat_timeout: float,
        log_filename: str | None,
        pid_filename: str | None,
        store_factory: Any,
        store_kwargs: dict,
    ) -> None:
        self.rank = rank
        config = dict(
            rank=rank,
            world_size=world_size,
            trainer_pid=os.getpid(),
            soft_timeout=soft_timeout,
            hard_timeout=hard_timeout,
            termination_grace_time=termination_grace_time,
            barrier_timeout=barrier_timeout,
            interval=interval,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            log_filename=log_filename.format(rank=rank) if log_filename else None,
            pid_filename=pid_filename.format(rank=rank) if pid_filename else None,
        )
        # Sent by reference only when the monitor can import it; otherwise it gets plain connection parameters
        # (``store_ready``), so a factory defined inside a function works too.
        self._factory = _factory_by_reference(store_factory, store_kwargs)
        self._socket, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
        env["INPROCESS_STORE_CLIENT"] = "1"  # the monitor never hosts the store
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        try:
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None if os.environ.get("INPROCESS_MONITOR_STDERR") else subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                close_fds=True,
            )
        finally:
            child.close()
        self._lock = threading.Lock()
        self._broken = False
        self._buffer = b""
        self._send(dict(t=Message.CONFIG, config=config))

    @property
    def pid(self) -> int:
        return self.process.pid

    def _send(self, message: dict) -> None:
        if self._broken:
            return
        try:
            with self._lock:
                self._socket.sendall(_encode(message))
        except OSError:
            self._broken = True
            log.error("rank %s: the monitor process is gone; hang protection is off", self.rank)

    def _receive(self, deadline: float) -> dict | None:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._socket], [], [], left)
            if not ready:
                return None
            data = self._socket.recv(65536)
            if not data:
                raise RuntimeError("the monitor process exited during its start-up")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def store_ready(self, namespace: str, store: Any) -> None:
        """The trainer's store exists: the monitor connects its own client (never a server) to ``namespace``."""
        from .store import TCPStore, connection_parameters

        message: dict = dict(t=Message.STORE_READY, namespace=namespace, factory=self._factory)
        # Parameters where the monitor cannot call the factory, and for the default store (this package's
        # TCPStore), whose monitor connects with the torch-free client. A user's factory that the monitor can import
        # is called there, whatever store it makes, as the reference's monitor calls it.
        if self._factory is None or type(store) is TCPStore:
            message["parameters"] = connection_parameters(store)
        self._send(message)

    def wait_ready(self, timeout: float) -> None:
        """Wait for the monitor: its start-up within ``max(timeout, STARTUP_BUDGET)``, then its store hand-shake
        within ``timeout``. A fresh interpreter importing torch takes seconds on a loaded machine, which a tight
        ``barrier_timeout`` (the reference's own tests use 3 s) must not turn into a failure; a monitor that never
        connects to the store still fails after ``timeout``."""
        from . import exception

        deadline = time.monotonic() + max(timeout, STARTUP_BUDGET)
        booted = False
        while True:
            message = self._receive(deadline)
            if message is None:
                what = "ready" if booted else "started"
                raise exception.TimeoutError(f"the monitor process was not {what} within {timeout} s")
            if message.get("t") == Message.DAEMON_PID and not booted:
                booted = True
                deadline = time.monotonic() + timeout
            if message.get("t") == Message.READY:
                return
            if message.get("t") == Message.ERROR:
                raise exception.InternalError(f"the monitor process failed: {message.get('error')}")

    def start_iteration(
        self, rank: int, world_size: int, iteration: int, initial_rank: int, initial_world_size: int
    ) -> None:
        self._send(
            dict(
                t=Message.ITERATION_START,
                rank=rank,
                world_size=world_size,
                iteration=iteration,
                initial_rank=initial_rank,
                initial_world_size=initial_world_size,
            )
        )

    def send_timestamp(self, timestamp: Any) -> None:
        message = dict(t=Message.TIMESTAMP, auto=timestamp.auto, manual=timestamp.manual)
        until = getattr(timestamp, "until", None)  # the busy evidence (inprocess.busy), when there is some
        if until is not None:
            message.update(until=until, why=timestamp.why, busy=timestamp.busy_limit)
        self._send(message)

    def disable_timeouts(self) -> None:
        self._send(dict(t=Message.DISABLE_TIMEOUTS))

    def enable_timeouts(self) -> None:
        self._send(dict(t=Message.ENABLE_TIMEOUTS))

    def progress(self) -> None:
        self._send(dict(t=Message.PROGRESS))

    def shutdown(self, timeout: float = 5.0) -> None:
        self._send(dict(t=Message.TERMINATE))
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("rank %s: the monitor process did not stop within %s s, killing it", self.rank, timeout)
            self.process.kill()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._socket.close()


# ==== monitor side ==============================================================================================


class _Monitor:
    def __init__(self, sock: socket.socket, config: dict) -> None:
        self.sock = sock
        self.config = config
        self.trainer_pid: int = config["trainer_pid"]
        self.rank: int = config["rank"]
        self.initial_rank: int = config["rank"]
        self.initial_world_size: int = config["world_size"]
        self.world_size: int = config["world_size"]
        self.iteration: int | None = None
        self.base_store: Any = None
        self.timeouts_enabled = True
        self.baseline = time.monotonic()
        self.auto: float | None = None
        self.manual: float | None = None
        self.soft_fired = False
        #: Seconds without progress in the earlier iterations that this rank's soft timeouts ended (the hard
        #: timeout counts them: a function that blocks again in every iteration must not restart for ever).
        self.carried = 0.0
        self.soft_stale = 0.0  # the staleness at which this iteration's soft timeout fired
        # The busy evidence (inprocess.busy): until when it holds, why, and the busy limit that bounds it.
        self.until: float | None = None
        self.why = ""
        self.busy_limit = 0.0
        #: Seconds this iteration's timeouts were postponed for a rank that is busy, not hung: the ladder counts
        #: ``staleness - held`` (``check``).
        self.held = 0.0
        self.held_from = 0.0  # the progress stamp ``held`` counts from: a newer one starts it again
        self.postponed: set[str] = set()  # why this iteration's timeouts were postponed (one INFO line each)
        self.iteration_started = time.monotonic()
        self.stop_requested = False
        self.buffer = b""
        # This iteration's ring heartbeat (inprocess.sibling_monitor), made at the first turn after it starts.
        self.heartbeat: Any = None
        self.sibling_monitor: Any = None

    # ---- messages -------------------------------------------------------------------------------------------

    def handle(self, message: dict) -> None:
        kind = message.get("t")
        if kind == Message.TIMESTAMP:
            self.auto, self.manual = message.get("auto"), message.get("manual")
            self.until, self.why, self.busy_limit = message.get("until"), message.get("why", ""), message.get("busy", 0)
        elif kind == Message.ITERATION_START:
            self.rank, self.world_size = message["rank"], message["world_size"]
            self.iteration = message["iteration"]
            self.initial_rank = message["initial_rank"]
            self.initial_world_size = message["initial_world_size"]
            self.carried = self.carried + self.soft_stale if self.soft_fired else 0.0
            self.soft_fired, self.soft_stale = False, 0.0
            self.held, self.postponed, self.until = 0.0, set(), None
            self.iteration_started = time.monotonic()
            self.auto, self.manual = None, None
            self.baseline = time.monotonic()
            self.heartbeat = self.sibling_monitor = None
        elif kind in (Message.DISABLE_TIMEOUTS, Message.ENABLE_TIMEOUTS):
            self.timeouts_enabled = kind == Message.ENABLE_TIMEOUTS
            self.baseline = time.monotonic()
            self.held = 0.0  # the staleness starts again from the baseline
        elif kind == Message.PROGRESS:
            self.carried = 0.0
        elif kind == Message.STORE_READY:
            self.connect_store(message)
        elif kind == Message.TERMINATE:
            self.stop_requested = True

    def connect_store(self, message: dict) -> None:
        try:
            self.base_store = self.torch_free_store(message) or self.torch_store(message)
            self.sock.sendall(_encode(dict(t=Message.READY)))
            log.info("connected to the store (client: %s)", type(self.base_store.base_store).__name__)
        except Exception as error:  # reported to the trainer
            log.exception("cannot connect to the store")
            self.sock.sendall(_encode(dict(t=Message.ERROR, error=repr(error))))

    def torch_free_store(self, message: dict) -> Any:
        """The call's namespace over ``inprocess.tcpstore_client`` if the store is a TCPStore; None otherwise.

        None too if the client cannot open its connection (one log line): ``torch_store`` then tries torch's.
        """
        parameters = message.get("parameters") or {}
        if parameters.get("kind") != "tcp":
            return None
        loaded = set(sys.modules)
        try:
            store_mixin, tcpstore_client = _import_torch_free("store_mixin", "tcpstore_client")
            client = tcpstore_client.TCPStoreClient(parameters["host"], parameters["port"], parameters["timeout"])
        except Exception as error:  # noqa: BLE001 - any failure: torch's client is the fallback
            log.warning("torch-free store client failed (%s); connecting with torch's client", error)
            for name in set(sys.modules) - loaded:  # the next imports run inprocess/__init__.py, as before
                del sys.modules[name]
            return None
        log.debug("torch-free store client connected to %s:%s", parameters["host"], parameters["port"])
        return store_mixin.PrefixedStore(message["namespace"], client)

    def torch_store(self, message: dict) -> Any:
        """The call's namespace over a torch store: the factory sent by reference, or ``open_connection``."""
        from inprocess.store import NamespaceStore, open_connection

        if message.get("factory"):
            factory, kwargs = pickle.loads(base64.b64decode(message["factory"]))
            raw = factory(**kwargs)
        else:
            raw = open_connection(message["parameters"])
        return NamespaceStore(message["namespace"], raw)

    # ---- timeouts -------------------------------------------------------------------------------------------

    def staleness(self, now: float) -> float:
        stamps = [self.auto if self.auto is not None else self.baseline]
        if self.manual is not None:
            stamps.append(self.manual)
        return max(now - max(stamp, self.baseline) for stamp in stamps)

    def next_wakeup(self, now: float) -> float:
        # Every deadline is computed (and messages wake the loop): the interval only bounds the wait, and a floor
        # keeps a monitor of 1 ms from spinning a core, which the trainer's RAS node would count as its work.
        interval = max(self.config["interval"], POLL_FLOOR)
        if self.iteration is not None and self.base_store is not None:
            if self.heartbeat is not None:
                due = [self.heartbeat.next_due, self.sibling_monitor.next_due]
            else:  # not built yet (each turn tries), or building failed: try again after an interval
                due = [now + self.config["heartbeat_interval"]]
            interval = min(interval, max(0.0, min(due) - now))
        if self.iteration is None or not self.timeouts_enabled:
            return interval
        stale = self.staleness(now)
        ladder = stale - self.held
        deadlines = [self.config["hard_timeout"] - self.carried - ladder]
        if not self.soft_fired:
            deadlines.append(self.config["soft_timeout"] - ladder)
        if self.excused(now, stale) and self.until is not None:  # the due ones wait: until the evidence lapses
            deadlines = [d for d in deadlines if d > 0] + [self.until - now, self.busy_limit - stale]
        return max(0.0, min([interval] + [deadline + 0.001 for deadline in deadlines]))

    def excused(self, now: float, stale: float) -> bool:
        """The trainer's evidence that it is busy, not hung (``inprocess.busy``), holds now: it was renewed within
        its deadline, and no progress was stamped for less than the busy limit. Only before this iteration's soft
        timeout: once it fired, the restart is due and the hard timeout bounds it as before."""
        return not self.soft_fired and self.until is not None and now <= self.until and stale < self.busy_limit

    def check(self, now: float) -> None:
        if self.iteration is None or not self.timeouts_enabled or self.base_store is None:
            return
        stale = self.staleness(now)
        if self.carried and now - stale - self.iteration_started > self.config["soft_timeout"]:
            self.carried = 0.0  # progress stamped later than soft_timeout into the iteration: not the same hang
        self.postpone(now, stale)
        ladder = stale - self.held  # the staleness the timeouts count: less the time they were postponed
        held = f"; postponed {self.held:.1f} s while the rank was busy" if self.held else ""
        if ladder + self.carried > self.config["hard_timeout"]:
            log.warning(
                "hard timeout in iteration %s: no progress for %.1f s%s%s, terminating the trainer",
                self.iteration,
                ladder + self.carried,
                f" ({self.carried:.1f} s of it in earlier iterations that its soft timeout restarted)"
                if self.carried
                else "",
                held,
            )
            self.record("HARD_TIMEOUT", terminated=True)
            self.kill_trainer()
            self.timeouts_enabled = False
        elif ladder > self.config["soft_timeout"] and not self.soft_fired:
            log.warning("soft timeout in iteration %s: no progress for %.1f s%s", self.iteration, ladder, held)
            self.soft_fired, self.soft_stale = True, ladder
            self.record("SOFT_TIMEOUT", terminated=False)

    def postpone(self, now: float, stale: float) -> None:
        """While the trainer is busy, not hung, hold the ladder where the first timeout would fire: the soft one
        (or the hard one, where the time carried from earlier iterations brings it first). When the evidence
        lapses, or the busy limit passes, the ladder moves on from there: the soft timeout fires first, the hard
        one ``hard_timeout - soft_timeout`` later, as for a rank that just stopped stamping progress."""
        stamped = now - stale  # the progress stamp the ladder counts from
        if stamped > self.held_from + 1e-6:  # progress since: what was held is no longer owed
            self.held, self.held_from = 0.0, stamped
        if not self.excused(now, stale):
            return
        # Held short of the first timeout by a grace: when the evidence lapses because the wait ended (the
        # collective the rank waited in completed), the rank gets time to stamp its progress before a timeout fires.
        grace = min(AFTER_EXCUSE_GRACE, self.config["soft_timeout"] / 2)
        threshold = max(0.0, min(self.config["soft_timeout"], self.config["hard_timeout"] - self.carried) - grace)
        if stale - self.held <= threshold:
            return
        self.held = stale - threshold
        if self.why not in self.postponed:  # the first postponement of the iteration, or for another reason
            self.postponed.add(self.why)
            (busy,) = _import_torch_free("busy")
            log.info(
                "soft timeout postponed: %s; no progress stamp for %.1f s in iteration %s. The soft and hard "
                "timeouts act when it stops, or once %.0f s pass without progress (the busy limit)",
                busy.describe(self.why, self.initial_rank),
                stale,
                self.iteration,
                self.busy_limit,
            )

    # ---- sibling heartbeats (inprocess.sibling_monitor) ------------------------------------------------------

    def heartbeats(self, now: float) -> None:
        if self.iteration is None or self.base_store is None:
            return
        try:
            if self.heartbeat is None:
                (sibling_monitor,) = _import_torch_free("sibling_monitor")
                store = self.base_store.iteration_store(self.iteration)
                interval, timeout = self.config["heartbeat_interval"], self.config["heartbeat_timeout"]
                self.heartbeat = sibling_monitor.Heartbeat(self.rank, store, interval, timeout)
                # A call's first iteration: a sibling's monitor may still be connecting (SiblingMonitor).
                startup = self.config["barrier_timeout"] if self.iteration == 0 else timeout
                self.sibling_monitor = sibling_monitor.SiblingMonitor(
                    store, self.rank, self.world_size, self.initial_world_size, timeout, interval, startup
                )
            self.heartbeat.beat(now)
            self.sibling_monitor.check_heartbeats(now)
        except Exception:  # the store may be gone; the trainer is still guarded
            log.warning("heartbeat failed", exc_info=True)
            if self.heartbeat is not None:
                self.heartbeat.next_due = now + self.config["heartbeat_interval"]

    def kill_trainer(self) -> None:
        terminate_process(self.trainer_pid, self.config["termination_grace_time"])

    # ---- store writes ---------------------------------------------------------------------------------------

    def record(self, interruption: str, *, terminated: bool) -> None:
        """Record what this monitor found about its trainer in the current iteration (docs/inprocess.md §1)."""
        from inprocess.attribution import Interruption, InterruptionRecord

        if self.iteration is None or self.base_store is None:
            return
        try:
            store = self.base_store.iteration_store(self.iteration)
            if terminated:
                store.record_terminated_ranks([self.rank])
            reason = _REASONS.get(interruption, interruption + " of rank {rank} (pid {pid})")
            store.record_interrupted(
                [InterruptionRecord(self.rank, Interruption[interruption])],
                reason=reason.format(rank=self.initial_rank, pid=self.trainer_pid),
            )
        except Exception:  # the store may be gone (its host exited); keep guarding the trainer
            log.warning("cannot record %s in the store", interruption, exc_info=True)

    def trainer_gone(self) -> None:
        """The trainer died: account for it in the current iteration (and the next one if it was already in it)."""
        if self.base_store is None:
            return
        try:
            self._account_for_dead_trainer()
        except Exception:
            log.warning("cannot account for the dead trainer in the store", exc_info=True)

    def _account_for_dead_trainer(self) -> None:
        if self.iteration is not None:
            log.warning("the trainer (pid %s) died in iteration %s", self.trainer_pid, self.iteration)
            self.record("TERMINATED", terminated=True)
            store = self.base_store.iteration_store(self.iteration)
            store.iteration_barrier([self.rank], self.world_size, 0)
            # Died after the survivors passed the iteration barrier but before it announced the next iteration:
            # its next rank is published already, so account for it there too.
            if store.check(["barrier:iteration:last_worker_arrived"]):
                following = self.base_store.iteration_store(self.iteration + 1)
                next_rank = following.get_rank_of_initial(self.initial_rank, 0)
                next_world = following.get_packed("world_size", ",")
                if next_rank is not None and next_world:  # "world_size" is written as "n," by every rank
                    from inprocess.attribution import Interruption, InterruptionRecord

                    following.record_terminated_ranks([next_rank])
                    following.record_interrupted([InterruptionRecord(next_rank, Interruption.TERMINATED)])
                    following.iteration_barrier([next_rank], int(next_world[-1]), 0)
        if self.initial_rank < self.initial_world_size:  # a process that joined later is no initial rank
            self.base_store.termination_barrier([self.initial_rank], self.initial_world_size, 0)

    # ---- loop -----------------------------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            now = time.monotonic()
            ready, _, _ = select.select([self.sock], [], [], self.next_wakeup(now))
            if ready:
                data = self.sock.recv(65536)
                if not data:
                    if not self.stop_requested:
                        self.trainer_gone()
                    return
                self.buffer += data
                while b"\n" in self.buffer:
                    line, self.buffer = self.buffer.split(b"\n", 1)
                    self.handle(json.loads(line))
                if self.stop_requested:
                    return
            now = time.monotonic()
            self.check(now)
            self.heartbeats(now)


def _import_torch_free(*names: str) -> list[types.ModuleType]:
    """Import ``inprocess.<name>`` for each name without running ``inprocess/__init__.py``, which imports torch.

    The package is entered through a bare module standing for it (``__path__`` only), so the submodules and their
    relative imports load as usual and nothing else of the package does. Only for modules that import no torch.
    """
    if "inprocess" not in sys.modules:
        package = types.ModuleType("inprocess", "inprocess, without its __init__ (the monitor's torch-free path)")
        package.__path__ = [os.path.join(_PACKAGE_PARENT, "inprocess")]
        sys.modules["inprocess"] = package
    return [importlib.import_module(f"inprocess.{name}") for name in names]


def _read_first_message(sock: socket.socket, timeout: float) -> tuple[dict, bytes]:
    sock.settimeout(timeout)
    buffer = b""
    while b"\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise SystemExit(0)
        buffer += data
    sock.settimeout(None)
    line, rest = buffer.split(b"\n", 1)
    return json.loads(line), rest


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    message, rest = _read_first_message(sock, 60.0)
    config = message["config"]
    filename = config["log_filename"]
    handler: logging.Handler = logging.FileHandler(filename) if filename else logging.NullHandler()
    # Every line names the trainer it guards (target_pid) and the module that wrote it (inprocess.monitor_process,
    # inprocess.sibling_monitor, ...), as the reference's monitor log does.
    handler.setFormatter(
        logging.Formatter(
            f"%(asctime)s monitor_process[rank {config['rank']} target_pid={config['trainer_pid']}] %(levelname)s "
            "%(name)s: %(message)s"
        )
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    log.info(
        "target_pid=%s daemon_pid=%s rank=%s world_size=%s",
        config["trainer_pid"],
        os.getpid(),
        config["rank"],
        config["world_size"],
    )
    if config["pid_filename"]:
        # Written once and left in place after the call, as the reference does (SLURM's wait_daemon.py reads it).
        try:
            with open(config["pid_filename"], "w") as pidfile:
                pidfile.write(str(os.getpid()))
        except OSError as error:
            log.error("cannot write the pid file %s: %s", config["pid_filename"], error)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is the trainer's business

    # Start-up done (the pid file written); the store hand-shake has its own deadline.
    sock.sendall(_encode(dict(t=Message.DAEMON_PID, pid=os.getpid())))

    monitor = _Monitor(sock, config)
    monitor.buffer = rest
    try:
        while b"\n" in monitor.buffer:
            line, monitor.buffer = monitor.buffer.split(b"\n", 1)
            monitor.handle(json.loads(line))
        monitor.run()
    except Exception:
        log.exception("monitor process failed")
        try:
            monitor.record("MONITOR_PROCESS_EXCEPTION", terminated=False)
        except Exception:  # noqa: BLE001 - the store is what failed, most likely; the exit code still tells
            pass
        return 1
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # Leave at once: the monitor holds nothing to clean up, and tearing down torch's modules at exit takes
    # seconds on a loaded machine, which the trainer's bounded shutdown would count as a monitor that hangs.
    logging.shutdown()
    os._exit(code)
