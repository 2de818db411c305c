"""The rasd mesh needs its bootstrap store only to start: once formed, it answers STATUS without it.

Three processes form a mesh through a torch TCPStore hosted *inside* member 0 (the classic "rank 0 hosts the
store" pattern, rasd/net/bootstrap.py reads it once per process). Member 0 is then killed (kill -9), store server
and all: the survivors keep their mesh, answer STATUS on the job's client port and report member 0 dead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inprocess_jobs import REPOSITORY, free_ports

sys.path.insert(0, str(REPOSITORY / "tests" / "integration"))

from polling import wait_for
from ras_client import ask

pytestmark = pytest.mark.slow

MEMBER = Path(__file__).with_name("mesh_member.py")
DEADLINE = 120.0  # three processes import torch on 2 busy cores


def status(port: int, deadline: float, predicate) -> str:
    """The job's text report, asked again until ``predicate(report)`` holds (or the deadline passes). Asked again
    too: a port nobody serves yet, a handshake nobody answers (``ask`` fails with an AssertionError)."""
    return wait_for(
        lambda: ask(port, b"STATUS\n", timeout=20),
        predicate,
        deadline - time.monotonic(),
        0.5,
        what="a matching report",
        retry_on=(OSError, AssertionError),
    )


THREE_PROCESSES = "      1          3            0          3        0"  # the job summary: 1 node, 3 processes


def test_the_mesh_answers_status_after_the_store_host_is_gone(tmp_path):
    store_port, client_port = free_ports(2)
    env = dict(
        os.environ,
        TORCHRAS_ADDR=f"localhost:{client_port}",
        TORCHRAS_RUN_DIR=str(tmp_path / "run"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    members = []
    for index in range(3):
        with open(tmp_path / f"member{index}.log", "w") as log:  # the member writes to its own copy
            members.append(
                subprocess.Popen(
                    [sys.executable, str(MEMBER), str(index), str(store_port), "3"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        deadline = time.monotonic() + DEADLINE
        status(client_port, deadline, lambda report: THREE_PROCESSES in report)
        members[0].kill()
        members[0].wait(10)
        with pytest.raises(OSError):  # the bootstrap store went with it
            import socket

            socket.create_connection(("127.0.0.1", store_port), 2).close()
        gone = f"Process {members[0].pid} on node 127.0.0.1 managing CPU"
        # A query that starts in the moment after the kill lists the process as missing before its death is known:
        # wait for the report that names it dead (the assertion below says what it must hold).
        dead = "1 job process is considered dead"
        report = status(client_port, time.monotonic() + 60, lambda report: gone in report and dead in report)
        assert "1 job process is considered dead" in report and THREE_PROCESSES in report, report
        assert all(member.poll() is None for member in members[1:])
    finally:
        for member in members:
            if member.poll() is None:
                member.kill()
            member.wait(10)
