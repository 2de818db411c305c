"""tests/netns.py itself: each host reaches the others, and each fault does what its docstring says."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netns import Network, _list_namespaces, require_namespaces

pytestmark = pytest.mark.slow

# A TCP echo server and a client that prints what happened to one connect + one round trip.
ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000)); s.listen(64); print("up", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(10)
    try:
        while True:
            data = c.recv(65536)
            if not data: break
            c.sendall(data)
    except OSError:
        pass
    c.close()
"""
PROBE = """
import socket, sys, time
start = time.monotonic()
try:
    c = socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2]))
    c.settimeout(float(sys.argv[2])); c.sendall(b"x" * 10)
    got = b""
    while len(got) < 10:
        data = c.recv(10)
        if not data: raise ConnectionError("eof")
        got += data
    print("ok", round(time.monotonic() - start, 4))
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print("error", type(exc).__name__)
"""


def probe(net: Network, src: int, dst: int, timeout: float = 1.0) -> str:
    host = net.hosts[src]
    out = host.run([sys.executable, "-c", PROBE, net.hosts[dst].ip, str(timeout)], timeout=timeout + 20)
    return out.stdout.strip()


@pytest.fixture
def net():
    require_namespaces()
    with Network(3) as network:
        for host in network.hosts:
            server = host.popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
            assert server.stdout.readline().strip() == "up"
        yield network


def test_faults_do_what_they_say(net: Network) -> None:
    a, b, c = net.hosts
    assert probe(net, 0, 1).startswith("ok") and probe(net, 1, 2).startswith("ok")

    with net.partition([a], [b, c]):
        assert probe(net, 0, 1) == "timeout"
        assert probe(net, 2, 0) == "timeout"
        assert probe(net, 1, 2).startswith("ok")  # the rest of the network is unaffected
    assert probe(net, 0, 1).startswith("ok")  # healed

    with net.reject([a], [b]):
        assert probe(net, 0, 1) == "refused"
        assert probe(net, 1, 0) == "refused"
        assert probe(net, 0, 2).startswith("ok")

    down = net.link_down(c)
    assert probe(net, 0, 2) == "timeout"
    down.heal()
    assert probe(net, 0, 2, timeout=5).startswith("ok")

    with net.loss(1.0, [b]):
        assert probe(net, 0, 1) == "timeout"

    with net.delay(b, 0.2, jitter=0.05):
        result = probe(net, 0, 1, timeout=5).split()
        assert result[0] == "ok" and float(result[1]) >= 0.3  # the connect is local to the proxy: 2 x 0.15 s at least
        assert probe(net, 0, 2).startswith("ok")
    result = probe(net, 0, 1, timeout=5).split()
    assert result[0] == "ok" and float(result[1]) < 0.15


def test_close_removes_everything() -> None:
    require_namespaces()
    subprocess.run(["ip", "netns", "add", "trns99999999-h0"], check=True)  # an earlier run that crashed
    net = Network(2)
    assert "trns99999999-h0" not in _list_namespaces()
    names = [h.ns for h in net.hosts] + [net.switch]
    sleeper = net.hosts[0].popen(["sleep", "600"])
    assert set(names) <= set(_list_namespaces())
    net.close()
    assert sleeper.poll() is not None
    assert not set(names) & set(_list_namespaces())
