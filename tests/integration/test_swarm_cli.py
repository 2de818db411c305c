"""``rasd swarm`` as a user runs it: members it kills or that exit are reaped at once (no zombies), ``quit`` ends
every member with a goodbye (a monitor sees LEFT, never DEAD), and no endpoint file outlives the swarm."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from polling import wait_for
from ports import shifted
from ras_client import connect, free_port_from, server_pid

PEERS = 5
MEMBER_LINE = re.compile(rb"^\s*(\d+)\s+(\d+)\s+\S+:\d+\s*$")


class Output:
    """The swarm's standard output, read without blocking the test."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.text = b""

    def until(self, wanted: bytes, timeout: float = 60.0) -> bytes:
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while wanted not in self.text:
            left = deadline - time.monotonic()
            assert left > 0, f"no {wanted!r} in the swarm's output:\n{self.text.decode(errors='replace')}"
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"the swarm ended:\n{self.text.decode(errors='replace')}"
                self.text += chunk
        return self.text


class Monitor:
    """A MONITOR connection to the swarm's client port, and the member that serves it."""

    def __init__(self, port: int) -> None:
        self.sock = connect(port)
        self.sock.sendall(b"MONITOR\n")
        self.serving = server_pid(self.sock)
        self.text = b""
        self.closed = False

    def read(self, until: bytes | None = None, timeout: float = 30.0) -> bytes:
        """Read until ``until`` arrives (or, without it, until the member closes the connection)."""
        deadline = time.monotonic() + timeout
        while not self.closed and (until is None or until not in self.text):
            left = deadline - time.monotonic()
            assert left > 0, f"monitor waited for {until!r}; got:\n{self.text.decode(errors='replace')}"
            self.sock.settimeout(min(left, 1.0))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            self.closed = not chunk
            self.text += chunk
        return self.text


def zombies(parent: psutil.Process) -> list[int]:
    return [child.pid for child in parent.children() if child.status() == psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_swarm_reaps_its_members_and_quit_ends_them_with_a_goodbye(tmp_path: Path) -> None:
    port = free_port_from(shifted(29900))
    run_dir = tmp_path / "run"
    env = {**os.environ, "TORCHRAS_RUN_DIR": str(run_dir), "TORCHRAS_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rasd.cli",
            "swarm",
            "--peers",
            str(PEERS),
            "--step",
            "0",
            "--timeout-factor",
            "0.5",
            "--addr",
            f"127.0.0.1:{port}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    out = Output(proc)
    monitor: Monitor | None = None
    try:
        table = out.until(b"the job serves its status on")
        members = {int(m.group(1)): int(m.group(2)) for m in map(MEMBER_LINE.match, table.splitlines()) if m}
        assert sorted(members) == list(range(PEERS))
        by_pid = {pid: index for index, pid in members.items()}
        # A monitor on a member with members of lower index beside it: they leave before it, and it sees them go.
        for _ in range(40):
            monitor = Monitor(port)
            if by_pid.get(monitor.serving, 0) >= 2:
                break
            monitor.sock.close()
        assert monitor is not None and by_pid[monitor.serving] >= 2
        serving = by_pid[monitor.serving]
        others = [i for i in range(PEERS) if i != serving]
        keep, victim, leaver = others[0], others[1], others[2]  # keep has a lower index than the monitor's member
        parent = psutil.Process(proc.pid)

        assert proc.stdin is not None
        proc.stdin.write(b"kill %d\nexit %d\n" % (victim, leaver))
        proc.stdin.flush()
        out.until(b"member %d: exit" % leaver)
        assert not psutil.pid_exists(members[victim]) or members[victim] not in {c.pid for c in parent.children()}
        # Both reaped, the one that exited too: the last value is (zombies, children).
        wait_for(
            lambda: (zombies(parent), parent.children()),
            lambda seen: not seen[0] and len(seen[1]) == PEERS - 2,
            30,
            what="the killed and the exited member to be reaped",
        )
        monitor.read(b"PEER_DEAD: Process %d " % members[victim])
        before_quit = len(monitor.read(b"PEER_LEFT: Process %d " % members[leaver]))

        proc.stdin.write(b"quit\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0
        after_quit = monitor.read()[before_quit:].decode(errors="replace")
        assert f"PEER_LEFT: Process {members[keep]} " in after_quit, after_quit
        assert "PEER_DEAD" not in after_quit, after_quit
        for pid in members.values():
            assert not psutil.pid_exists(pid) or psutil.Process(pid).ppid() != proc.pid
        assert sorted(p.name for p in run_dir.iterdir() if p.suffix in (".json", ".tmp")) == []
    finally:
        if monitor is not None:
            monitor.sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
