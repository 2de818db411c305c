"""Prometheus metrics of one process's RAS node, over HTTP (``TORCHRAS_METRICS_ADDR``; off by default).

One job: publish what the RAS thread knows, render it, and have it served from outside this interpreter. The RAS
thread owns every value: it counts mesh traffic, events, gathers and STATUS replies, and publishes an immutable
``Published`` snapshot once per tick and soon after each event. It also renders: ``prometheus_client``'s
exposition of the snapshot, in each format a scrape asked for (``ExpositionWriter``), written whole to a file on tmpfs
after a publication that an event or a scrape asked for, never more than the snapshots it publishes.

The HTTP is another process's: ``python -m rasd.services.metrics_server`` (``Server``), started with ``subprocess`` (a
fork without exec would copy the training threads' locks mid-use), at nice 19, on a listening socket bound here.
It answers scrapes from the file and, over a socket pair, asks the RAS thread for a render when the file is more
than ``metrics_server.FRESH_S`` old. Served from threads of this process, each scrape cost the training process
interpreter time under its GIL (392 scrapes a second slowed a saturated 2-core loop by 18 %, bench/README.md
"Scraping the metrics"); served from there, a scrape costs this process nothing, and scraping at any rate costs at
most one render a second. A scrape never runs on the RAS thread, never enters the asyncio loop, and never starts a
gather. What a scrape shows is this process's view (its peer table, its verdicts, its communicators), never the
job gathered. The server process ends with the metrics (``Endpoint.stop``: the node stops) and with this process
(the socket pair closes, Linux's parent-death signal, a check of its parent every second), and removes the file.

Where (docs/operations.md, "Metrics and alerts"): ``host:port`` or ``[ipv6]:port`` (``:port`` for every IPv4
interface). One scrape target per process: with ``LOCAL_RANK`` set (torchrun, ``rasd launch``, ``rasd swarm``
members) a non-zero port is ``port + LOCAL_RANK``, the per-rank ports Prometheus users of torchrun configure;
port 0 lets the kernel pick one, logged at INFO and given by ``RasHandle.metrics_address``. A value that is not an
address, or a port that cannot be bound, is one WARNING line, and the process serves no metrics; so is a server
process that cannot start or ends, and a file that cannot be written: nothing here raises into the node, let alone
training.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rasd.core.comms import OP_TYPES
from rasd.core.events import Event, Kind
from rasd.net.traffic import FrameCounter, count_frames
from rasd.report.model import is_error_code, rank_status

if TYPE_CHECKING:
    from rasd.net.runtime import Runtime

log = logging.getLogger("rasd")

ENV = "TORCHRAS_METRICS_ADDR"
#: The verdicts counted by ``torchras_verdicts_total`` (docs/architecture.md §7), every one exported from 0.
VERDICTS = (Kind.PEER_DEAD, Kind.PEER_HUNG, Kind.PEER_LEFT, Kind.COMM_STUCK, Kind.COMM_SLOW)
#: The states of ``torchras_mesh_peers``, in the order a peer is counted (the first that holds).
PEER_STATES = ("dead", "left", "hung", "unresponsive", "alive")
#: The statuses of ``torchras_communicators``: the report's rank status, or ERROR for an init or async error.
COMM_STATUSES = ("INIT", "RUNNING", "FINALIZE", "ABORT", "ERROR")
#: Histogram buckets (seconds) of gathers and STATUS replies: a healthy gather takes milliseconds, one with a
#: silent leg its leg timeout (5 s x factor), the hard limit 10 s.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: How often the communicators are read (``local_data``: with torch, the hooks' snapshot and records).
COMMS_EVERY_S = 1.0
#: The most formats rendered for the server (content types its scrapes' Accept headers chose): the text format,
#: Prometheus 3's OpenMetrics, Prometheus 2's, and one more.
MAX_FORMATS = 4
#: How long closing waits for the server process to end (it is killed: at once, unless the machine is stalled).
STOP_WAIT_S = 2.0


# ----------------------------------------------------------------------------------------------------------------
# The setting


def metrics_address(environ: Mapping[str, str], warn: Callable[[str], None]) -> tuple[str, int, str] | None:
    """Where to serve: (host, port, how the port was chosen), or None when off or unusable (``warn`` says why)."""
    spec = environ.get(ENV, "").strip()
    if not spec or spec.lower() in ("off", "none", "0"):
        return None
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else "x"
    else:
        host, _, port_text = spec.rpartition(":")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535 or (spec.startswith("[") and not host):
        warn(f"{ENV}={spec!r} is not host:port, [ipv6]:port or :port; this process serves no metrics")
        return None
    port = int(port_text)
    host = host or "0.0.0.0"
    how = f"set by {ENV}"
    if port:
        local = environ.get("LOCAL_RANK", "").strip()
        if local.isdigit() and int(local) > 0:
            if port + int(local) > 65535:
                warn(f"{ENV}={spec!r} plus LOCAL_RANK {local} is past port 65535; this process serves no metrics")
                return None
            port += int(local)
            how = f"{ENV} plus LOCAL_RANK {local}"
    return host, port, how


# ----------------------------------------------------------------------------------------------------------------
# What the RAS thread owns


class _Histogram:
    """Bucket counts (not cumulative), sum and count; written by the RAS thread only."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        while i < len(BUCKETS) and seconds > BUCKETS[i]:
            i += 1
        self.counts[i] += 1
        self.sum += seconds

    def frozen(self) -> tuple[tuple[int, ...], float]:
        return tuple(self.counts), self.sum


@dataclass(frozen=True)
class Published:
    """What the RAS thread last published; the collector renders nothing else of the node."""

    at: float = 0.0  # monotonic time of publication
    peers: tuple[int, ...] = (0,) * len(PEER_STATES)
    stuck: int = 0
    slow: int = 0
    verdicts: tuple[int, ...] = (0,) * len(VERDICTS)
    restarts: int = 0
    restart_iteration: int = 0
    lost_seconds: float = 0.0
    statuses: tuple[int, ...] = (0,) * len(COMM_STATUSES)
    #: (communicator hash as 16 hex digits, op type, launched, completed), op types that counted anything.
    collectives: tuple[tuple[str, str, int, int], ...] = ()
    #: (communicator, seconds its counts had not moved when read), and when they were read.
    idle: tuple[tuple[str, float], ...] = ()
    comms_at: float = 0.0
    gather: tuple[tuple[int, ...], float] = ((0,) * (len(BUCKETS) + 1), 0.0)
    status: tuple[tuple[int, ...], float] = ((0,) * (len(BUCKETS) + 1), 0.0)
    cpu_seconds: float = 0.0
    info: tuple[tuple[str, str], ...] = ()


class Metrics:
    """The RAS thread's side: counters and the published snapshot. ``runtime.metrics`` while metrics are served."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Mesh traffic: plain integers, written by the RAS thread and read when it renders.
        self.sent_messages = 0
        self.sent_bytes = 0
        self.received_messages = 0
        self.received_bytes = 0
        self._verdicts = dict.fromkeys(VERDICTS, 0)
        self._lost = 0.0
        self._gather = _Histogram()
        self._status = _Histogram()
        self._comms: tuple[Any, ...] = ((), (0,) * len(COMM_STATUSES), (), 0.0)
        self._comms_read = float("-inf")
        self._publish_pending = False
        self._render_next = False
        #: Renders and writes the exposition (``Endpoint.render``): after a publication an event or a scrape asked for.
        self.on_render: Callable[[], None] | None = None
        self.published = Published()

    # Hooks (RAS thread)

    def sent(self, data: bytes) -> None:
        self.sent_messages += count_frames(data)
        self.sent_bytes += len(data)

    def received(self, frames: FrameCounter, data: bytes) -> None:
        self.received_messages += frames.feed(data)
        self.received_bytes += len(data)

    def gather_done(self, seconds: float) -> None:
        self._gather.observe(seconds)
        self.soon()

    def status_done(self, seconds: float) -> None:
        self._status.observe(seconds)
        self.soon()

    def on_event(self, event: Event) -> None:
        if event.kind in self._verdicts:
            self._verdicts[event.kind] += 1
        elif event.kind is Kind.RESTART and event.restart is not None:
            self._lost += max(0.0, event.restart.seconds_lost)
        self.soon()

    def soon(self) -> None:
        """Publish and render once the RAS thread has finished what it is doing (a burst of events, or of scrapes
        asking, is one publication)."""
        self._render_next = True
        loop = self.runtime.loop
        if not self._publish_pending and loop is not None:
            self._publish_pending = True
            loop.call_soon(self.publish)

    # Publication (RAS thread)

    def publish(self) -> None:
        """Publish a snapshot (every tick), and render it when ``soon`` asked (an event, or a scrape found no fresh
        render): nobody scraping, nothing is rendered."""
        self._publish_pending = False
        try:
            self._publish()
        except Exception:
            log.exception("rasd: could not publish the metrics (ignored)")
        if self._render_next and self.on_render is not None:
            self._render_next = False
            self.on_render()

    def _publish(self) -> None:
        node = self.runtime.node
        now = time.monotonic()
        if now - self._comms_read >= COMMS_EVERY_S:
            self._comms_read = now
            self._comms = (*_communicators(node.local_data()), now)
        collectives, statuses, idle, comms_at = self._comms
        restart = node.restart
        self.published = Published(
            at=now,
            peers=_peer_states(node),
            stuck=sum(not v.slow for v in node.standing_stuck().values()),
            slow=sum(v.slow for v in node.standing_stuck().values()),
            verdicts=tuple(self._verdicts[k] for k in VERDICTS),
            restarts=restart.restarts if restart is not None else 0,
            restart_iteration=restart.iteration if restart is not None else 0,
            lost_seconds=self._lost,
            statuses=statuses,
            collectives=collectives,
            idle=idle,
            comms_at=comms_at,
            gather=self._gather.frozen(),
            status=self._status.frozen(),
            cpu_seconds=time.thread_time(),
            info=(
                ("rank", str(node.me.rank)),
                ("pid", str(node.me.pid)),
                ("mesh_addr", f"{node.me.addr.host}:{node.me.addr.port}"),
            ),
        )


def _peer_states(node: Any) -> tuple[int, ...]:
    """This node's peers by state (``PEER_STATES``), itself included, without walking the table: the dead, departed
    and hung sets and the linked contacts are small."""
    table = node.table
    dead = {k.addr for k in node.dead if table.is_current(k)}
    left = {k.addr for k in node.left if table.is_current(k)} - dead
    hung = {k.addr for k in node.hung if table.is_current(k)} - dead - left
    unresponsive = {a for a in node.contacts if node.is_unresponsive(a) and a in table} - dead - left - hung
    alive = len(table) - len(dead) - len(left) - len(hung) - len(unresponsive)
    return len(dead), len(left), len(hung), len(unresponsive), max(0, alive)


def _communicators(data: Any) -> tuple[tuple[tuple[str, str, int, int], ...], tuple[int, ...], tuple[Any, ...]]:
    """(collectives, statuses, idle) of this process's communicators, from its contribution to a gather."""
    statuses = [0] * len(COMM_STATUSES)
    counts: dict[tuple[str, int], list[int]] = {}
    idle: dict[str, float] = {}
    for comm in data.comms:
        name = f"{comm.comm_hash & 0xFFFFFFFFFFFFFFFF:016x}"
        for r in comm.ranks:
            errored = is_error_code(r.init_state) or is_error_code(r.async_error)
            statuses[COMM_STATUSES.index("ERROR" if errored else rank_status(r).name)] += 1
            for op, (launched, completed) in enumerate(zip(r.launched, r.completed, strict=True)):
                if launched or completed:
                    total = counts.setdefault((name, op), [0, 0])
                    total[0] += launched
                    total[1] += completed
            idle[name] = min(idle.get(name, float("inf")), r.idle_ms / 1000)
    collectives = tuple((name, OP_TYPES[op], a, b) for (name, op), (a, b) in sorted(counts.items()))
    return collectives, tuple(statuses), tuple(sorted(idle.items()))


# ----------------------------------------------------------------------------------------------------------------
# The rendering (RAS thread): reads ``Metrics.published`` and the traffic integers, nothing else


class PrometheusCollector:
    """A ``prometheus_client`` collector over one node's published metrics."""

    def __init__(self, metrics: Metrics, job_id: str) -> None:
        self.metrics = metrics
        self.job_id = job_id

    def describe(self) -> list[Any]:
        return []  # unchecked registration: the families are built at each scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        m = self.metrics
        p = m.published  # one reference read: every value below comes from the same publication
        now = time.monotonic()

        def gauge(name: str, doc: str, labels: list[str] | None = None) -> Any:
            return GaugeMetricFamily(name, doc, labels=labels)

        info = gauge("torchras_node_info", "This process's RAS node (value 1).", ["job_id", "rank", "pid", "mesh_addr"])
        values = dict(p.info)
        info.add_metric([self.job_id, values.get("rank", ""), values.get("pid", ""), values.get("mesh_addr", "")], 1)
        yield info
        peers = gauge(
            "torchras_mesh_peers", "Processes of the job by state, as this node sees them (itself included).", ["state"]
        )
        for state, n in zip(PEER_STATES, p.peers, strict=True):
            peers.add_metric([state], n)
        yield peers
        yield GaugeMetricFamily(
            "torchras_communicators_stuck", "COMM_STUCK verdicts this node holds now (job-wide).", value=p.stuck
        )
        yield GaugeMetricFamily(
            "torchras_communicators_slow",
            "Communicators held by ranks behind that work or are in a declared phase (SLOW: no restart), as this node "
            "holds them now (job-wide).",
            value=p.slow,
        )
        verdicts = CounterMetricFamily(
            "torchras_verdicts_total",
            "Verdicts this node emitted, by kind (from its events; COMM_SLOW: a communicator found SLOW, no restart).",
            labels=["kind"],
        )
        for kind, n in zip(VERDICTS, p.verdicts, strict=True):
            verdicts.add_metric([kind.value], n)
        yield verdicts
        yield CounterMetricFamily("torchras_restarts_total", "In-process restarts of this process.", value=p.restarts)
        yield CounterMetricFamily(
            "torchras_restart_lost_seconds_total",
            "Seconds of training lost to this process's in-process restarts.",
            value=p.lost_seconds,
        )
        yield GaugeMetricFamily(
            "torchras_restart_iteration", "The restart iteration this process runs.", value=p.restart_iteration
        )
        statuses = gauge("torchras_communicators", "This process's communicator ranks by status.", ["status"])
        for status, n in zip(COMM_STATUSES, p.statuses, strict=True):
            statuses.add_metric([status], n)
        yield statuses
        launched = CounterMetricFamily(
            "torchras_collectives_launched_total",
            "Collectives this process launched, per communicator and op type.",
            labels=["comm", "op"],
        )
        completed = CounterMetricFamily(
            "torchras_collectives_completed_total",
            "Collectives this process completed, per communicator and op type.",
            labels=["comm", "op"],
        )
        for comm, op, a, b in p.collectives:
            launched.add_metric([comm, op], a)
            completed.add_metric([comm, op], b)
        yield launched
        yield completed
        idle = gauge(
            "torchras_communicator_idle_seconds",
            "Seconds since this process's counts of the communicator last moved.",
            ["comm"],
        )
        for comm, seconds in p.idle:
            idle.add_metric([comm], seconds + max(0.0, now - p.comms_at))
        yield idle
        for name, doc, (counts, total) in (
            ("torchras_gather_duration_seconds", "Status gathers this node started, until their snapshot.", p.gather),
            (
                "torchras_client_status_duration_seconds",
                "STATUS requests on the client port, from the request to the end of the report.",
                p.status,
            ),
        ):
            cumulative, buckets = 0, []
            for le, n in zip((*BUCKETS, float("inf")), counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if le == float("inf") else repr(le), cumulative))
            yield HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)
        for name, doc, value in (
            ("torchras_mesh_sent_messages_total", "Mesh messages (frames) this node sent.", m.sent_messages),
            (
                "torchras_mesh_received_messages_total",
                "Mesh messages (frames) this node received.",
                m.received_messages,
            ),
            ("torchras_mesh_sent_bytes_total", "Bytes this node sent on mesh connections.", m.sent_bytes),
            ("torchras_mesh_received_bytes_total", "Bytes this node received on mesh connections.", m.received_bytes),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        yield CounterMetricFamily(
            "torchras_ras_thread_cpu_seconds_total", "CPU seconds the RAS thread has used.", value=p.cpu_seconds
        )


# ----------------------------------------------------------------------------------------------------------------
# The exposition (RAS thread): rendered for the server process, written whole to a file it reads


def exposition_directory() -> str:
    """tmpfs where there is one (``/dev/shm``): a write there never waits on a disk."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else tempfile.gettempdir()


class ExpositionWriter:
    """The registry rendered in every format the server asked for, and the file it is written to
    (``metrics_server.encode``; a temporary file, then ``os.replace``, so the server never reads half a file)."""

    def __init__(self, registry: Any, directory: str | None = None) -> None:
        from prometheus_client.exposition import generate_latest

        from . import metrics_server  # here, not above: ``python -m`` would find the server imported by rasd

        self.registry = registry
        name = f"torchras-metrics-{os.getpid()}-{secrets.token_hex(4)}"
        self.path = os.path.join(directory or exposition_directory(), name)
        #: content type -> encoder: the text format always, the others once a scrape's Accept header chose them.
        self.encoders: dict[str, Callable[[Any], bytes]] = {metrics_server.TEXT: generate_latest}

    def want(self, accept: str) -> None:
        """Render, from now on, the format ``prometheus_client`` chooses for ``accept`` (at most ``MAX_FORMATS``:
        the versions and escapings a client can name are many, the formats real scrapers use one or two)."""
        from prometheus_client.exposition import choose_encoder

        try:
            encoder, content_type = choose_encoder(accept)
        except Exception:  # noqa: BLE001 - a malformed header: the server answers it with the text format
            return
        if content_type not in self.encoders and len(self.encoders) < MAX_FORMATS:
            self.encoders[content_type] = encoder

    def write(self) -> None:
        """Render every format and replace the file with them. Raises OSError (or a collector's error)."""
        from . import metrics_server

        rendered_at = time.monotonic()
        bodies = {}
        for content_type, encode in list(self.encoders.items()):
            try:
                bodies[content_type] = encode(self.registry)
            except Exception:
                if content_type == metrics_server.TEXT:
                    raise
                del self.encoders[content_type]  # a format a client named that cannot render these metrics
        data = metrics_server.encode(rendered_at, bodies)
        temporary = self.path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temporary, self.path)

    def remove(self) -> None:
        for path in (self.path, self.path + ".tmp"):
            try:
                os.unlink(path)
            except OSError:
                pass


# ----------------------------------------------------------------------------------------------------------------
# The server process: started, watched and stopped from the RAS thread


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) and listening, for the server process. Raises OSError."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # localhost: 127.0.0.1 first, as scrapers dial it
    family, sockaddr = infos[0][0], infos[0][4]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(128)  # a burst of scrapes waits here while the server starts or is busy
    except BaseException:
        sock.close()
        raise
    return sock


class Server:
    """The HTTP endpoint: ``python -m rasd.services.metrics_server`` on ``sock`` (its own copy: the caller closes this
    one), serving the file at ``path``. A socket pair joins the two: ``on_request(accept)`` is called on the RAS
    thread for each render it asks for, ``rendered`` tells it of each render, and ``on_gone()`` is called once if it
    ends before ``close``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        path: str,
        on_request: Callable[[str], None],
        on_gone: Callable[[], None],
    ) -> None:
        self.loop = loop
        self.on_request = on_request
        self.on_gone = on_gone
        channel, theirs = socket.socketpair()
        root = str(Path(__file__).resolve().parents[2])  # where this rasd is: the server imports the same one
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        try:
            # A fork without exec would copy the training process's threads' locks mid-use; Popen execs at once.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rasd.services.metrics_server", "--listen-fd", str(sock.fileno())]
                + ["--file", path, "--channel-fd", str(theirs.fileno()), "--parent", str(os.getpid())],
                pass_fds=(sock.fileno(), theirs.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # stderr stays the training process's: a traceback lands in its log
                cwd=root,
                env=env,
                start_new_session=True,  # a SIGKILL to this process's group leaves it to remove the file
            )
        except BaseException:
            channel.close()
            raise
        finally:
            theirs.close()  # the server's alone: its exit is the end of the channel here
        channel.setblocking(False)
        self.channel: socket.socket | None = channel
        self._partial = b""
        self._closed = False
        loop.add_reader(channel.fileno(), self._readable)

    def rendered(self) -> None:
        """Tell the server that the file holds a new render (scrapes may be waiting for it)."""
        if self.channel is not None:
            try:
                self.channel.send(b"\n")
            except OSError:
                pass  # full (the server reads it soon), or the server is gone (the reader hears of it)

    def _readable(self) -> None:
        if self.channel is None:
            return
        try:
            data = self.channel.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the server ended
            self._stop_reading()
            if not self._closed:
                self.on_gone()
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > 65536:
            self._partial = b""  # not a line the server writes
        for line in lines:
            self.on_request(line.decode("latin-1"))

    def _stop_reading(self) -> None:
        if self.channel is not None:
            try:
                self.loop.remove_reader(self.channel.fileno())
            except Exception:  # noqa: BLE001 - a loop already closed: nothing reads it any more
                pass
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        """End the server process and wait for it (at most ``STOP_WAIT_S``): when this returns its port is free."""
        if self._closed:
            return
        self._closed = True
        self._stop_reading()
        if self.process.poll() is None:
            self.process.kill()  # it holds nothing to save: the file is the caller's to remove
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            pass


# ----------------------------------------------------------------------------------------------------------------
# The runtime service


class Endpoint:
    """One process's metrics while they are served: the counters, the exposition, the server process and the tick.
    Everything here runs on the RAS thread."""

    def __init__(self, runtime: Runtime, metrics: Metrics, exposition: ExpositionWriter) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self.exposition = exposition
        self.server: Server | None = None
        self.address: tuple[str, int] | None = None
        self.stopped = False
        self._timer: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, address: tuple[str, int]) -> None:
        self.metrics.publish()
        self.exposition.write()  # the file is there before the server reads it
        self.server = Server(loop, sock, self.exposition.path, self.wanted, self.gone)
        self.address = address
        runtime, metrics = self.runtime, self.metrics
        runtime.metrics = metrics
        runtime.metrics_address = self.address
        runtime.event_listeners.append(metrics.on_event)
        runtime.on_stop.append(self.stop)
        metrics.on_render = self.render
        self._timer = loop.call_later(runtime.timers.tick, self.tick)

    def tick(self) -> None:
        self.metrics.publish()
        if not self.stopped and self.runtime.loop is not None:
            self._timer = self.runtime.loop.call_later(self.runtime.timers.tick, self.tick)

    def render(self) -> None:
        try:
            self.exposition.write()
        except Exception as e:  # noqa: BLE001 - a full tmpfs, a collector's bug: the metrics stop, not the node
            self.fail(f"cannot write the metrics to {self.exposition.path} ({_why(e)})")
            return
        if self.server is not None:
            self.server.rendered()

    def wanted(self, accept: str) -> None:
        """The server asks for a render (a scrape found none fresh, or not in its format)."""
        self.exposition.want(accept)
        self.metrics.soon()

    def gone(self) -> None:
        """The server process ended on its own: stop (which reaps it), then say how it ended."""
        if self.stopped or self.server is None:
            return
        self.stop()
        process = self.server.process
        code = f" with code {process.returncode}" if process.returncode else ""
        log.warning("rasd: the metrics server (pid %d) ended%s; this process serves no metrics", process.pid, code)

    def fail(self, what: str) -> None:
        if not self.stopped:
            log.warning("rasd: %s; this process serves no metrics", what)
            self.stop()

    def stop(self) -> None:
        """Stop serving (the node stops, or a failure): the server process ended, its port free, the file gone."""
        if self.stopped:
            return
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self.metrics.on_render = None
        if self.server is not None:
            self.server.close()
        self.exposition.remove()
        runtime = self.runtime  # last: no metrics_address while a server may still answer on it
        if runtime.metrics is self.metrics:
            runtime.metrics = None
            runtime.metrics_address = None
        if self.metrics.on_event in runtime.event_listeners:
            runtime.event_listeners.remove(self.metrics.on_event)


async def serve(runtime: Runtime) -> None:
    """A runtime service (``rasd.start`` adds it to every node): serve metrics where ``TORCHRAS_METRICS_ADDR`` says,
    or do nothing. Never raises; a failure later (the file cannot be written, the server process ended) is one
    WARNING, and the metrics stop while the node runs on."""
    try:
        address = metrics_address(os.environ, lambda problem: log.warning("rasd: %s", problem))
        if address is None:
            return
        host, port, how = address
        from prometheus_client import CollectorRegistry
        from prometheus_client.process_collector import ProcessCollector

        from .client_port import job_id_of

        metrics = Metrics(runtime)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(PrometheusCollector(metrics, job_id_of(runtime.node.secret)))
        ProcessCollector(registry=registry)  # the process_* figures: this process's, read at each render
        try:
            sock = listening_socket(host, port)
        except OSError as e:
            log.warning(
                "rasd: cannot serve metrics at %s:%d, %s (%s); this process serves no metrics", host, port, how, _why(e)
            )
            return
        served = (host, sock.getsockname()[1])
        endpoint = Endpoint(runtime, metrics, ExpositionWriter(registry))
        try:
            endpoint.start(asyncio.get_running_loop(), sock, served)
        except Exception as e:  # noqa: BLE001 - no file or no process: no metrics, the node runs on
            endpoint.stop()
            log.warning("rasd: cannot start the metrics server (%s); this process serves no metrics", _why(e))
            return
        finally:
            sock.close()  # the server's copy serves; this one would keep the port open after the server ended
        log.info("rasd: metrics at http://%s:%d/metrics", _url_host(host), served[1])
    except Exception as e:  # noqa: BLE001 - metrics are an extra, never a reason to stop the node
        log.warning("rasd: cannot serve metrics (%s: %s); this process serves no metrics", type(e).__name__, e)


def _why(e: BaseException) -> str:
    if isinstance(e, OSError):
        return os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else (e.strerror or str(e))
    return f"{type(e).__name__}: {e}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
