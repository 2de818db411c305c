"""Prometheus metrics on a live ``rasd swarm`` (real processes on loopback; docs/operations.md "Metrics and alerts").

Every member serves its metrics on a port of its own (``TORCHRAS_METRICS_ADDR=127.0.0.1:0``: the kernel's choice,
written to the member's file). The scrapes pass ``promtool check metrics``; their values equal the job's report; a
kill -9 moves the dead-peer gauge and the PEER_DEAD counter in every survivor; scraping hard does not stall the
mesh; and a real Prometheus server, loaded with docs/monitoring's rules, raises the dead-peer alert after a kill -9.

The promtool and Prometheus tests skip where they are missing (Debian's ``prometheus`` package; ./bootstrap installs
it as root, so CI has it), and say so. Deadlines are generous: the suite runs on loaded machines.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from polling import wait_for, wait_until
from ras_client import json_status
from rasd.swarm import Swarm
from swarm_ring import wait_for_ring

pytestmark = pytest.mark.slow  # every test starts a swarm of real processes

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
MISSING = "install Debian's prometheus package (./bootstrap does, as root)"
#: Counts frozen (no synthetic collective moves), so a scrape and a report taken apart agree.
FROZEN = {"TORCHRAS_METRICS_ADDR": "127.0.0.1:0", "TORCHRAS_SWARM_STEP_S": "0"}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return r.read().decode()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", line)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    for n, got, v in samples(text):
        if n == name and all(got.get(k) == want for k, want in labels.items()):
            return v
    return None


@pytest.mark.skipif(PROMTOOL is None, reason=f"promtool is missing: {MISSING}")
def test_every_scrape_passes_promtool_and_equals_the_report():
    with Swarm(3, env=FROZEN) as sw:
        wait_for_ring(sw)
        for m in sw.members:
            assert m.metrics_port, f"member {m.index} serves no metrics"
            text = scrape(m.metrics_port)
            check = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True)
            assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
        port = sw.members[0].client_port
        report = wait_for(lambda: json_status(port), lambda d: d["ras"]["missing_processes_count"] == 0, 30)
        for m in sw.members:
            text = scrape(m.metrics_port)
            assert value(text, "torchras_mesh_peers", state="alive") == sw.n
            assert sum(v for n, _, v in samples(text) if n == "torchras_mesh_peers") == sw.n
            assert value(text, "torchras_communicators", status="RUNNING") == 2  # world and pair
            ours = [(c, r) for c in report["communicators"] for r in c["ranks"] if r["pid"] == m.pid]
            assert len(ours) == 2
            for comm, rank in ours:
                name = f"{int(comm['hash'], 16):016x}"
                for op, count in rank["collective_counts"].items():
                    assert (value(text, "torchras_collectives_launched_total", comm=name, op=op) or 0) == count
                for op, count in rank["completed_counts"].items():
                    assert (value(text, "torchras_collectives_completed_total", comm=name, op=op) or 0) == count
            assert value(text, "torchras_mesh_sent_messages_total") > 0
            assert value(text, "torchras_mesh_received_bytes_total") > 0


def test_a_kill_9_moves_the_dead_gauge_and_the_verdict_counter_in_every_survivor():
    with Swarm(4, env=FROZEN) as sw:
        wait_for_ring(sw)
        for m in sw.members:
            assert value(scrape(m.metrics_port), "torchras_verdicts_total", kind="PEER_DEAD") == 0
        sw.kill(2)
        for m in sw.members:
            if m.index == 2:
                continue
            text = wait_for(
                lambda m=m: scrape(m.metrics_port),
                lambda t: value(t, "torchras_mesh_peers", state="dead") == 1,
                30,
                what=f"member {m.index}'s dead-peer gauge",
            )
            assert value(text, "torchras_verdicts_total", kind="PEER_DEAD") == 1
            assert value(text, "torchras_mesh_peers", state="alive") == 3


def test_scraping_hard_does_not_stall_the_mesh():
    # Default timers: a member whose RAS thread stalled for 5 s would be UNRESPONSIVE, for 10 s HUNG.
    with Swarm(3, env=FROZEN) as sw:
        wait_for_ring(sw)
        target = sw.members[0]
        stop = threading.Event()
        done = [0]

        def hammer() -> None:
            # 200 requests a second, each on a new connection, for 5 s (fewer if the loaded machine cannot).
            end = time.monotonic() + 5.0
            while time.monotonic() < end and not stop.is_set():
                began = time.monotonic()
                scrape(target.metrics_port)
                done[0] += 1
                time.sleep(max(0.0, 0.005 - (time.monotonic() - began)))

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            # The job's STATUS still answers, from the member being scraped, while it is scraped.
            while thread.is_alive():
                doc = json_status(target.client_port)
                assert len(doc["communicators"]) >= 1
        finally:
            stop.set()
            thread.join(60)
        assert done[0] > 50, f"only {done[0]} scrapes"
        time.sleep(2.0)  # time for a verdict the scraping caused to show, which must not come
        for i in range(sw.n):
            for kind in ("PEER_DEAD", "PEER_HUNG", "PEER_UNRESPONSIVE"):
                assert not sw.events(i, kind), f"member {i}: {kind} {sw.events(i, kind)}"
        text = scrape(target.metrics_port)
        assert value(text, "torchras_client_status_duration_seconds_count") >= 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return json.loads(r.read())


def firing(port: int, alert: str) -> list[dict[str, Any]]:
    return [
        a
        for a in api(port, "/api/v1/alerts")["data"]["alerts"]
        if a["labels"].get("alertname") == alert and a["state"] == "firing"
    ]


@pytest.mark.skipif(PROMETHEUS is None, reason=f"the prometheus server is missing: {MISSING}")
def test_a_real_prometheus_raises_the_dead_peer_alert_after_a_kill_9(tmp_path):
    with Swarm(4, env=FROZEN) as sw:
        wait_for_ring(sw)
        targets = ", ".join(f'"127.0.0.1:{m.metrics_port}"' for m in sw.members)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: [{json.dumps(str(MONITORING / 'torchras-alerts.yml'))}]\n"
            f"scrape_configs:\n  - job_name: swarm\n    static_configs:\n      - targets: [{targets}]\n"
        )
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below, after the server
        server = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def healthy() -> list[Any]:
                active = api(port, "/api/v1/targets")["data"]["activeTargets"]
                return [t for t in active if t["health"] == "up"]

            wait_for(healthy, lambda up: len(up) == sw.n, 120, 0.5, what="every member scraped", retry_on=(OSError,))
            groups = api(port, "/api/v1/rules")["data"]["groups"]
            assert {r["name"] for g in groups for r in g["rules"]} >= {"TorchrasPeerDead", "TorchrasPeerHung"}
            time.sleep(3.0)  # a few scrapes of the healthy job, so the counter has samples before the death
            assert not firing(port, "TorchrasPeerDead")
            sw.kill(1)
            alerts = wait_for(lambda: firing(port, "TorchrasPeerDead"), bool, 120, 0.5, what="TorchrasPeerDead firing")
            assert alerts[0]["labels"]["job"] == "swarm"
            assert alerts[0]["labels"]["severity"] == "critical"
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
        wait_until(lambda: server.poll() is not None, 5, what="the server gone")
