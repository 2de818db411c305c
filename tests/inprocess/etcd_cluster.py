"""Start real etcd members for tests: one on loopback, or one per network-namespace "host" (tests/netns.py).

etcd comes from Debian's ``etcd-server`` (``./bootstrap`` installs it). Data lives in /dev/shm, so the members'
fsyncs cost nothing on a busy test machine; every member and its data are removed by ``Cluster.close()``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence

from polling import wait_for

Spawn = Callable[..., subprocess.Popen]


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def require_etcd() -> str:
    """The etcd binary; fails (never skips) the calling test when it is missing, saying how to get it."""
    import pytest

    binary = etcd_binary()
    if binary is None:
        pytest.fail("etcd is not installed: run ./bootstrap (apt-get install -y etcd-server)")
    return binary


@dataclasses.dataclass
class Member:
    name: str
    ip: str
    client_port: int
    peer_port: int

    @property
    def endpoint(self) -> str:
        return f"{self.ip}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.ip}:{self.peer_port}"


@dataclasses.dataclass
class Cluster:
    members: list[Member]
    processes: list[subprocess.Popen]
    data: str

    @property
    def endpoints(self) -> str:
        return ",".join(member.endpoint for member in self.members)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.data, ignore_errors=True)


def start(members: Sequence[Member], spawns: Sequence[Spawn] | None = None, timeout: float = 60.0) -> Cluster:
    """Start ``members`` as one cluster (``spawns[i]`` starts member i, default ``subprocess.Popen``), healthy."""
    binary = require_etcd()
    data = tempfile.mkdtemp(prefix="inprocess-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    initial = ",".join(f"{member.name}={member.peer_url}" for member in members)
    processes = []
    cluster = Cluster(list(members), processes, data)
    try:
        for index, member in enumerate(members):
            spawn = spawns[index] if spawns else subprocess.Popen
            with open(os.path.join(data, f"{member.name}.log"), "w") as log:  # the member writes to its own copy
                processes.append(
                    spawn(
                        [
                            binary,
                            "--name",
                            member.name,
                            "--data-dir",
                            os.path.join(data, member.name),
                            "--listen-client-urls",
                            f"http://{member.ip}:{member.client_port}",
                            "--advertise-client-urls",
                            f"http://{member.ip}:{member.client_port}",
                            "--listen-peer-urls",
                            member.peer_url,
                            "--initial-advertise-peer-urls",
                            member.peer_url,
                            "--initial-cluster",
                            initial,
                            "--initial-cluster-state",
                            "new",
                            "--heartbeat-interval",
                            "100",
                            "--election-timeout",
                            "1000",
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + timeout
        for member in members if spawns is None else []:
            wait_healthy(member.endpoint, deadline)
        return cluster
    except BaseException:
        cluster.close()
        raise


def wait_healthy(endpoint: str, deadline: float) -> None:
    """Until the member at ``endpoint`` reports a healthy cluster (it has a leader)."""

    def health() -> str:
        with urllib.request.urlopen(f"http://{endpoint}/health", timeout=2) as reply:
            return reply.read().decode()

    wait_for(
        health,
        lambda reply: '"true"' in reply,
        deadline - time.monotonic(),
        what=f"etcd at {endpoint} to be healthy",
        retry_on=(OSError,),
    )


def single(ports: Sequence[int]) -> Cluster:
    """One member on loopback, client and peer on ``ports`` (two free ports)."""
    return start([Member("solo", "127.0.0.1", ports[0], ports[1])])
