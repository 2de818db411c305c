"""The client port: NCCL's RAS text protocol on ``localhost:28028``, served by every process of the job.

What happens per client is decided by ``core.client_session``; this module binds the port, moves bytes, runs a
gather for each STATUS, renders the report with ``rasd.report`` and pushes MONITOR events.

Binding (docs/operations.md §2): ``TORCHRAS_ADDR`` (default ``localhost:28028``; ``off`` disables) on 127.0.0.1 and
::1 where localhost has both, with SO_REUSEPORT so the processes of one job share the port and any of them
answers. A different job never shares it: under the registry's lock, a process joins the port its job already
serves, or takes the first port from the default that no other job holds and that binds. With an explicit
``TORCHRAS_ADDR`` only that port is tried, whatever port the rest of its job serves: the setting is the process's
own, as NCCL binds each process's ``NCCL_RAS_ADDR``. A process that cannot bind carries on without a client port
and says why in one log line; a setting that is not an address is the default, after one log line. Nothing here
stops the node, let alone training (``ClientPort.open`` never raises).

Clients are independent: every write is asynchronous, a client that stops reading is dropped once it has
``MAX_CLIENT_BUFFER`` bytes waiting, and at most ``MAX_CLIENTS`` are connected to one process at a time.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rasd.core import wire
from rasd.core.client_session import (
    ClientSession,
    CloseClient,
    Format,
    Reply,
    StartDiagnostics,
    StartStacks,
    StartStatus,
)
from rasd.core.events import Event, Kind
from rasd.core.snapshot import JobSnapshot
from rasd.net.endpoints import EndpointRegistry
from rasd.net.gc_pause import collector_paused
from rasd.net.runtime import Runtime
from rasd.report import diagnostics, stacks
from rasd.report.events import format_event_json, format_event_text
from rasd.report.json_format import render_json
from rasd.report.model import build_report
from rasd.report.summary import build_job_summary
from rasd.report.text import render_head, render_tail
from torchras_formats.version import __version__

log = logging.getLogger("rasd")

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 28028
#: How many ports past the default a later job may move to.
PORT_SEARCH = 16
MAX_CLIENTS = 128
MAX_CLIENT_BUFFER = 4 * 1024 * 1024
#: NCCL's own RAS moves this far from ours, unless the user placed it.
NCCL_PORT_OFFSET = 100


def parse_addr(spec: str) -> tuple[str, int]:
    """``host:port`` or ``[ipv6]:port`` (NCCL_RAS_ADDR's format)."""
    spec = spec.strip()
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = spec.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad address {spec!r}: expected host:port or [ipv6]:port")
    return host, int(port)


def client_address_setting(
    spec: str, environ: Mapping[str, str], warn: Callable[[str], None]
) -> tuple[bool, str, int] | None:
    """Where to serve, from ``spec`` (``TORCHRAS_ADDR``) and ``TORCHRAS_DEFAULT_ADDR``: (explicit, host, port), or
    None when the client port is off (``off``, ``none``, ``0``). A setting that is not an address is passed to
    ``warn`` and the default is used instead, so a typo moves the client port, never stops the job."""
    if spec.strip().lower() in ("off", "none", "0"):
        return None
    # TORCHRAS_DEFAULT_ADDR moves the default itself (tests, sites that reserve another range); unlike
    # TORCHRAS_ADDR it keeps the default's behaviour of moving a later job to the next free port.
    default = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
    moved = environ.get("TORCHRAS_DEFAULT_ADDR", "").strip()
    if moved:
        try:
            parse_addr(moved)
            default = moved
        except ValueError as e:
            warn(f"TORCHRAS_DEFAULT_ADDR: {e}; using the default, {default}")
    if spec.strip():
        try:
            return (True, *parse_addr(spec))
        except ValueError as e:
            warn(f"TORCHRAS_ADDR: {e}; serving on the default, {default}")
    return (False, *parse_addr(default))


def bind_addresses(host: str, port: int) -> list[tuple[int, tuple]]:
    """Where to listen: both loopbacks for ``localhost`` (where the host has them), else getaddrinfo's first."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if host == "localhost":
        seen: set[int] = set()
        out: list[tuple[int, tuple[Any, ...]]] = []
        for family, _, _, _, sockaddr in infos:
            if family not in seen:
                seen.add(family)
                out.append((family, sockaddr))
        return out
    family, _, _, _, sockaddr = infos[0]
    return [(family, sockaddr)]


def job_id_of(secret: bytes) -> str:
    return hashlib.sha256(b"torchras job id" + secret).hexdigest()[:16]


def version_lines() -> tuple[str, str]:
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    runtime = f"Python {sys.version.split()[0]}, CPU only (no CUDA runtime)"
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.version, "cuda", None) and torch.cuda.is_available():
        runtime = f"Python {sys.version.split()[0]}, CUDA runtime version {torch.version.cuda}"
    return f"torchras version {__version__} with torch {torch_version}", runtime


class _Client(asyncio.Protocol):
    def __init__(self, port: ClientPort) -> None:
        self.port = port
        self.session = ClientSession()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.port.runtime.own_transport(transport)
        if len(self.port.clients) >= MAX_CLIENTS:
            transport.write(f"ERROR: Too many client connections (limit {MAX_CLIENTS})\n".encode())  # type: ignore[attr-defined]
            transport.close()
            return
        self.port.clients.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            for out in self.session.feed(data):
                if isinstance(out, Reply):
                    self.write(out.text)
                elif isinstance(out, StartStatus):
                    self.port.start_status(self, out)
                elif isinstance(out, StartDiagnostics):
                    self.port.start_diagnostics(self, out)
                elif isinstance(out, StartStacks):
                    self.port.start_stacks(self, out)
                elif isinstance(out, CloseClient):
                    log.info("rasd: client %s: %s; closing", self.peername(), out.reason)
                    self.close()
        except Exception:
            log.exception("rasd: client error (connection closed)")
            self.close()

    def eof_received(self) -> bool:
        # ``echo status | nc localhost 28028`` half-closes after sending. The session says what that means
        # (ClientSession.end_of_input, NCCL's rule): a running report still goes out, so our side stays open;
        # any other client, a monitoring one included, is closed. Returning False makes asyncio close the
        # transport once the replies already written are sent.
        self.session.end_of_input()
        return not self.session.closed

    def connection_lost(self, exc: Exception | None) -> None:
        self.port.runtime.disown_transport(self.transport)
        self.session.closed = True
        self.port.clients.discard(self)

    def peername(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport else None

    def write(self, text: str) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if t.get_write_buffer_size() > MAX_CLIENT_BUFFER:
            log.info("rasd: client %s is not reading; dropping it", self.peername())
            t.abort()
            return
        t.write(text.encode("utf-8", errors="replace"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ClientPort:
    """Serves the client port of one process (runs on the RAS thread)."""

    def __init__(
        self,
        runtime: Runtime,
        spec: str | None = None,
        registry: EndpointRegistry | None = None,
        counting: Callable[[], str] | None = None,
    ) -> None:
        self.runtime = runtime
        #: Says how this process counts collectives (rasd.torch.records), a third version line; None: no torch.
        self.counting = counting
        self.spec = spec if spec is not None else os.environ.get("TORCHRAS_ADDR", "")
        self.registry = registry or EndpointRegistry()
        self.clients: set[_Client] = set()
        self.servers: list[asyncio.base_events.Server] = []
        self.port: int | None = None
        self.host: str = DEFAULT_HOST
        self._registration: Path | None = None
        self._versions = version_lines()
        #: The client whose DIAGNOSTICS runs: one at a time per process, as NCCL's (reference §9.1.2).
        self._diagnosing: _Client | None = None

    async def open(self) -> None:
        """Bind and serve. Never raises: whatever goes wrong leaves this process without a client port (or on the
        default address), said in one WARNING line; the mesh runs on either way."""
        try:
            await self._open()
        except Exception as e:  # noqa: BLE001 - the client port is an extra, never a reason to stop the node
            log.warning("rasd: no client port (%s: %s); the RAS node runs without one", type(e).__name__, e)
            self.close()

    async def _open(self) -> None:
        address = client_address_setting(self.spec, os.environ, lambda problem: log.warning("rasd: %s", problem))
        if address is None:
            return
        explicit, self.host, base = address
        job = job_id_of(self.runtime.node.secret)
        loop = asyncio.get_running_loop()
        with self.registry.locked():
            live = self.registry.live()
            # The port its job chose from the default; not a port one of its processes was given (TORCHRAS_ADDR).
            ours = sorted({e.port for e in live if e.job_id == job and not e.explicit})
            others = {e.port for e in live if e.job_id != job}
            if explicit:  # this process's own address, as NCCL_RAS_ADDR is: never the one its job serves elsewhere
                candidates = [base]
            elif ours:
                candidates = ours[:1]
            else:
                candidates = [p for p in range(base, base + PORT_SEARCH) if p not in others]
            reason = "another torchras job serves it" if explicit and base in others else ""
            for port in candidates if not reason else []:
                socks, reason = self._bind(port)
                if socks:
                    for sock in socks:
                        self.runtime.own_socket(sock)
                        self.servers.append(await loop.create_server(lambda: _Client(self), sock=sock))
                    self.port = port
                    self._registration = self.registry.register(self.host, port, job, explicit)
                    self.runtime.client_address = (self.host, port)
                    break
        if self.port is None:
            log.warning(
                "rasd: no client port at %s:%d (%s); the RAS node runs without one",
                self.host,
                base,
                reason or "no free port",
            )
            return
        if self.port != base:
            log.warning(
                "rasd: client port %d is held by another job or program; this job serves on %s:%d",
                base,
                self.host,
                self.port,
            )
        else:
            log.info("rasd: client port listening at %s:%d", self.host, self.port)
        self.runtime.event_listeners.append(self.on_event)

    def _bind(self, port: int) -> tuple[list[socket.socket], str]:
        socks: list[socket.socket] = []
        reason = ""
        try:
            addresses = bind_addresses(self.host, port)
        except OSError as e:  # a host name that does not resolve
            return [], f"{self.host}: {e.strerror or e}"
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(sockaddr)
                sock.listen(128)
                sock.setblocking(False)
                socks.append(sock)
            except OSError as e:
                sock.close()
                if e.errno == errno.EADDRNOTAVAIL and socks:
                    continue  # this host has no such loopback; serve the one it has
                reason = e.strerror or str(e)
                if not socks:
                    return [], reason
        return socks, reason

    def close(self) -> None:
        for server in self.servers:
            server.close()
        for client in list(self.clients):
            client.close()
        self.runtime.client_address = None
        if self._registration is not None:
            self.registry.unregister(self._registration)
            self._registration = None

    # ------------------------------------------------------------------------------------------------------------

    def start_status(self, client: _Client, req: StartStatus) -> None:
        node = self.runtime.node
        began = time.monotonic()
        version_line, runtime_line = self._versions
        if self.counting is not None:
            try:
                runtime_line = f"{runtime_line}\n{self.counting()}"
            except Exception:  # a version line is not worth a failed report
                log.debug("rasd: the counting line failed", exc_info=True)
        # A gather that ends within ``runtime.gather`` (a job of one process) finishes after the head is written.
        head_written = False
        ended: list[JobSnapshot] = []

        def done(snapshot: JobSnapshot) -> None:
            if not head_written:
                ended.append(snapshot)
            else:
                finish(snapshot)

        def finish(snapshot: JobSnapshot) -> None:
            if client.session.closed:
                return
            try:
                with collector_paused():  # one burst of short-lived objects (rasd/net/gc_pause.py)
                    report = build_report(snapshot)
                    if req.format is Format.TEXT:
                        text = render_tail(report, verbose=req.verbose)
                    else:
                        text = render_json(
                            report,
                            timestamp=time.time(),
                            torchras_version=version_line.split()[2],
                            torch_version=version_line.split()[-1],
                        )
                    del report
                client.write(text)
            except Exception:
                log.exception("rasd: could not render the report")
                client.write("ERROR: internal error while building the report\n")
            client.close()
            metrics = self.runtime.metrics
            if metrics is not None:
                metrics.status_done(time.monotonic() - began)

        self.runtime.gather(done, timeout=req.timeout)
        if req.format is Format.TEXT:
            # The head is made once the gather's request is out, while the answers travel: at 100,000 processes its
            # job summary is a pass over the table (docs/architecture.md §11), and the answers wait in the sockets.
            summary = build_job_summary(node.table, node.left_addresses(), ordered=True)  # a table is ordered
            client.write(
                render_head(summary, version_line=version_line, runtime_line=runtime_line, verbose=req.verbose)
            )
        head_written = True
        for snapshot in ended:
            finish(snapshot)

    def start_diagnostics(self, client: _Client, req: StartDiagnostics) -> None:
        """Gather every process's configuration and write the comparison (rasd.report.diagnostics), then close.
        A second request while one runs in this process gets NCCL's BUSY line and is closed."""
        if self._diagnosing is not None and not self._diagnosing.session.closed:
            client.write("BUSY: diagnostics already in progress\n")
            client.close()
            return
        self._diagnosing = client
        node = self.runtime.node
        me = node.me

        def done(snapshot: JobSnapshot) -> None:
            if self._diagnosing is client:
                self._diagnosing = None
            if client.session.closed:
                return
            try:
                diag = diagnostics.check(
                    snapshot.answers,
                    snapshot.peers,
                    [p.addr for p in snapshot.expected()],
                    me.addr,
                    snapshot.collection_time,
                )
                if req.format is Format.JSON:
                    client.write(diagnostics.render_json(diag, me.hostname, me.pid, time.time()))
                else:
                    client.write(diagnostics.render_text(diag, me.hostname, me.pid))
            except Exception:
                log.exception("rasd: could not build the diagnostics report")
                client.write(f"{me.hostname}:{me.pid} NCCL DIAG ERROR: diagnostics summary failed\n")
            client.close()

        self.runtime.gather(done, timeout=req.timeout, ask=wire.Ask.DIAGNOSTICS)

    def start_stacks(self, client: _Client, req: StartStacks) -> None:
        """Gather every process's stacks and write them folded (rasd.report.stacks), then close."""
        me = self.runtime.node.me

        def done(snapshot: JobSnapshot) -> None:
            if client.session.closed:
                return
            try:
                folded = stacks.fold(
                    snapshot.answers,
                    snapshot.peers,
                    [p.addr for p in snapshot.expected()],
                    snapshot.collection_time,
                    req.all_threads,
                    req.ranks,
                )
                if req.format is Format.JSON:
                    client.write(stacks.render_json(folded, me.hostname, me.pid, time.time()))
                else:
                    client.write(stacks.render_text(folded))
            except Exception:
                log.exception("rasd: could not build the stacks report")
                client.write("ERROR: internal error while building the stacks report\n")
            client.close()

        ask = wire.Ask.STACKS_ALL if req.all_threads else wire.Ask.STACKS
        self.runtime.gather(done, timeout=req.timeout, ask=ask)

    def on_event(self, event: Event) -> None:
        if event.kind is Kind.PEER_DEAD and event.peer == self.runtime.node.me:
            # The job declared this process dead: it must not answer for the job any more. Its monitors hear why.
            self._push(event)
            log.warning("rasd: this process was declared dead by the job; closing its client port")
            self.close()
            return
        self._push(event)

    def _push(self, event: Event) -> None:
        monitors = [c for c in self.clients if c.session.monitoring and event.group & c.session.monitor]
        if not monitors:
            return
        wall = time.time() - (time.monotonic() - event.at)
        peers = None if event.peer is not None else {p.addr: p for p in self.runtime.node.table}
        text = json_text = None
        for c in monitors:
            if c.session.format is Format.JSON:
                json_text = json_text or format_event_json(event, wall_time=wall, peers=peers)
                c.write(json_text)
            else:
                text = text or format_event_text(event, wall_time=wall, peers=peers)
                c.write(text)


def move_nccl_ras_port(environ: os._Environ[str] | dict[str, str] = os.environ) -> str | None:
    """NCCL's own RAS also wants localhost:28028. Unless the user set ``NCCL_RAS_ADDR`` or ``NCCL_RAS_ENABLE``,
    point it ``NCCL_PORT_OFFSET`` ports above our default, before NCCL starts (it reads the variable at its first
    communicator). Returns the address given to NCCL, or None when left alone."""
    if "NCCL_RAS_ADDR" in environ or "NCCL_RAS_ENABLE" in environ:
        return None
    # Where our client port will be (a bad setting is logged once, by the client port, when it opens).
    address = client_address_setting(environ.get("TORCHRAS_ADDR", ""), environ, lambda problem: None)
    if address is None:
        return None
    _, host, port = address
    moved = f"[{host}]:{port + NCCL_PORT_OFFSET}" if ":" in host else f"{host}:{port + NCCL_PORT_OFFSET}"
    environ["NCCL_RAS_ADDR"] = moved
    log.info("rasd: NCCL's own RAS moved to %s (set NCCL_RAS_ADDR to place it yourself)", moved)
    return moved


async def serve(runtime: Runtime, counting: Callable[[], str] | None = None) -> ClientPort:
    """A runtime service: open the client port and close it when the runtime stops. ``counting`` says how this
    process counts collectives (a third version line of the text report)."""
    port = ClientPort(runtime, counting=counting)
    await port.open()
    runtime.on_stop.append(port.close)
    return port
