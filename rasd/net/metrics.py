"""Prometheus metrics of one process's RAS node, over HTTP (``TORCHRAS_METRICS_ADDR``; off by default).

One job: publish what the RAS thread knows, and serve it. The RAS thread owns every value: it counts mesh traffic,
events, gathers and STATUS replies, and publishes an immutable ``Published`` snapshot by a reference swap once per
tick and soon after each event. The HTTP server runs on threads of its own (``prometheus_client``'s WSGI app
behind a ``ThreadingWSGIServer``), and its collector reads only the published reference and plain integers: a
scrape never waits for the RAS thread, never enters the asyncio loop, and never starts a gather. What a scrape
shows is this process's view (its peer table, its verdicts, its communicators), never the job gathered.

Where (docs/operations.md, "Metrics and alerts"): ``host:port`` or ``[ipv6]:port`` (``:port`` for every IPv4
interface). One scrape target per process: with ``LOCAL_RANK`` set (torchrun, ``rasd launch``, ``rasd swarm``
members) a non-zero port is ``port + LOCAL_RANK``, the per-rank ports Prometheus users of torchrun configure;
port 0 lets the kernel pick one, logged at INFO and given by ``RasHandle.metrics_address``. A value that is not an
address, or a port that cannot be bound, is one WARNING line, and the process serves no metrics: nothing here
raises into the node, let alone training.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rasd.core.comms import OP_TYPES
from rasd.core.events import Event, Kind
from rasd.report.model import is_error_code, rank_status

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("rasd")

ENV = "TORCHRAS_METRICS_ADDR"
#: The verdicts counted by ``torchras_verdicts_total`` (docs/architecture.md §7), every one exported from 0.
VERDICTS = (Kind.PEER_DEAD, Kind.PEER_HUNG, Kind.PEER_LEFT, Kind.COMM_STUCK)
#: The states of ``torchras_mesh_peers``, in the order a peer is counted (the first that holds).
PEER_STATES = ("dead", "left", "hung", "unresponsive", "alive")
#: The statuses of ``torchras_communicators``: the report's rank status, or ERROR for an init or async error.
COMM_STATUSES = ("INIT", "RUNNING", "FINALIZE", "ABORT", "ERROR")
#: Histogram buckets (seconds) of gathers and STATUS replies: a healthy gather takes milliseconds, one with a
#: silent leg its leg timeout (5 s x factor), the hard limit 10 s.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: How often the communicators are read (``local_data``: with torch, the hooks' snapshot and records).
COMMS_EVERY_S = 1.0


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


def count_frames(data: bytes) -> int:
    """Frames in ``data``, which holds whole frames (a ``Send``): ``u32 length`` then that many bytes, repeated."""
    frames = i = 0
    n = len(data)
    while i + 4 <= n:
        i += 4 + int.from_bytes(data[i : i + 4], "big")
        frames += 1
    return frames


class FrameCounter:
    """Counts the frames of one connection's incoming byte stream, which arrives in arbitrary pieces."""

    __slots__ = ("_head", "_need")

    def __init__(self) -> None:
        self._need = 0
        self._head = b""

    def feed(self, data: bytes) -> int:
        frames = i = 0
        n = len(data)
        while i < n:
            if self._need:
                take = min(self._need, n - i)
                self._need -= take
                i += take
                continue
            chunk = data[i : i + 4 - len(self._head)]
            i += len(chunk)
            self._head += chunk
            if len(self._head) == 4:
                self._need = int.from_bytes(self._head, "big")
                self._head = b""
                frames += 1
        return frames


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
    """What the RAS thread last published; the collector reads nothing else of the node."""

    at: float = 0.0  # monotonic time of publication
    peers: tuple[int, ...] = (0,) * len(PEER_STATES)
    stuck: int = 0
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
        # Mesh traffic: plain integers, written by the RAS thread; a scrape reads each one whole (GIL).
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
        """Publish once the RAS thread has finished what it is doing (a burst of events is one publication)."""
        loop = self.runtime.loop
        if not self._publish_pending and loop is not None:
            self._publish_pending = True
            loop.call_soon(self.publish)

    # Publication (RAS thread)

    def publish(self) -> None:
        self._publish_pending = False
        try:
            self._publish()
        except Exception:
            log.exception("rasd: could not publish the metrics (ignored)")

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
            stuck=len(node.standing_stuck()),
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
# The scrape (HTTP server threads): reads ``Metrics.published`` and the traffic integers, nothing else


class Collector:
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
        verdicts = CounterMetricFamily(
            "torchras_verdicts_total", "Verdicts this node emitted, by kind (from its events).", labels=["kind"]
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


def _rendered_once(registry: Any, published: Callable[[], object], other: Any, fresh_s: float = 1.0) -> Any:
    """A WSGI app that renders ``/metrics`` once per snapshot the RAS thread publishes (and at least every
    ``fresh_s``, for the process_* figures), per exposition format, and serves those bytes to every scrape in
    between: a scrape costs the training process an HTTP exchange, not a rendering of every family under the GIL
    (bench/README.md, "Scraping the metrics"). Anything but a GET of /metrics without a query goes to ``other``."""
    from prometheus_client.exposition import choose_encoder

    lock = threading.Lock()  # between the server's own threads; the RAS thread never takes it
    cache: dict[str, tuple[object, float, bytes]] = {}  # content type -> the snapshot rendered, when, the bytes

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics") or environ.get("QUERY_STRING"):
            body: list[bytes] = other(environ, start_response)
            return body
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        with lock:
            now = time.monotonic()
            current = published()
            held = cache.get(content_type)
            if held is None or held[0] is not current or now - held[1] >= fresh_s:
                held = cache[content_type] = (current, now, encoder(registry))
            data = held[2]
        start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(data)))])
        return [data]

    return app


class Server:
    """The HTTP endpoint: ``prometheus_client``'s WSGI app on a threading server of its own."""

    def __init__(self, collector: Collector, host: str, port: int) -> None:
        from wsgiref.simple_server import WSGIRequestHandler

        from prometheus_client import CollectorRegistry, make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer
        from prometheus_client.process_collector import ProcessCollector

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        ProcessCollector(registry=registry)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # localhost: 127.0.0.1 first, as scrapers dial it
        family, sockaddr = infos[0][0], infos[0][4]

        class _Server(ThreadingWSGIServer):
            address_family = family
            request_queue_size = 128  # the listen backlog (socketserver's 5 refuses a burst of scrapes)

        class _Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # the base class names it "format"
                pass

        self.httpd = _Server((str(sockaddr[0]), int(sockaddr[1])), _Quiet)
        self.httpd.set_app(_rendered_once(registry, lambda: collector.metrics.published, make_wsgi_app(registry)))
        self.address: tuple[str, int] = (host, self.httpd.server_address[1])
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="torchras-metrics", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        """Stop serving and free the port (at most a poll interval)."""
        try:
            self.httpd.shutdown()
            self.httpd.server_close()
        except Exception:  # noqa: BLE001 - stopping: nothing left to tell anyone
            pass


# ----------------------------------------------------------------------------------------------------------------
# The runtime service


async def serve(runtime: Runtime) -> None:
    """A runtime service (``rasd.start`` adds it to every node): serve metrics where ``TORCHRAS_METRICS_ADDR`` says,
    or do nothing. Never raises."""
    try:
        address = metrics_address(os.environ, lambda problem: log.warning("rasd: %s", problem))
        if address is None:
            return
        host, port, how = address
        from .client_port import job_id_of

        metrics = Metrics(runtime)
        try:
            server = Server(Collector(metrics, job_id_of(runtime.node.secret)), host, port)
        except OSError as e:
            reason = os.strerror(e.errno) if isinstance(e.errno, int) and e.errno > 0 else (e.strerror or str(e))
            log.warning(
                "rasd: cannot serve metrics at %s:%d, %s (%s); this process serves no metrics", host, port, how, reason
            )
            return
        runtime.own_socket(server.httpd.socket)
        runtime.metrics = metrics
        runtime.metrics_address = server.address
        runtime.event_listeners.append(metrics.on_event)
        log.info("rasd: metrics at http://%s:%d/metrics", _url_host(host), server.address[1])
        metrics.publish()
        loop = asyncio.get_running_loop()
        timer: list[asyncio.TimerHandle] = []

        def tick() -> None:
            metrics.publish()
            timer[:] = [loop.call_later(runtime.timers.tick, tick)]

        timer.append(loop.call_later(runtime.timers.tick, tick))

        def stop() -> None:
            for handle in timer:
                handle.cancel()
            runtime.metrics = None
            runtime.metrics_address = None
            server.close()

        runtime.on_stop.append(stop)
    except Exception as e:  # noqa: BLE001 - metrics are an extra, never a reason to stop the node
        log.warning("rasd: cannot serve metrics (%s: %s); this process serves no metrics", type(e).__name__, e)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
