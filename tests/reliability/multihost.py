"""A ``rasd swarm`` spread over the hosts of a ``netns.Network`` (tests/netns.py), and queries from inside a host.

Each member runs inside its host's namespace with ``TORCHRAS_MESH_HOST`` set to the host's address; the members
share the swarm directory (the bootstrap ``FileStore``, event files, control files) through the file system, as
processes of a real job share a store server. Each host has its own loopback, so the members of one host share
their client port there (``TORCHRAS_ADDR=localhost:PORT``) and a client must run inside the host to reach it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from netns import Host, Network
from polling import wait_until
from rasd.swarm import Member, Swarm
from swarm_ring import wait_for_ring

REPO = Path(__file__).resolve().parents[2]
CLIENT_PORT = 28028

# The report of one STATUS query, asked inside a host: the JSON document, or an "error" key.
_ASK = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/.."]  # tests/integration (the client), tests/ (what it imports)
from ras_client import ask
try:
    text = ask(int(sys.argv[2]), b"SET FORMAT json\\nSTATUS\\n", timeout=float(sys.argv[3]))
    print(text.removeprefix("OK\\n"))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


class HostSwarm(Swarm):
    """``n`` members spread evenly over the hosts of ``network``, in index order (member ``i`` lives on host
    ``i * hosts // n``)."""

    def __init__(self, network: Network, n: int, env: dict[str, str] | None = None, workdir: str | None = None) -> None:
        super().__init__(n, env=env, workdir=workdir)
        self.network = network
        self.env.setdefault("TORCHRAS_ADDR", f"localhost:{CLIENT_PORT}")
        self.env.setdefault("TORCHRAS_RUN_DIR", str(self.dir / "endpoints"))

    def __enter__(self) -> HostSwarm:  # Swarm's, typed for this class: ``with HostSwarm(...) as sw`` is one
        super().__enter__()
        return self

    def host_of(self, i: int) -> Host:
        return self.network.hosts[i * len(self.network.hosts) // self.n]

    def on(self, *hosts: Host) -> list[int]:
        """The members on these hosts."""
        return [i for i in range(self.n) if self.host_of(i) in hosts]

    def _spawn(self, i: int) -> Member:
        host = self.host_of(i)
        env = {**self.env, "TORCHRAS_MESH_HOST": host.ip}
        proc = host.popen(
            [sys.executable, "-m", "rasd.swarm", "--dir", str(self.dir), "--index", str(i)],
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(REPO),
        )
        return Member(i, proc)

    def _wait_started(self, m: Member, deadline: float) -> None:
        path = self.dir / f"member-{m.index}.json"

        def started() -> bool:
            assert m.proc.poll() is None, f"swarm member {m.index} ended with {m.proc.returncode} before it started"
            return path.exists()

        wait_until(started, deadline - time.monotonic(), 0.02, what=f"swarm member {m.index} to start")
        info = json.loads(path.read_text())
        m.pid, m.host, m.port = info["pid"], info["host"], info["port"]

    def replace(self, i: int, timeout: float = 60.0) -> Member:
        """Start a new process as member ``i`` on its host (after the old one was killed): a restarted rank."""
        (self.dir / f"member-{i}.json").unlink(missing_ok=True)
        events = self.dir / f"events-{i}.jsonl"
        if events.exists():  # the old process's events stay, apart: events(i) is about the new process only
            events.rename(self.dir / f"events-{i}.{self.members[i].pid}.jsonl.old")
        m = self._spawn(i)
        self.members[i] = m
        self._wait_started(m, time.monotonic() + timeout)
        return m

    def start(self, wait_mesh: bool = True, timeout: float = 60.0) -> HostSwarm:
        self.members = [self._spawn(i) for i in range(self.n)]
        deadline = time.monotonic() + timeout
        for m in self.members:
            self._wait_started(m, deadline)
        if wait_mesh:
            self.wait_for(
                lambda: all(self.peers_known(i) >= self.n for i in range(self.n)),
                timeout=max(1.0, deadline - time.monotonic()),
                what="every member to know every peer",
            )
            # Every ring link ready, not just some link: the tests inject their fault at once (tests/integration/
            # swarm_ring.py says what a fault in the middle of the handshakes would test instead).
            wait_for_ring(self, timeout=max(1.0, deadline - time.monotonic()))
        return self

    def verdicts(self, i: int, kind: str = "PEER_DEAD") -> set[int]:
        """The members that member ``i`` gave a ``kind`` verdict about (by member index)."""
        by_addr = {m.addr: m.index for m in self.members}
        return {by_addr[e["addr"]] for e in self.events(i, kind) if e["addr"] in by_addr}

    def query(self, host: Host, timeout: float = 20.0) -> dict:
        """A JSON STATUS report asked on ``host``'s client port (from inside the host)."""
        done = host.run(
            [sys.executable, "-c", _ASK, str(REPO / "tests" / "integration"), str(CLIENT_PORT), str(timeout)],
            timeout=timeout + 60,
            check=False,
            cwd=str(REPO),
        )
        try:
            return json.loads(done.stdout)
        except ValueError:
            return {"error": f"unreadable answer: {done.stdout[-300:]!r} {done.stderr[-300:]!r}"}


def report_view(doc: dict) -> dict:
    """What a report says about the job, in a form comparable across hosts."""
    if "error" in doc:
        return {"error": doc["error"]}
    ras = doc.get("ras", {})
    return {
        "dead": ras.get("dead_count"),
        "left": ras.get("left_count"),
        "missing": ras.get("missing_processes_count"),
        "communicators": doc.get("communicators_count"),
    }
