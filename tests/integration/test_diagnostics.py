"""DIAGNOSTICS and CONTROL on a real swarm, as an NCCL 2.31 user sends them (reference §9.1-9.2,
docs/protocol.md): a member started with other settings is named, a stopped member makes the report incomplete,
a second request in the same process is BUSY, and bad arguments get an ERROR line on a connection that stays open."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from ras_client import ask, base_port, connect, server_pid, wait_for_report
from rasd.swarm import Swarm

pytestmark = pytest.mark.slow  # every test starts a swarm of real processes

DEADLINE = 20.0  # seconds for a report to say what a test waits for

NCCL_LINE = re.compile(r"^(?P<host>[^:]+):(?P<pid>\d+) NCCL DIAG (?:(?P<tag>\[OK\]|\[INFO\]) +)?(?P<msg>.*)$")


def read_all(sock: socket.socket, timeout: float = 30.0) -> str:
    sock.settimeout(timeout)
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks).decode()


def read_line(sock: socket.socket, timeout: float = 10.0) -> str:
    sock.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data.decode()


def test_a_member_started_with_other_settings_is_named_and_json_carries_the_same(port_env):
    member_env = {2: {"NCCL_ALGO": "Tree"}, 3: {"TORCH_NCCL_BLOCKING_WAIT": "1"}}
    with Swarm(4, env={**port_env, "NCCL_ALGO": "Ring"}, member_env=member_env) as sw:
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        text = ask(port, b"DIAGNOSTICS\n")
        lines = text.splitlines()
        assert all(NCCL_LINE.match(line) for line in lines), text
        bodies = [NCCL_LINE.match(line)["msg"] for line in lines]  # type: ignore[index]
        assert bodies[0] == "=== RAS Diagnostics ===" and "across 4 RAS peers" in bodies[-1]
        assert "NCCL environment: mismatch across 4 ranks for NCCL_ALGO" in bodies
        assert "NCCL environment: NCCL_ALGO=Ring on rank(s) {0,1,3}" in bodies
        assert "NCCL environment: NCCL_ALGO=Tree on rank(s) {2}" in bodies
        assert "TORCH environment: TORCH_NCCL_BLOCKING_WAIT=1 on rank(s) {3}" in bodies
        assert "TORCH environment: TORCH_NCCL_BLOCKING_WAIT=(unset) on rank(s) {0,1,2}" in bodies
        pid = int(NCCL_LINE.match(lines[0])["pid"])  # type: ignore[index]
        assert pid in {m.pid for m in sw.members}
        # The secret the members share is compared as a digest, never shown.
        assert sw.env["TORCHRAS_SECRET"] not in text

        doc = json.loads(ask(port, b"SET FORMAT json\nDIAGNOSTICS\n").removeprefix("OK\n"))["diagnostics"]
        assert doc["peers_count"] == 4 and doc["missing"] == []
        assert {"tag": "INFO", "check": "NCCL environment", "message": "NCCL_ALGO=Tree on rank(s) {2}"} in doc["checks"]
        assert {p["rank"]: p["settings"]["NCCL_ALGO"] for p in doc["processes"]} == {
            0: "Ring",
            1: "Ring",
            2: "Tree",
            3: "Ring",
        }


def test_a_stopped_member_makes_it_incomplete_and_a_second_request_in_that_process_is_busy(port_env):
    env = {**port_env, "TORCHRAS_TIMEOUT_FACTOR": "1"}  # a stopped member is unresponsive after 5 s, not 1 s
    with Swarm(4, env=env) as sw:
        port = base_port(env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        # Two connections to one process, before any member stops (a stopped one never answers the handshake).
        first = connect(port)
        members = [m.pid for m in sw.members]
        serving = server_pid(first, members)
        deadline = time.monotonic() + 60  # the kernel spreads connections over the 4 listeners: 1 in 4 each
        while server_pid(second := connect(port), members) != serving:
            second.close()
            assert time.monotonic() < deadline, "no second connection reached the same process"
        victim = next(m for m in sw.members if m.pid != serving)
        sw.pause(victim.index)
        try:
            # The gather waits up to 3 s on the stopped member's legs (it is not unresponsive yet): meanwhile the
            # process that serves it is busy.
            first.sendall(b"TIMEOUT 3\nDIAGNOSTICS\n")
            assert read_line(first) == "OK\n"
            second.sendall(b"DIAGNOSTICS\n")
            assert read_all(second) == "BUSY: diagnostics already in progress\n"
            report = read_all(first)
            assert re.search(
                rf"NCCL DIAG \[INFO\] Processes: diagnostics incomplete, gathered 3/4 ranks; no answer from rank "
                rf"{victim.index} \S+:{victim.pid}\n",
                report,
            ), report
            assert "across 3 RAS peers" in report
        finally:
            sw.resume(victim.index)
            first.close()
            second.close()


def test_bad_arguments_get_error_lines_and_the_connection_stays_open(port_env):
    with Swarm(2, env=port_env):
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        with connect(port) as s:
            for line, reply in [
                (b"DIAGNOSTICS now\n", "ERROR: Unknown command DIAGNOSTICS now\n"),
                (b"CONTROL\n", "ERROR: Unknown command CONTROL\n"),
                (b"CONTROL PROFILER_MASK\n", "ERROR: Unknown CONTROL subcommand 'PROFILER_MASK'\n"),
                (b"CONTROL PROFILER_MASK coll,bogus\n", "ERROR: Invalid profiler mask value 'coll,bogus'\n"),
                (b"TIMEOUT 1.5\n", "OK\n"),
            ]:
                s.sendall(line)
                assert read_line(s) == reply
            s.sendall(b"CONTROL PROFILER_MASK all\n")
            assert read_line(s).startswith("ERROR: CONTROL PROFILER_MASK all (0x7fff) not applied")
            s.sendall(b"diagnostics\n")
            assert "across 2 RAS peers" in read_all(s)
