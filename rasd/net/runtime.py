"""The asyncio runtime: one daemon thread per process that carries bytes and time in and out of ``core.Node``.

The runtime decides nothing. It owns the sockets and the clock, turns socket callbacks into node inputs, and
carries out the node's actions. Every callback is guarded: an exception is logged and the loop carries on, so the
thread can never raise into the training process. Every wait has a deadline.

Thread rules: the node and every socket belong to the RAS thread. Other threads talk to it only through
``loop.call_soon_threadsafe`` (``stop``, queries) and read events from ``Subscription`` queues.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from rasd.core import node as core, wire
from rasd.core.comms import CommRecord, ProcessData
from rasd.core.config import Timers
from rasd.core.events import Event, Kind
from rasd.core.peers import PeerInfo
from rasd.core.snapshot import JobSnapshot

from . import configuration, thread_stacks, work
from .bootstrap import StoreBootstrap
from .gc_pause import collector_paused
from .subscriptions import Subscribers
from .traffic import FrameCounter, TrafficHooks

log = logging.getLogger("rasd")

#: A connection whose unsent bytes exceed this is given up (the peer is not reading: stopped or wedged).
MAX_WRITE_BUFFER = 32 * 1024 * 1024
#: How long ``stop`` lets goodbyes drain before closing the loop.
STOP_DRAIN_S = 0.5


class _MeshProtocol(asyncio.Protocol):
    """One mesh connection: hands bytes and closure to the runtime."""

    def __init__(self, runtime: Runtime, conn_id: int | None) -> None:
        self.runtime = runtime
        self.conn_id = conn_id
        self.transport: asyncio.Transport | None = None
        self.frames = FrameCounter()  # for the metrics' message count, when they are on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.runtime.own_transport(transport)
        if self.conn_id is None:  # accepted
            self.conn_id = self.runtime.accepted(self)

    def data_received(self, data: bytes) -> None:
        cid = self.conn_id
        metrics = self.runtime.metrics
        if metrics is not None:
            metrics.received(self.frames, data)
        if cid is not None:  # set by connection_made, which asyncio always calls first
            # With the collector paused (rasd/net/gc_pause.py): the root of a STATUS decodes a leg's fold of tens of
            # thousands of processes in one input, and with the collector on that burst set off full collections
            # of the training process's heap on the RAS thread (0.2 of 0.48 s at 100,000: docs/architecture.md §11).
            with collector_paused():
                self.runtime.feed(lambda now: self.runtime.node.received(cid, data, now))

    def connection_lost(self, exc: Exception | None) -> None:
        self.runtime.disown_transport(self.transport)
        self.runtime.lost(self.conn_id)


def last_seen(node: core.Node) -> list[dict[str, Any]]:
    """What a STACKS answer adds for the processes that cannot answer for themselves, as its format has it: the
    processes the node hears from no more and where its sweeps last saw them (``Node.silent_positions``)."""
    return [
        {
            "host": peer.hostname,
            "pid": peer.pid,
            "rank": peer.rank,
            "age_s": age,
            "frames": [[f.file, f.line, f.function] for f in position],
        }
        for peer, position, age in node.silent_positions(time.monotonic())
    ]


def comm_records(node: core.Node) -> tuple[CommRecord, ...]:
    """This process's collective counters, as a status gather takes them: a STACKS answer names the collective each
    main thread is in with them."""
    return node.local_data().comms


class Runtime:
    """Runs one node: ``start()`` spawns the RAS thread, ``stop()`` says goodbye and joins it.

    The runtime imports no service (``rasd.services``): whoever starts the node hands them over as ``services``,
    async functions ``service(runtime)`` awaited on the RAS thread once the node exists, before it joins the job. A
    service attaches itself through the hooks below: ``event_listeners``, ``on_stop``, ``metrics`` (the traffic
    hooks, ``rasd.net.traffic``), and the addresses it serves (``client_address``, ``metrics_address``)."""

    def __init__(
        self,
        info_factory: Callable[[int], PeerInfo],
        secret: bytes | None,
        host: str,
        timers: Timers,
        bootstrap: StoreBootstrap | None = None,
        local_data: Callable[[], ProcessData] = ProcessData,
        services: list[Callable[[Runtime], Any]] | None = None,
    ) -> None:
        self._info_factory = info_factory
        self._secret = secret
        self._host = host
        self.timers = timers
        self._bootstrap = bootstrap
        self._local_data = local_data
        self._services = services or []
        self.node: core.Node = None  # type: ignore[assignment]  # created in the thread, once the port is known
        self.loop: asyncio.AbstractEventLoop | None = None
        self.subscribers = Subscribers()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._transports: dict[int, _MeshProtocol] = {}
        self._fds: set[int] = set()  # every socket this runtime holds, so a forked child can close its copies
        self._next_accept = -1
        self._gather_waiters: dict[int, Callable[[JobSnapshot], None]] = {}
        self._next_query = 1
        self._server: asyncio.base_events.Server | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self.start_error: BaseException | None = None
        #: Where this process serves the client port, once a service opened one (``client_port.ClientPort``).
        self.client_address: tuple[str, int] | None = None
        #: The traffic hooks of the Prometheus metrics, while this process serves them (``rasd.services.metrics``
        #: sets them), and where it serves them.
        self.metrics: TrafficHooks | None = None
        self.metrics_address: tuple[str, int] | None = None
        #: Called on the RAS thread with every event (our own code only: it must not block).
        self.event_listeners: list[Callable[[Event], None]] = []
        #: Called on the RAS thread when the node stops (after the goodbye is queued).
        self.on_stop: list[Callable[[], None]] = []
        # asyncio keeps only weak references to tasks: an unreferenced connect task can be collected mid-flight.
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------------------------------------------------
    # Life cycle (any thread)

    def start(self, wait: float = 10.0) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="torchras-rasd", daemon=True)
        self._thread.start()
        self._ready.wait(wait)

    def stop(self, timeout: float = 3.0, goodbye: bool = True) -> None:
        """Leave the mesh (peers record LEFT, not DEAD) and end the thread. Idempotent; never raises.
        ``goodbye=False`` just closes every socket, as a crash would: peers record DEAD at once."""
        loop = self.loop
        if loop is None or self._stopped.is_set() or not loop.is_running():
            return
        done = threading.Event()

        def _leave() -> None:
            try:
                if goodbye:
                    self._carry_out(self.node.leave(time.monotonic()))
                else:
                    for proto in list(self._transports.values()):
                        if proto.transport is not None:
                            proto.transport.abort()
            except Exception:  # pragma: no cover - defensive
                log.exception("rasd: error while leaving")
            for fn in self.on_stop:
                self._guard(fn)
            loop.call_later(STOP_DRAIN_S, _end)

        def _end() -> None:
            loop.stop()
            done.set()

        try:
            loop.call_soon_threadsafe(_leave)
        except RuntimeError:
            return
        done.wait(timeout)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopped.is_set()

    @property
    def peer(self) -> PeerInfo:
        """This process as the mesh knows it: address, pid, incarnation, rank."""
        return self.node.me

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in the RAS thread."""
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._guard, fn)
            except RuntimeError:
                pass

    def submit(self, step: Callable[[core.Node, float], list[core.Action]]) -> None:
        """Give the node an input from any thread: ``step(node, now)`` runs on the RAS thread, and the runtime
        carries out the actions it returns."""
        self.call(lambda: self.feed(lambda now: step(self.node, now)))

    def gather(
        self, done: Callable[[JobSnapshot], None], timeout: float | None = None, ask: wire.Ask = wire.Ask.STATUS
    ) -> None:
        """Start a gather of ``ask`` (from the RAS thread); ``done`` is called in the RAS thread with the
        snapshot."""
        qid = self._next_query
        self._next_query += 1
        metrics = self.metrics
        if metrics is not None:
            done = _timed(done, metrics.gather_done)
        self._gather_waiters[qid] = done
        self.feed(lambda now: self.node.start_gather(qid, now, timeout, ask))

    # ------------------------------------------------------------------------------------------------------------
    # The thread

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        try:
            loop.run_until_complete(self._open())
        except BaseException as e:  # noqa: BLE001 - the thread must not die loudly
            self.start_error = e
            what = str(e) if isinstance(e, StartError) else f"could not start the RAS node ({type(e).__name__}: {e})"
            log.warning("rasd: %s; this process runs without RAS", what)
            self._abandon_start(loop)
            return
        self._ready.set()
        try:
            loop.run_forever()
        except BaseException:  # pragma: no cover - defensive
            log.exception("rasd: the RAS loop ended with an error")
        finally:
            self._stopped.set()
            for proto in list(self._transports.values()):
                if proto.transport is not None:
                    proto.transport.abort()
            if self._server is not None:
                self._server.close()
            pending = [t for t in self._tasks if not t.done()]
            for task in pending:
                task.cancel()
            try:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(asyncio.sleep(0))
            except Exception:  # noqa: BLE001 - the thread is ending: nothing left to tell anyone
                pass
            loop.close()

    def _abandon_start(self, loop: asyncio.AbstractEventLoop) -> None:
        """A start that failed half way leaves nothing behind: no listening socket, no client port, no endpoint
        file (docs/operations.md §2)."""
        for fn in self.on_stop:
            self._guard(fn)
        for proto in list(self._transports.values()):
            if proto.transport is not None:
                proto.transport.abort()
        if self._server is not None:
            self._server.close()
        try:
            loop.run_until_complete(asyncio.sleep(0))
            loop.run_until_complete(loop.shutdown_default_executor())
        except Exception:  # noqa: BLE001 - best effort: the store call that failed may still block its thread
            pass
        loop.close()
        self._stopped.set()
        self._ready.set()  # last: ``start`` returns to a runtime that holds nothing any more

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        port = mesh_port()
        try:
            self._server = await loop.create_server(
                lambda: _MeshProtocol(self, None), host=self._host, port=port, backlog=1024
            )
        except OSError as e:
            settings = [
                name
                for name, used in (
                    ("TORCHRAS_MESH_HOST", os.environ.get("TORCHRAS_MESH_HOST")),
                    ("TORCHRAS_MESH_PORT", port),
                )
                if used
            ]
            because = f", set by {' and '.join(settings)}" if settings else ""
            reason = os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else (e.strerror or str(e))
            raise StartError(f"cannot listen for the mesh on {self._host}:{port}{because} ({reason})") from e
        for sock in self._server.sockets:
            self._fds.add(sock.fileno())
        port = self._server.sockets[0].getsockname()[1]
        # The store calls block: they run beside the loop, so the mesh port accepts meanwhile.
        if self._secret is None:
            try:
                self._secret = (
                    await loop.run_in_executor(None, self._bootstrap.secret) if self._bootstrap else os.urandom(32)
                )
            except Exception as e:
                raise StartError(f"could not read the job's secret from the store ({type(e).__name__}: {e})") from e
        self.node = core.Node(
            self._info_factory(port), self._secret, self.timers, rng=random.SystemRandom(), local_data=self._local_data
        )
        node = self.node
        node.answers[wire.Ask.DIAGNOSTICS] = configuration.provider(node.me)
        seen, comms = functools.partial(last_seen, node), functools.partial(comm_records, node)
        node.answers[wire.Ask.STACKS] = thread_stacks.provider(node.me, False, seen, comms)
        node.answers[wire.Ask.STACKS_ALL] = thread_stacks.provider(node.me, True, seen, comms)
        node.where = thread_stacks.main_position
        node.work_sample = work.WorkCounters()
        node.declared_phase = work.declared_phase
        self._carry_out(self.node.start(time.monotonic()))
        self._schedule_tick()
        for service in self._services:
            await service(self)
        if self._bootstrap is not None:
            try:
                seeds = await loop.run_in_executor(None, self._bootstrap.seeds, self.node.me)
            except Exception as e:
                raise StartError(f"could not join the job through the store ({type(e).__name__}: {e})") from e
            self._carry_out(self.node.add_peers(seeds, time.monotonic(), introduce=True))
        # The store is read once: from here on gossip keeps the table, so the mesh outlives whoever hosts the store
        # (docs/architecture.md), and the node keeps no reference to it (nor the executor's thread) once joined.
        self._bootstrap = None
        await loop.shutdown_default_executor()

    def _schedule_tick(self) -> None:
        assert self.loop is not None
        self._tick_handle = self.loop.call_later(self.timers.tick, self._on_tick)

    def _on_tick(self) -> None:
        self.feed(lambda now: self.node.tick(now))
        self._schedule_tick()

    # ------------------------------------------------------------------------------------------------------------
    # Inputs and actions (RAS thread)

    def _guard(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:
            log.exception("rasd: internal error (ignored)")

    def feed(self, step: Callable[[float], list[core.Action]]) -> None:
        """Give the node an input on the RAS thread: ``step(now)`` returns the actions to carry out."""
        try:
            self._carry_out(step(time.monotonic()))
        except Exception:
            log.exception("rasd: internal error (ignored)")

    def _carry_out(self, actions: list[core.Action]) -> None:
        for a in actions:
            try:
                self._act(a)
            except Exception:
                log.exception("rasd: could not carry out %s", type(a).__name__)

    def _act(self, a: core.Action) -> None:
        if isinstance(a, core.Send):
            proto = self._transports.get(a.conn_id)
            if proto is None or proto.transport is None or proto.transport.is_closing():
                return
            if proto.transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
                log.info("rasd: %s is not reading; dropping the connection", proto.transport.get_extra_info("peername"))
                proto.transport.abort()
                return
            proto.transport.write(a.data)
            if self.metrics is not None:
                self.metrics.sent(a.data)
        elif isinstance(a, core.Close):
            proto = self._transports.pop(a.conn_id, None)
            if proto is not None and proto.transport is not None:
                proto.transport.close()
        elif isinstance(a, core.Connect):
            assert self.loop is not None
            task = self.loop.create_task(self._connect(a))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(a, core.Emit):
            self._emit(a.event)
        elif isinstance(a, core.ProbePid):
            if not pid_running(a.pid):
                self.feed(lambda now: self.node.pid_gone(a.addr, now))
        elif isinstance(a, core.GatherDone):
            done = self._gather_waiters.pop(a.query_id, None)
            if done is not None:
                done(a.snapshot)
        else:  # an action this driver does not know: a wiring mistake, logged by the caller, never silent
            raise TypeError(f"the driver has no handler for the action {type(a).__name__}")

    async def _connect(self, a: core.Connect) -> None:
        loop = asyncio.get_running_loop()
        proto = _MeshProtocol(self, a.conn_id)
        self._transports[a.conn_id] = proto
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: proto, a.addr.host, a.addr.port), self.timers.handshake
            )
        except ConnectionRefusedError:
            log.debug("rasd: connect to %s refused", a.addr)
            self._connect_failed(a.conn_id, refused=True)
        except (OSError, asyncio.TimeoutError) as e:
            log.debug("rasd: connect to %s failed: %r", a.addr, e)
            self._connect_failed(a.conn_id, refused=False)
        else:
            if a.conn_id not in self._transports:  # the node gave up on it meanwhile
                assert proto.transport is not None
                proto.transport.close()
                return
            self.feed(lambda now: self.node.connected(a.conn_id, now))

    def _connect_failed(self, conn_id: int, refused: bool) -> None:
        if self._transports.pop(conn_id, None) is not None:
            self.feed(lambda now: self.node.connect_failed(conn_id, now, refused))

    def _emit(self, event: Event) -> None:
        level = (
            logging.WARNING
            if event.kind in (Kind.PEER_DEAD, Kind.PEER_HUNG, Kind.COMM_STUCK)
            else (
                logging.INFO
                if event.kind
                in (
                    Kind.PEER_LEFT,
                    Kind.PEER_UNRESPONSIVE,
                    Kind.PEER_RECOVERED,
                    Kind.COMM_SLOW,
                    Kind.COMM_RECOVERED,
                    Kind.RESTART,
                )
                else logging.DEBUG
            )
        )
        if log.isEnabledFor(level):
            who = event.peer.describe() if event.peer else (str(event.addr) if event.addr else "")
            log.log(level, "rasd: %s %s %s", event.kind, who, event.details)
        for listener in self.event_listeners:
            self._guard(functools.partial(listener, event))
        self.subscribers.publish(event)

    def accepted(self, proto: _MeshProtocol) -> int:
        """A peer connected to the mesh port: the connection's id, given to the node."""
        cid = self._next_accept
        self._next_accept -= 1
        self._transports[cid] = proto
        self.feed(lambda now: self.node.accepted(cid, now))
        return cid

    def lost(self, conn_id: int | None) -> None:
        """A mesh connection closed (either side): the node hears of it unless it closed it itself."""
        if conn_id is not None and self._transports.pop(conn_id, None) is not None:
            self.feed(lambda now: self.node.closed(conn_id, now))

    def own_socket(self, sock: socket.socket) -> None:
        """Count ``sock`` among the node's sockets (``owned_fds``; closed in a forked child)."""
        if sock.fileno() >= 0:
            self._fds.add(sock.fileno())

    def own_transport(self, transport: asyncio.BaseTransport) -> None:
        """Count a connection's socket among the node's sockets, while it is open."""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.own_socket(sock)

    def disown_transport(self, transport: asyncio.BaseTransport | None) -> None:
        """The connection closed: its file descriptor is no longer the node's (the number may be reused)."""
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None and sock.fileno() >= 0:
            self._fds.discard(sock.fileno())

    def owned_fds(self) -> set[int]:
        """The file descriptors of every socket this node holds (mesh, client port): code that tears down a
        process's connections (inprocess's gloo abort) leaves these alone."""
        return set(self._fds)

    def close_fds_in_child(self) -> None:
        """After a fork, in the child: close our copy of every socket, so the child neither answers for the
        parent nor keeps its connections open once the parent is gone."""
        for fd in list(self._fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()


def _timed(done: Callable[[JobSnapshot], None], seconds: Callable[[float], None]) -> Callable[[JobSnapshot], None]:
    """``done``, after telling ``seconds`` how long since now."""
    began = time.monotonic()

    def timed(snapshot: JobSnapshot) -> None:
        seconds(time.monotonic() - began)
        done(snapshot)

    return timed


class StartError(Exception):
    """The node cannot start; the message says what was wrong, for the one log line."""


def pid_running(pid: int) -> bool:
    """Whether ``pid`` is a running process. A zombie (exited, not yet reaped by its parent) is not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def mesh_port() -> int:
    """The mesh port: ``TORCHRAS_MESH_PORT`` (a firewall that opens one port per process), else 0, the kernel's
    choice. A process restarted on its predecessor's port is a new peer (docs/architecture.md section 2.6)."""
    text = os.environ.get("TORCHRAS_MESH_PORT", "").strip()
    try:
        port = int(text) if text else 0
    except ValueError:
        log.warning("rasd: TORCHRAS_MESH_PORT=%r is not a port number; the kernel picks one", text)
        return 0
    if not 0 <= port <= 65535:
        log.warning("rasd: TORCHRAS_MESH_PORT=%r is out of range; the kernel picks one", text)
        return 0
    return port


def mesh_host(target: str | None = None) -> str:
    """The local IP to listen on: ``TORCHRAS_MESH_HOST``, else the address this host uses to reach ``target``
    (the store's host), else loopback."""
    explicit = os.environ.get("TORCHRAS_MESH_HOST", "").strip()
    if explicit:
        try:
            return str(ipaddress.ip_address(explicit.strip("[]")))
        except ValueError:
            log.warning(
                "rasd: TORCHRAS_MESH_HOST=%r is not an IP address; the mesh listens on the address this "
                "host uses to reach the store",
                explicit,
            )
    if target:
        try:
            family = socket.AF_INET6 if ":" in target else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))  # UDP connect sends nothing; it only picks a route
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"
