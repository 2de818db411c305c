"""The metrics server process (``rasd.services.metrics_server``), with this test as its parent: it serves the exposition
file the parent rendered, in the format a scrape's Accept header chooses; a stale render is asked for on the
channel and waited on; a fresh render without the format is served in the text format, and no fresh render in time
is a 503; it answers other methods and paths as ``prometheus_client``'s server does and keeps connections alive;
SIGTERM, or the parent closing its end of the channel, ends it, and it removes the file.

The node's side (a real node spawning its server, its death and its parent's) is in test_metrics_endpoint.py.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client.exposition import choose_encoder

from rasd.services.metrics_server import FRESH_S, TEXT, WAIT_S, decode, encode, restricted

REPOSITORY = Path(__file__).resolve().parents[3]
#: What Prometheus 3 sends: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;"
    "version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
OPENMETRICS = choose_encoder(PROMETHEUS_ACCEPT)[1]
TEXT_BODY = b"""# HELP a_total A.
# TYPE a_total counter
a_total 1.0
# HELP b B.
# TYPE b gauge
b{x="1"} 2.0
b{x="2"} 3.0
"""
OPENMETRICS_BODY = b"""# HELP a A.
# TYPE a counter
a_total 1.0
# HELP b B.
# TYPE b gauge
b{x="1"} 2.0
b{x="2"} 3.0
# EOF
"""
#: A render "made an hour from now": fresh for every scrape of a test that is not about freshness.
FRESH = time.monotonic() + 3600


class Parent:
    """This test as the server's parent: the listening socket, the exposition file, the channel."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "exposition"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
            self.port = sock.getsockname()[1]
            self.channel, theirs = socket.socketpair()
            with theirs:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "rasd.services.metrics_server", "--listen-fd", str(sock.fileno())]
                    + ["--file", str(self.path), "--channel-fd", str(theirs.fileno()), "--parent", str(os.getpid())],
                    pass_fds=(sock.fileno(), theirs.fileno()),
                    cwd=REPOSITORY,
                )

    def write(self, bodies: dict[str, bytes], rendered_at: float = FRESH) -> None:
        """A render, written as the RAS thread writes it, and told to the server."""
        temporary = self.path.with_name("exposition.tmp")
        temporary.write_bytes(encode(rendered_at, bodies))
        os.replace(temporary, self.path)
        self.channel.send(b"\n")

    def asked(self, timeout: float = 30.0) -> list[str]:
        """The lines the server sent on the channel, waiting up to ``timeout`` for the first."""
        self.channel.settimeout(timeout)
        return self.channel.recv(65536).decode("latin-1").splitlines()

    def get(self, path: str = "/metrics", accept: str | None = None, method: str = "GET") -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, headers={"Accept": accept} if accept is not None else {})
        return conn.getresponse()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self.channel.close()


@pytest.fixture
def parent(tmp_path):
    p = Parent(tmp_path)
    try:
        yield p
    finally:
        p.close()


def test_the_file_holds_each_format_whole():
    bodies = {TEXT: TEXT_BODY, OPENMETRICS: OPENMETRICS_BODY, "x/empty": b""}
    assert decode(encode(12.5, bodies)) == (12.5, bodies)
    for broken in (b"", b"something else\n\n", encode(1.0, bodies)[:-1], encode(1.0, bodies) + b"x"):
        with pytest.raises(ValueError):
            decode(broken)


def test_name_filters_keep_the_samples_named_and_their_families():
    assert restricted(TEXT_BODY, {"a_total"}) == b"# HELP a_total A.\n# TYPE a_total counter\na_total 1.0\n"
    assert restricted(OPENMETRICS_BODY, {"b"}) == b'# HELP b B.\n# TYPE b gauge\nb{x="1"} 2.0\nb{x="2"} 3.0\n# EOF\n'
    assert restricted(TEXT_BODY, {"c"}) == b""


def test_a_scrape_gets_what_the_parent_rendered_in_the_format_it_accepts(parent):
    parent.write({TEXT: TEXT_BODY, OPENMETRICS: OPENMETRICS_BODY})
    plain = parent.get()
    assert (plain.status, plain.getheader("Content-Type"), plain.read()) == (200, TEXT, TEXT_BODY)
    prometheus = parent.get(accept=PROMETHEUS_ACCEPT)
    assert prometheus.getheader("Content-Type") == OPENMETRICS and prometheus.read() == OPENMETRICS_BODY
    # Any path answers, as prometheus_client's does; name[] keeps the samples named.
    assert parent.get("/").read() == TEXT_BODY
    assert parent.get("/metrics?name[]=a_total").read() == b"# HELP a_total A.\n# TYPE a_total counter\na_total 1.0\n"


def test_a_stale_render_is_asked_for_and_the_scrape_waits_for_it(parent):
    parent.write({TEXT: b"old 1.0\n"}, rendered_at=time.monotonic() - 10 * FRESH_S)
    got: list[bytes] = []
    scrape = threading.Thread(target=lambda: got.append(parent.get(accept=PROMETHEUS_ACCEPT).read()))
    scrape.start()
    # The server passes the scrape's Accept header on, so the parent renders the format it chooses.
    assert parent.asked() == [PROMETHEUS_ACCEPT]
    parent.write({TEXT: b"new 1.0\n", OPENMETRICS: b"new 1.0\n# EOF\n"}, rendered_at=time.monotonic())
    scrape.join(60)
    assert got == [b"new 1.0\n# EOF\n"]


def test_a_fresh_render_without_the_format_asked_for_is_served_in_the_text_format(parent):
    parent.write({TEXT: b"old 1.0\n"}, rendered_at=time.monotonic() - 10 * FRESH_S)
    got: list[http.client.HTTPResponse] = []
    scrape = threading.Thread(target=lambda: got.append(parent.get(accept=PROMETHEUS_ACCEPT)))
    scrape.start()
    assert parent.asked() == [PROMETHEUS_ACCEPT]
    parent.write({TEXT: b"new 1.0\n"}, rendered_at=time.monotonic())  # a parent that renders no other format
    scrape.join(60)
    assert (got[0].getheader("Content-Type"), got[0].read()) == (TEXT, b"new 1.0\n")


def test_no_fresh_render_in_time_is_a_503(parent):
    parent.write({TEXT: b"old 1.0\n"}, rendered_at=time.monotonic() - 10 * FRESH_S)
    started = time.monotonic()
    response = parent.get()  # the parent never answers: stopped, hung, or starved of the GIL
    assert response.status == 503 and b"rendered no metrics" in response.read()
    assert time.monotonic() - started >= WAIT_S * 0.9
    assert parent.asked() == [""]  # the text format, asked for with no Accept header


def test_other_methods_and_paths_are_answered_as_prometheus_client_does(parent):
    parent.write({TEXT: TEXT_BODY})
    assert parent.get(method="OPTIONS").getheader("Allow") == "OPTIONS,GET"
    post = parent.get(method="POST")
    assert post.status == 405 and post.read() == b"# HTTP 405 Method Not Allowed: POST; use OPTIONS or GET\n"
    favicon = parent.get("/favicon.ico")
    assert (favicon.status, favicon.read()) == (200, b"")
    with socket.create_connection(("127.0.0.1", parent.port), 30) as s:
        s.sendall(b"NOT HTTP\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400 ")


def test_a_connection_is_kept_alive_for_the_next_scrape(parent):
    parent.write({TEXT: TEXT_BODY})
    conn = http.client.HTTPConnection("127.0.0.1", parent.port, timeout=30)
    conn.request("GET", "/metrics")
    assert conn.getresponse().read() == TEXT_BODY
    first = conn.sock
    conn.request("GET", "/metrics")
    assert conn.getresponse().read() == TEXT_BODY
    assert conn.sock is first and first is not None
    conn.close()


def test_without_a_file_a_scrape_is_answered_503_after_the_wait(parent):
    assert parent.get().status == 503


def test_sigterm_ends_the_server_and_it_removes_the_file(parent):
    parent.write({TEXT: TEXT_BODY})
    assert parent.get().read() == TEXT_BODY  # serving: its signal handler is set
    parent.process.send_signal(signal.SIGTERM)
    assert parent.process.wait(30) == 0
    assert not parent.path.exists()
    with pytest.raises(OSError):
        parent.get()


def test_the_parent_closing_its_end_of_the_channel_ends_the_server(parent):
    parent.write({TEXT: TEXT_BODY})
    assert parent.get().read() == TEXT_BODY
    parent.channel.close()
    assert parent.process.wait(30) == 0
    assert not parent.path.exists()
