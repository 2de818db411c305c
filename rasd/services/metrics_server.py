"""The metrics server: one training process's ``/metrics`` over HTTP, from a process of its own
(``python -m rasd.services.metrics_server``; ``rasd.services.metrics`` starts it and stops it).

Why a process (docs/operations.md §9): an HTTP server on threads of the training process runs under that process's
GIL, and every scrape takes interpreter time from training (392 scrapes a second slowed a saturated 2-core loop by
18 %, bench/README.md "Scraping the metrics"). Here a scrape costs the training process nothing: its RAS thread
renders the exposition when an event changed it, and when this server asks (at most once per ``FRESH_S``), and
this process, at nice 19, does the HTTP.

The parent and this process share three things, and nothing else (``close_fds``):

- **The listening socket** (``--listen-fd``). The parent binds it, so a taken port is one WARNING in the training
  process's log, and port 0 is the parent's to report.
- **The exposition file** (``--file``, on tmpfs). The RAS thread writes it whole (a temporary file, then
  ``os.replace``): ``encode`` below, one body per content type, and the monotonic time it was rendered
  (``CLOCK_MONOTONIC`` is the machine's, the same in both processes). This process reads it again when a ``stat``
  says it changed.
- **A channel** (``--channel-fd``, a Unix socket pair). A scrape that finds the file older than ``FRESH_S``, or
  without the format its ``Accept`` header chooses, sends that header as one line; the RAS thread adds the format,
  renders soon, and sends a newline after each render; the scrape waits for that, at most ``WAIT_S``. So the parent
  renders only while someone scrapes, at most once per ``FRESH_S`` however fast they scrape, and a Prometheus
  scraping every 15 s gets values rendered for it. A fresh render without the format asked for (a client naming
  more formats than the parent renders, ``metrics.MAX_FORMATS``) is served in the text format; without a fresh
  render after ``WAIT_S`` (the training process stopped, hung, or starved of the GIL) the answer is 503: the target
  is down, as it was when the training process served its own scrapes, never up with values of long ago.

Content negotiation is ``prometheus_client``'s (``choose_encoder``, on both sides: this process picks the content
type, the parent the encoder): the text format, or OpenMetrics for an ``Accept`` that names it. As with
``prometheus_client``'s own server, any path answers, ``/favicon.ico`` is empty, ``name[]`` in the query keeps
only the samples named, and only GET and OPTIONS are allowed. Connections are kept alive (HTTP/1.1), as Prometheus
keeps its own.

Life: nice 19, so that on a saturated node training keeps priority; a session of its own, so that a signal to the
training process's group (a Ctrl-C, a launcher's SIGKILL) leaves it to end as below and remove the file. It ends on
SIGTERM, when the parent closes its end of the channel, and when its parent dies: the channel's end closes with it,
unless a forked child of the parent (a DataLoader worker) holds a copy, so also on ``PR_SET_PDEATHSIG`` (Linux; it
fires when the *thread* that started this process ends, the RAS thread, whose end stops the metrics anyway) and
when ``os.getppid()`` changes (checked every ``PARENT_CHECK_S``). When it ends it removes the file (a parent killed
with SIGKILL cannot).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

#: A render older than this is stale: a scrape asks for a new one. The communicators' counters behind it are read
#: at most once a second (``metrics.COMMS_EVERY_S``); an event is rendered at once, asked for or not.
FRESH_S = 1.0
#: How long a scrape waits for the render it asked for (Prometheus waits 10 s by default).
WAIT_S = 2.0
#: How often the parent's pid is checked (where there is no ``PR_SET_PDEATHSIG``, and for a parent that died
#: before this process could ask for it).
PARENT_CHECK_S = 1.0
#: An idle keep-alive connection, or one that sends its request this slowly, is closed after this long.
IDLE_S = 30.0
#: The longest request head accepted (request line and headers).
HEAD_LIMIT = 65536
#: The longest ``Accept`` header passed to the parent.
ACCEPT_LIMIT = 2048
#: The text format's content type, ``prometheus_client``'s answer to an ``Accept`` that names no other format.
TEXT = "text/plain; version=0.0.4; charset=utf-8"
MAGIC = "torchras-metrics 1"


# ----------------------------------------------------------------------------------------------------------------
# The file (written by rasd.services.metrics on the RAS thread, read here)


def encode(rendered_at: float, bodies: Mapping[str, bytes]) -> bytes:
    """The file: a head (``MAGIC rendered_at``, then ``length content-type`` per body), a blank line, the bodies."""
    head = [f"{MAGIC} {rendered_at!r}", *(f"{len(body)} {content_type}" for content_type, body in bodies.items())]
    return ("\n".join(head) + "\n\n").encode() + b"".join(bodies.values())


def decode(data: bytes) -> tuple[float, dict[str, bytes]]:
    """(rendered_at, content type -> body) of a file ``encode`` wrote; ValueError for anything else."""
    head, blank, rest = data.partition(b"\n\n")
    lines = head.decode().split("\n")
    magic, _, rendered_at = lines[0].rpartition(" ")
    if not blank or magic != MAGIC:
        raise ValueError("not a torchras metrics file")
    bodies, at = {}, 0
    for line in lines[1:]:
        length, _, content_type = line.partition(" ")
        bodies[content_type] = rest[at : at + int(length)]
        at += int(length)
    if at != len(rest):
        raise ValueError("a torchras metrics file of the wrong length")
    return float(rendered_at), bodies


def content_type_for(accept: str) -> str:
    """The content type ``prometheus_client`` answers ``accept`` with (its ``choose_encoder``)."""
    from prometheus_client.exposition import choose_encoder

    try:
        return choose_encoder(accept)[1]
    except Exception:  # noqa: BLE001 - a malformed version in a client's header: the default, as for no header
        return TEXT


def restricted(body: bytes, names: set[str]) -> bytes:
    """``body`` with only the samples named in ``names``, and the families that keep one (``prometheus_client``'s
    ``name[]``: ``registry.restricted_registry``)."""
    out: list[bytes] = []
    family: list[bytes] = []  # the comment lines of the family being read
    kept: list[bytes] = []  # its samples that are kept
    end = b""
    for line in [*body.splitlines(keepends=True), b"# HELP"]:  # a last HELP ends the last family
        if line.startswith(b"# EOF"):
            end = line
        elif line.startswith(b"# HELP"):
            if kept:
                out += family + kept
            family, kept = [line], []
        elif line.startswith(b"#"):
            family.append(line)
        elif line.split(b"{", 1)[0].split(b" ", 1)[0].decode("utf-8", "replace") in names:
            kept.append(line)
    return b"".join(out) + end


# ----------------------------------------------------------------------------------------------------------------
# The exposition, as this process sees it


class ExpositionReader:
    """The parent's last render, read from its file, and the way to ask for the next one."""

    def __init__(self, path: str, channel: socket.socket) -> None:
        self.path = path
        self.channel = channel  # non-blocking
        self.rendered = asyncio.Event()  # set, and replaced, at each newline the parent sends after a render
        self.rendered_at = float("-inf")
        self.bodies: dict[str, bytes] = {}
        self._key: tuple[int, int, int] | None = None
        self._asked: set[str] = set()  # the content types asked for since the file last changed
        self._content_types: dict[str, str] = {}  # Accept header -> content type

    def refresh(self) -> None:
        """Read the file again if it changed (``os.replace`` gives it a new inode)."""
        try:
            st = os.stat(self.path)
        except OSError:
            self.rendered_at, self.bodies, self._key = float("-inf"), {}, None
            return
        if (st.st_ino, st.st_mtime_ns, st.st_size) == self._key:
            return
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
            self.rendered_at, self.bodies = decode(data)
        except (OSError, ValueError):
            self.rendered_at, self.bodies = float("-inf"), {}
        self._key = (st.st_ino, st.st_mtime_ns, st.st_size)
        self._asked.clear()

    def content_type(self, accept: str) -> str:
        """The content type for a scrape's ``Accept`` header (one the parent can be asked for: see ``wait``)."""
        content_type = self._content_types.get(accept)
        if content_type is None:
            if len(self._content_types) >= 64:  # a client varying its header cannot grow this without bound
                self._content_types.clear()
            usable = len(accept) <= ACCEPT_LIMIT and "\n" not in accept
            content_type = self._content_types[accept] = content_type_for(accept) if usable else TEXT
        return content_type

    def fresh(self, content_type: str, arrived: float) -> bool:
        """Whether the file holds ``content_type`` rendered at most ``FRESH_S`` before ``arrived``."""
        self.refresh()
        return content_type in self.bodies and self.rendered_at >= arrived - FRESH_S

    async def wait(self, accept: str, arrived: float) -> None:
        """Ask the parent for a render of the format ``accept`` chooses, and wait for it, until ``WAIT_S`` after
        ``arrived``."""
        content_type = self.content_type(accept)
        while not self.fresh(content_type, arrived):
            left = arrived + WAIT_S - time.monotonic()
            if left <= 0:
                return
            if content_type not in self._asked:
                self._asked.add(content_type)
                self.ask(accept if content_type != TEXT else "")
            try:
                await asyncio.wait_for(self.rendered.wait(), left)
            except asyncio.TimeoutError:
                return

    def take(self, content_type: str, arrived: float) -> tuple[str, bytes] | None:
        """(content type, body) of a fresh render for a scrape that arrived at ``arrived``: ``content_type``, else
        the text format; None without a fresh render."""
        if self.rendered_at < arrived - FRESH_S:
            return None
        for chosen in (content_type, TEXT):
            if chosen in self.bodies:
                return chosen, self.bodies[chosen]
        return None

    def ask(self, accept: str) -> None:
        try:
            self.channel.send(accept.encode("latin-1", "replace") + b"\n")
        except (BlockingIOError, InterruptedError):
            pass  # the channel is full: the RAS thread has requests to read already
        except OSError:
            pass  # the parent is gone: the channel's end ends this process

    def heard(self) -> bool:
        """Read what the parent sent: each newline is a render. False once the parent's end has closed."""
        try:
            data = self.channel.recv(65536)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if data:
            self.rendered.set()
            self.rendered = asyncio.Event()
        return bool(data)


# ----------------------------------------------------------------------------------------------------------------
# HTTP


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    accept: str
    keep_alive: bool


def parse(head: bytes) -> Request | None:
    """The request in a head that ends with a blank line, or None for one that is not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            return None
        name = name.strip().lower()
        headers[name] = f"{headers[name]},{value.strip()}" if name in headers else value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if parts[2] == "HTTP/1.1" else "keep-alive" in connection
    if headers.get("content-length", "0").strip() != "0" or "transfer-encoding" in headers:
        keep_alive = False  # a body this server does not read: the connection ends with this request
    path, _, query = parts[1].partition("?")
    return Request(parts[0], path, query, headers.get("accept", ""), keep_alive)


def response(status: str, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers), f"Content-Length: {len(body)}"]
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def other(request: Request) -> bytes | None:
    """The response to a request for anything but the metrics, as ``prometheus_client``'s WSGI app answers it;
    None for a request for the metrics (a GET of any path but ``/favicon.ico``)."""
    keep = request.keep_alive
    allow = [("Allow", "OPTIONS,GET")]
    if request.method == "OPTIONS":
        return response("200 OK", allow, b"", keep)
    if request.method != "GET":
        body = f"# HTTP 405 Method Not Allowed: {request.method}; use OPTIONS or GET\n".encode("latin-1", "replace")
        return response("405 Method Not Allowed", allow, body, keep)
    if request.path == "/favicon.ico":
        return response("200 OK", [], b"", keep)
    return None


def metrics(request: Request, found: tuple[str, bytes] | None) -> bytes:
    """The response to a request for the metrics, with ``found`` (``ExpositionReader.take``)."""
    if found is None:
        body = f"# the training process rendered no metrics within {WAIT_S:g} s (busy, stopped or gone)\n".encode()
        return response("503 Service Unavailable", [], body, request.keep_alive)
    content_type, body = found
    names = parse_qs(request.query).get("name[]")
    if names:
        body = restricted(body, set(names))
    return response("200 OK", [("Content-Type", content_type)], body, request.keep_alive)


class Connection(asyncio.Protocol):
    """One client's connection: its requests answered in turn, most at once (a fresh render); one that waits for a
    render holds those behind it. Closed after ``IDLE_S`` without a whole request, or when the client sends more
    than ``HEAD_LIMIT`` without one (or piles requests up); nothing is read while the client leaves its answers
    unread."""

    def __init__(self, exposition: ExpositionReader) -> None:
        self.exposition = exposition
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.waiting: asyncio.Task[None] | None = None  # the request waiting for a render
        self.paused = False  # the client does not read its answers
        self.idle: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.idle = self.loop.call_later(IDLE_S, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.idle is not None:
            self.idle.cancel()
        if self.waiting is not None:
            self.waiting.cancel()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > 4 * HEAD_LIMIT and self.transport is not None:
            self.transport.close()  # requests piled up behind one that waits: not a scraper
            return
        self.answer()

    def pause_writing(self) -> None:
        self.paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self.answer()

    def answer(self) -> None:
        """Answer the whole requests in the buffer, in turn, until one must wait for a render."""
        transport = self.transport
        while transport is not None and not transport.is_closing() and self.waiting is None and not self.paused:
            head, end, rest = self.buffer.partition(b"\r\n\r\n")
            if not end:
                if len(self.buffer) > HEAD_LIMIT:
                    transport.close()
                return
            self.buffer = rest
            request = parse(head)
            if request is None:
                transport.write(response("400 Bad Request", [], b"", keep_alive=False))
                transport.close()
                return
            data = other(request)
            if data is None:
                content_type = self.exposition.content_type(request.accept)
                arrived = time.monotonic()
                if not self.exposition.fresh(content_type, arrived):
                    self.waiting = self.loop.create_task(self.answer_late(request, arrived))
                    return
                data = metrics(request, self.exposition.take(content_type, arrived))
            self.send(data, request.keep_alive)

    async def answer_late(self, request: Request, arrived: float) -> None:
        await self.exposition.wait(request.accept, arrived)
        self.waiting = None
        found = self.exposition.take(self.exposition.content_type(request.accept), arrived)
        self.send(metrics(request, found), request.keep_alive)
        self.answer()

    def send(self, data: bytes, keep_alive: bool) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(data)  # the response says Connection: close where it closes
        if not keep_alive:
            self.transport.close()  # after what is buffered is sent
        elif self.idle is not None:
            self.idle.cancel()
            self.idle = self.loop.call_later(IDLE_S, self.transport.close)


# ----------------------------------------------------------------------------------------------------------------
# The process


def die_with_parent() -> None:
    """Ask Linux for SIGTERM when the parent ends (``PR_SET_PDEATHSIG``); elsewhere the parent check alone."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


async def serve(listen_fd: int, path: str, channel_fd: int, parent: int) -> None:
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, ended.set)
    channel = socket.socket(fileno=channel_fd)
    channel.setblocking(False)
    exposition = ExpositionReader(path, channel)

    def heard() -> None:
        if not exposition.heard():
            loop.remove_reader(channel_fd)
            ended.set()

    loop.add_reader(channel_fd, heard)
    server = await loop.create_server(lambda: Connection(exposition), sock=socket.socket(fileno=listen_fd), backlog=128)

    async def watch_parent() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
        ended.set()

    watcher = asyncio.create_task(watch_parent())
    try:
        await ended.wait()
    finally:
        watcher.cancel()
        server.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rasd.services.metrics_server", description=__doc__.split("\n")[0])
    ap.add_argument("--listen-fd", type=int, required=True, help="the listening socket, bound by the parent")
    ap.add_argument("--file", required=True, help="the exposition file the parent writes")
    ap.add_argument("--channel-fd", type=int, required=True, help="this process's end of a socket pair with the parent")
    ap.add_argument("--parent", type=int, required=True, help="the parent's pid")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(19)
    except OSError:
        pass
    try:
        # Until the loop's own handler is set, a SIGTERM (the parent dying) still ends this process through the
        # finally below, which removes the file.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        die_with_parent()
        if os.getppid() == args.parent:  # else the parent died before PR_SET_PDEATHSIG was set
            asyncio.run(serve(args.listen_fd, args.file, args.channel_fd, args.parent))
    finally:
        for leftover in (args.file, args.file + ".tmp"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
