"""Prometheus metrics (``rasd.services.metrics``, docs/operations.md "Metrics and alerts"): the setting, the frame
counts (``rasd.net.traffic``), a real node of this process scraped over HTTP (restarts, STATUS and gather
histograms), bad settings and a taken port as one WARNING line each, and docs/monitoring's rules and dashboard
checked with promtool.

The HTTP is a server process's (``rasd.services.metrics_server``; its protocol with the parent is tested in
test_metrics_server.py): it holds the listening socket and this process's threads do no HTTP work; it ends with the
node, and with its parent killed by SIGKILL, and takes its file with it; a server that ends, or a file that cannot
be written, is one WARNING, and the node runs on.

The promtool checks skip where promtool is missing (Debian's ``prometheus`` package; ./bootstrap installs it as
root, so CI has it), and say so.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.exposition import choose_encoder

import rasd
from mesh_of_one import query
from polling import wait_for, wait_until
from rasd.net.traffic import FrameCounter, count_frames
from rasd.services import metrics
from rasd.services.metrics import metrics_address
from rasd.services.metrics_server import TEXT, decode

REPOSITORY = Path(__file__).resolve().parents[3]
MONITORING = REPOSITORY / "docs" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing: install Debian's prometheus package (./bootstrap does, as root)"
)


#: The mesh of one (conftest.py's ``node``) serves its metrics on a free port, its own (no local-rank offset).
NODE_ENV = {"TORCHRAS_METRICS_ADDR": "127.0.0.1:0", "LOCAL_RANK": None}


def scrape(port: int, host: str = "127.0.0.1") -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as r:
        return r.read().decode()


def server_of(pid: int) -> psutil.Process | None:
    """The metrics server process that process ``pid`` started, or None."""
    for child in psutil.Process(pid).children():
        try:
            if "rasd.services.metrics_server" in child.cmdline():
                return child
        except psutil.Error:  # gone, or a zombie: not serving
            continue
    return None


def started_server() -> psutil.Process:
    """This process's metrics server, waited for: its command line is read from /proc, which a loaded machine may
    show as the parent's for a moment."""
    server = wait_until(lambda: server_of(os.getpid()), 10, 0.05, what="this process's metrics server")
    assert server is not None
    return server


def file_of(server: psutil.Process) -> Path:
    """The exposition file a server process reads (its ``--file``)."""
    args = server.cmdline()
    return Path(args[args.index("--file") + 1])


def listening_ports(process: psutil.Process) -> set[int]:
    connections = getattr(process, "net_connections", None) or process.connections  # psutil 6 renamed it
    return {c.laddr.port for c in connections("tcp") if c.status == psutil.CONN_LISTEN}


def ended(process: psutil.Process) -> bool:
    """Whether a process has ended (a zombie counts: whoever reaps it here may not)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a scrape, or None."""
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


# ---- the setting -------------------------------------------------------------------------------------------------


def test_the_address_setting():
    warnings: list[str] = []
    read = lambda env: metrics_address(env, warnings.append)  # noqa: E731 - a short alias
    assert read({}) is None
    assert read({"TORCHRAS_METRICS_ADDR": "off"}) is None
    assert read({"TORCHRAS_METRICS_ADDR": "localhost:9400"})[:2] == ("localhost", 9400)
    assert read({"TORCHRAS_METRICS_ADDR": ":9400"})[:2] == ("0.0.0.0", 9400)
    assert read({"TORCHRAS_METRICS_ADDR": "[::1]:9400"})[:2] == ("::1", 9400)
    assert read({"TORCHRAS_METRICS_ADDR": "localhost:0", "LOCAL_RANK": "3"})[:2] == ("localhost", 0)
    # torchrun's per-rank ports: the port plus LOCAL_RANK.
    host, port, how = read({"TORCHRAS_METRICS_ADDR": "0.0.0.0:9400", "LOCAL_RANK": "3"})
    assert (host, port) == ("0.0.0.0", 9403) and "LOCAL_RANK 3" in how
    assert not warnings
    for bad in ("localhost", "localhost:http", "localhost:70000", "[::1]9400"):
        assert read({"TORCHRAS_METRICS_ADDR": bad}) is None
    assert read({"TORCHRAS_METRICS_ADDR": "localhost:65535", "LOCAL_RANK": "1"}) is None
    assert len(warnings) == 5 and all("serves no metrics" in w for w in warnings)


def test_frames_are_counted_in_whatever_pieces_they_arrive():
    # The mesh's framing (rasd.core.wire): u32 length, then that many bytes.
    frames = [len(body).to_bytes(4, "big") + body for body in (b"abc", b"", b"x" * 256, b"\0" * 5, bytes(range(7)))]
    stream = b"".join(frames)
    assert count_frames(stream) == len(frames)
    for size in (1, 2, 3, 5, 7, 64):
        counter = FrameCounter()
        assert sum(counter.feed(stream[i : i + size]) for i in range(0, len(stream), size)) == len(frames)


# ---- a real node of this process -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_node_of_earlier_tests():
    rasd.stop(goodbye=False)
    yield
    rasd.stop(goodbye=False)


def test_a_node_serves_its_metrics_and_they_follow_restarts_and_status_requests(node):
    assert node.metrics_address is not None
    port = node.metrics_address[1]
    text = scrape(port)
    assert sample(text, "torchras_mesh_peers", state="alive") == 1
    assert sample(text, "torchras_verdicts_total", kind="PEER_DEAD") == 0
    assert sample(text, "torchras_restarts_total") == 0
    rasd.record_restart(2, "PEER_DEAD of rank 1", [1], 0.75)
    rasd.record_restart(3, "COMM_STUCK", [], 0.5)
    text = wait_for(lambda: scrape(port), lambda t: sample(t, "torchras_restarts_total") == 2, 30, what="2 restarts")
    assert sample(text, "torchras_restart_iteration") == 3
    assert sample(text, "torchras_restart_lost_seconds_total") == pytest.approx(1.25)
    assert b"Communicators" in query(node.client_address, "STATUS")
    text = wait_for(
        lambda: scrape(port),
        lambda t: sample(t, "torchras_client_status_duration_seconds_count") == 1,
        30,
        what="one STATUS observed",
    )
    assert sample(text, "torchras_gather_duration_seconds_count") == 1
    assert sample(text, "torchras_gather_duration_seconds_bucket", le="+Inf") == 1
    assert sample(text, "torchras_ras_thread_cpu_seconds_total") > 0
    assert sample(text, "torchras_node_info", rank="-1") == 1


def test_the_server_serves_what_the_training_process_rendered_in_the_format_asked_for(node):
    port = node.metrics_address[1]
    server = started_server()
    assert server is not None
    prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=0.0.4;q=0.3"
    for accept, content_type in ((None, TEXT), (prometheus, choose_encoder(prometheus)[1])):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics", headers={"Accept": accept} if accept else {})
        response = conn.getresponse()
        body = response.read()
        conn.close()
        assert response.getheader("Content-Type") == content_type
        # Nothing renders between the scrape and this read: no event, and no other scrape asking.
        assert decode(file_of(server).read_bytes())[1][content_type] == body
        assert sample(body.decode(), "torchras_mesh_peers", state="alive") == 1
    assert body.endswith(b"# EOF\n")  # OpenMetrics


def test_the_server_process_its_port_and_its_file_end_with_the_node(node):
    port = node.metrics_address[1]
    scrape(port)
    server = started_server()
    assert server is not None and server.nice() == 19
    exposition = file_of(server)
    assert exposition.exists()
    node.stop()
    assert ended(server) and not exposition.exists()
    with pytest.raises(OSError):
        scrape(port)


def test_the_training_process_does_no_http_work(node):
    port = node.metrics_address[1]
    scrape(port)
    server = started_server()
    assert server is not None
    threads = {t.ident for t in threading.enumerate()}
    # The listening socket is the server's; this process holds none on the port.
    assert port not in listening_ports(psutil.Process())
    assert port in listening_ports(server)
    # Scraping 1,000 times costs this process's other threads (the RAS thread) a render per tick at most: an HTTP
    # server on them would spend more than the bound on the requests alone (some 0.3 ms each).
    others = time.process_time() - time.thread_time()  # every thread of this process but this one
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(1000):
        conn.request("GET", "/metrics")
        assert conn.getresponse().read().startswith(b"# HELP")
    conn.close()
    elapsed = time.monotonic() - started
    spent = time.process_time() - time.thread_time() - others
    assert spent < 0.1 + 0.05 * elapsed, f"{spent:.3f} s of CPU in {elapsed:.1f} s"
    assert {t.ident for t in threading.enumerate()} == threads


#: The parent killed in the next test: a node of its own, serving metrics, then nothing.
PARENT = """
import sys, time
import rasd
handle = rasd.start(secret=b"secret", host="127.0.0.1")
print(handle.metrics_address[1], flush=True)
time.sleep(300)
"""


@pytest.mark.slow  # a second interpreter that imports rasd
@pytest.mark.parametrize("killed", ["the parent", "its process group"])
def test_the_server_process_ends_when_its_parent_is_killed(tmp_path, killed):
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    env.update(TORCHRAS_METRICS_ADDR="127.0.0.1:0", TORCHRAS_ADDR="off", TORCHRAS_RUN_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env=env, stdout=subprocess.PIPE, start_new_session=True)
    try:
        line = parent.stdout.readline() if parent.stdout is not None else b""
        assert line.strip().isdigit(), f"the parent printed {line!r}"
        port = int(line)
        server = wait_until(lambda: server_of(parent.pid), 30, what="the parent's metrics server")
        assert server is not None
        exposition = file_of(server)
        assert sample(scrape(port), "torchras_mesh_peers", state="alive") == 1
        if killed == "the parent":
            parent.kill()
        else:  # as a launcher ends a worker: the server, in a session of its own, is not in the group
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(30)
        wait_until(lambda: ended(server), 30, what="the server ended after its parent")
        wait_until(lambda: not exposition.exists(), 30, what="the file removed")
        with pytest.raises(OSError):
            scrape(port)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)


def test_a_bad_setting_is_one_warning_and_the_node_runs(monkeypatch, caplog):
    monkeypatch.setenv("TORCHRAS_METRICS_ADDR", "localhost")
    monkeypatch.setenv("TORCHRAS_ADDR", "off")
    with caplog.at_level(logging.WARNING, logger="rasd"):
        handle = rasd.start(secret=b"secret", host="127.0.0.1")
        assert handle is not None and handle.running and handle.metrics_address is None
    lines = [r.getMessage() for r in caplog.records if "METRICS" in r.getMessage()]
    assert lines == ["rasd: TORCHRAS_METRICS_ADDR='localhost' is not host:port, [ipv6]:port or :port; this process "
                     "serves no metrics"]  # fmt: skip


def test_a_taken_port_is_one_warning_and_the_node_runs(monkeypatch, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("TORCHRAS_METRICS_ADDR", f"127.0.0.1:{port}")
        monkeypatch.setenv("TORCHRAS_ADDR", "off")
        monkeypatch.delenv("LOCAL_RANK", raising=False)
        with caplog.at_level(logging.WARNING, logger="rasd"):
            handle = rasd.start(secret=b"secret", host="127.0.0.1")
            assert handle is not None and handle.running and handle.metrics_address is None
        wait_until(lambda: handle.running, 5, what="the node running")
    lines = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()]
    assert len(lines) == 1 and f"cannot serve metrics at 127.0.0.1:{port}" in lines[0], lines
    assert "Address already in use" in lines[0] and "this process serves no metrics" in lines[0]
    assert server_of(os.getpid()) is None


def start_serving(monkeypatch) -> rasd.RasHandle:
    """A node of this process serving metrics on a free port, without a client port."""
    monkeypatch.setenv("TORCHRAS_METRICS_ADDR", "127.0.0.1:0")
    monkeypatch.setenv("TORCHRAS_ADDR", "off")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    handle = rasd.start(secret=b"secret", host="127.0.0.1")
    assert handle is not None and handle.metrics_address is not None
    return handle


def test_a_server_process_that_ends_is_one_warning_and_the_node_runs(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="rasd"):
        handle = start_serving(monkeypatch)
        server = started_server()
        assert server is not None
        exposition = file_of(server)
        server.kill()
        wait_until(lambda: handle.metrics_address is None, 30, what="the metrics stopped")
    assert handle.running and not exposition.exists()
    lines = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()]
    assert lines == [f"rasd: the metrics server (pid {server.pid}) ended with code -9; this process serves no "
                     "metrics"]  # fmt: skip


def test_a_file_that_cannot_be_written_is_one_warning_and_the_node_runs(monkeypatch, caplog, tmp_path):
    directory = tmp_path / "tmpfs"
    directory.mkdir()
    monkeypatch.setattr(metrics, "exposition_directory", lambda: str(directory))
    with caplog.at_level(logging.WARNING, logger="rasd"):
        handle = start_serving(monkeypatch)
        server = started_server()
        assert server is not None and file_of(server).parent == directory
        address = handle.metrics_address
        assert address is not None
        shutil.rmtree(directory)
        try:
            scrape(address[1])  # no file: the server asks for a render, which cannot be written
        except OSError:
            pass  # the server ended while the scrape waited
        wait_until(lambda: handle.metrics_address is None, 30, what="the metrics stopped")
    assert handle.running and ended(server)
    lines = [r.getMessage() for r in caplog.records if "metrics" in r.getMessage()]
    assert len(lines) == 1 and f"cannot write the metrics to {directory}" in lines[0], lines
    assert "this process serves no metrics" in lines[0]


# ---- docs/monitoring -----------------------------------------------------------------------------------------------


@needs_promtool
def test_the_alert_rules_pass_promtool_check_rules():
    run = subprocess.run([PROMTOOL, "check", "rules", "torchras-alerts.yml"], cwd=MONITORING, capture_output=True)
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()


@needs_promtool
def test_the_alert_rules_fire_as_their_unit_tests_say():
    run = subprocess.run([PROMTOOL, "test", "rules", "torchras-alerts.test.yml"], cwd=MONITORING, capture_output=True)
    assert run.returncode == 0, run.stdout.decode() + run.stderr.decode()


def metric_names_in(expr: str) -> set[str]:
    return set(re.findall(r"\btorchras_[a-z_]+", expr))


def test_the_dashboard_and_the_rules_use_only_metrics_a_node_exports(node):
    text = scrape(node.metrics_address[1])
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    exported |= {f"{n}_{s}" for n in exported for s in ("bucket", "sum", "count", "total")}
    dashboard = json.loads((MONITORING / "torchras-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += re.findall(r"expr: (.*)", (MONITORING / "torchras-alerts.yml").read_text())
    used = set().union(*(metric_names_in(e) for e in exprs))
    assert used and used <= exported, used - exported
