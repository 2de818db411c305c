"""The client port of a real swarm, used the way an operator uses it: ``echo verbose status | nc localhost PORT``.

Each test gets its own port range and endpoint registry (the ``port_env`` fixture, conftest.py), so tests never see
each other's jobs.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from polling import wait_until
from ras_client import ask, base_port, connect, server_pid, wait_for_report
from rasd.swarm import Swarm
from swarm_ring import ring_neighbours, wait_for_ring

pytestmark = pytest.mark.slow  # every test starts a swarm of real processes

DEADLINE = 20.0  # seconds for a report to say what a test waits for


def status(port: int, verbose: bool = True, timeout_cmd: str = "") -> str:
    return ask(port, timeout_cmd.encode() + (b"VERBOSE STATUS\n" if verbose else b"STATUS\n"))


def test_a_healthy_job(port_env):
    with Swarm(4, env=port_env) as sw:
        port = base_port(port_env)
        report = wait_for_report(port, lambda r: "      1          4            0          4        0" in r, DEADLINE)
        lines = report.splitlines()
        assert lines[0].startswith("torchras version ") and " with torch " in lines[0]
        assert "Communicators... (" in report
        assert "    0         1         1         4         4         4   RUNNING      OK" in report
        assert "    1         2         1         2         2         4   RUNNING      OK" in report
        assert report.endswith("Errors\n======\n\nWarnings\n========\n\n")
        doc = json.loads(ask(port, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
        assert doc["communicators_count"] == 3
        assert {r["pid"] for c in doc["communicators"] for r in c["ranks"]} == {m.pid for m in sw.members}
        assert doc["ras"]["timeouts_count"] == 0


def test_a_lagging_rank_is_a_mismatch_that_names_it(port_env):
    with Swarm(4, env=port_env) as sw:
        sw.command(2, "lag", "3")
        report = wait_for_report(base_port(port_env), lambda r: "MISMATCH\n" in r, DEADLINE)
        assert "Communicator ranks have different AllReduce operation counts" in report
        assert f"Rank 2 has launched up to operation 7 -- CPU managed by process {sw.members[2].pid}" in report
        assert "3 ranks have launched up to operation 10" in report


def test_kill_9_is_dead_in_the_report_within_about_a_second(port_env):
    with Swarm(4, env=port_env) as sw:
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        sw.kill(1)
        report = wait_for_report(port, lambda r: "DEAD\n" in r, timeout=10)
        assert "1 job process is considered dead (unreachable via the RAS network)" in report
        assert f"Process {sw.members[1].pid} on node 127.0.0.1 managing CPU" in report
        assert "Missing communicator data from 1 rank" in report


def test_without_fast_death_a_kill_is_incomplete_at_once_and_dead_after_the_limit(port_env):
    env = {**port_env, "TORCHRAS_FAST_DEATH": "0", "TORCHRAS_TIMEOUT_FACTOR": "0.1"}  # dead after 6 s
    with Swarm(4, env=env) as sw:
        port = base_port(env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        wait_for_ring(sw)  # both ring neighbours of member 3 hold a link to it
        sw.kill(3)
        # The neighbours read the EOF before the query (a query racing the EOF counts a leg timeout, as in NCCL).
        neighbours = ring_neighbours(sw, 3)
        wait_until(lambda: all(sw.saw(i, "PEER_DISCONNECTED", 3) for i in neighbours), 10, what="the EOF read")
        first = status(port)
        assert "INCOMPLETE\n  Missing communicator data from 1 job process" in first
        assert "DEAD\n" not in first
        assert "TIMEOUT" not in first  # a closed connection is never waited on
        report = wait_for_report(port, lambda r: "DEAD\n" in r, timeout=30)
        assert "considered dead" in report


def test_sigstop_gives_a_timeout_warning_once_then_fast_queries(port_env):
    env = {**port_env, "TORCHRAS_TIMEOUT_FACTOR": "1"}  # unresponsive after 5 s: the first query is inside that
    with Swarm(4, env=env) as sw:
        port = base_port(env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        sw.pause(2)
        try:
            # A connection that lands on the stopped member (SO_REUSEPORT) gets no handshake: give up on it quickly,
            # so that the query still starts inside the unresponsive limit (on a loaded machine 2 s a try could not).
            first = ask(port, b"VERBOSE STATUS\n", handshake_timeout=0.3)
            assert "TIMEOUT\n  Encountered" in first
            assert "INCOMPLETE" in first
            later = [status(port) for _ in range(3)]
            for report in later:
                assert "INCOMPLETE" in report
                assert "TIMEOUT" not in report
        finally:
            sw.resume(2)


def test_fifty_concurrent_clients_and_idle_ones(port_env):
    with Swarm(4, env=port_env):
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        idle = [socket.create_connection(("localhost", port), 5) for _ in range(10)]
        results: list[str] = []
        errors: list[BaseException] = []

        def one() -> None:
            try:
                results.append(status(port, verbose=False))
            except BaseException as e:  # noqa: BLE001 - collected and reported below
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for s in idle:
            s.close()
        assert not errors
        assert len(results) == 50
        assert all(r.endswith("Warnings\n========\n\n") and "RUNNING" in r for r in results)


def test_overlong_lines_and_garbage_close_only_that_client(port_env):
    with Swarm(3, env=port_env):
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        with connect(port) as s:
            s.sendall(b"x" * 5000)
            s.settimeout(10)
            assert s.recv(100) == b""  # closed silently
        out = ask(port, b"\x00\xff\xfe garbage\nSTATUS \nSTATUS\n")
        assert out.startswith("ERROR: Unknown command \x00\ufffd\ufffd garbage\nERROR: Unknown command STATUS \n")
        assert "RUNNING      OK" in out


def test_monitor_pushes_events_as_they_happen(port_env):
    with Swarm(4, env=port_env) as sw:
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        text = connect(port)
        text.sendall(b"MONITOR\n")
        js = connect(port)
        js.sendall(b"SET FORMAT json\nMONITOR all\n")
        for s in (text, js):
            s.settimeout(20)
        assert text.recv(3) == b"OK\n"
        # Kill a member that serves neither monitor (a monitor served by the victim just ends, as in NCCL).
        serving = {server_pid(text), server_pid(js)}
        victim = next(m.index for m in sw.members if m.pid not in serving)
        sw.kill(victim)
        got = b""
        while b"PEER_DEAD" not in got:
            got += text.recv(4096)
        line = got.decode().splitlines()[-1]
        gone = f"PEER_DEAD: Process {sw.members[victim].pid} on node 127.0.0.1 managing CPU"
        assert line.startswith("[") and gone in line
        raw = b""
        events: list[dict] = []
        while not any(e["event"] == "PEER_DEAD" for e in events):
            raw += js.recv(4096)
            body = raw.decode()
            while body.startswith("OK\n"):  # the replies to SET FORMAT and MONITOR
                body = body[3:]
            # Each event is one pretty-printed object whose closing brace starts a line.
            events = [json.loads(chunk + "}") for chunk in body.split("\n}\n")[:-1]]
        dead = next(e for e in events if e["event"] == "PEER_DEAD")
        assert dead["group"] == "LIFECYCLE" and dead["peer"]["pid"] == sw.members[victim].pid
        text.close()
        js.close()


def test_two_jobs_on_one_node_serve_different_ports(port_env):
    with Swarm(2, env=port_env) as a, Swarm(2, env=port_env) as b:
        first, second = base_port(port_env), base_port(port_env) + 1
        ra = wait_for_report(first, lambda r: "RUNNING      OK" in r, DEADLINE)
        rb = wait_for_report(second, lambda r: "RUNNING      OK" in r, DEADLINE)
        pids_a = {m.pid for m in a.members}
        pids_b = {m.pid for m in b.members}
        for _ in range(5):
            doc_a = json.loads(ask(first, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
            doc_b = json.loads(ask(second, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
            assert {r["pid"] for c in doc_a["communicators"] for r in c["ranks"]} == pids_a
            assert {r["pid"] for c in doc_b["communicators"] for r in c["ranks"]} == pids_b
        regs = [json.loads(p.read_text()) for p in Path(port_env["TORCHRAS_RUN_DIR"]).glob("*.json")]
        assert {(r["port"], r["pid"]) for r in regs} == {(first, p) for p in pids_a} | {(second, p) for p in pids_b}
        assert ra and rb


def test_a_port_taken_by_another_program(port_env):
    base = base_port(port_env)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", base))
    blocker.listen(1)
    try:
        # With the default address the job moves to the next free port.
        with Swarm(2, env=port_env):
            assert "RUNNING      OK" in wait_for_report(base + 1, lambda r: "RUNNING      OK" in r, DEADLINE)
        # With an explicit address it runs without a client port; the mesh still works.
        env = {**port_env, "TORCHRAS_ADDR": f"localhost:{base}"}
        with Swarm(3, env=env) as sw:
            with socket.socket() as probe:
                probe.settimeout(2)
                probe.connect(("127.0.0.1", base))  # only the blocker listens there
            sw.kill(0)
            sw.wait_for(lambda: all(sw.saw(i, "PEER_DEAD", 0) for i in (1, 2)), 10, "PEER_DEAD")
    finally:
        blocker.close()


def test_an_explicit_address_per_process_is_served_even_where_the_job_serves_another(port_env):
    """``TORCHRAS_ADDR`` is the process's own setting, as ``NCCL_RAS_ADDR`` is: member 1 serves its explicit port
    although member 0 serves the default, and neither follows the other (before, member 1 joined member 0's port
    and logged a false "held by another job or program", or member 0 followed member 1's; issue 42, item 5)."""
    base = base_port(port_env)
    own = base + 7
    with Swarm(2, env=port_env, member_env={1: {"TORCHRAS_ADDR": f"localhost:{own}"}}) as sw:
        for port in (base, own):
            assert "RUNNING      OK" in wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        regs = [json.loads(p.read_text()) for p in Path(port_env["TORCHRAS_RUN_DIR"]).glob("*.json")]
        assert {(r["port"], r["pid"], r["explicit"]) for r in regs} == {
            (base, sw.members[0].pid, False),
            (own, sw.members[1].pid, True),
        }
        assert [m.client_port for m in sw.members] == [base, own]


def test_echo_status_piped_into_nc_gets_the_whole_report(port_env):
    # `echo verbose status | nc localhost 28028`: nc half-closes its side once stdin ends, before the report.
    with Swarm(3, env=port_env):
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        for _ in range(3):
            with socket.create_connection(("localhost", port), 5) as s:
                s.sendall(b"verbose status\n")
                s.shutdown(socket.SHUT_WR)
                s.settimeout(20)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            if out:  # an empty answer only if the connection landed on a process being torn down
                break
        text = out.decode()
        assert text.startswith("torchras version ") and text.endswith("Warnings\n========\n\n")
        assert "RUNNING      OK" in text


def test_echo_monitor_piped_into_nc_is_closed_as_nccl_does(port_env):
    # `echo monitor | nc localhost 28028`: NCCL reads the EOF of a client in command mode (monitoring is command
    # mode) and closes it, so such a pipe gets no events. We send the replies already due first (NCCL may drop
    # them: it closes at once, before its next write).
    with Swarm(3, env=port_env):
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, DEADLINE)
        sent_and_answered = [
            (b"monitor\n", b"OK\n"),
            (b"MONITOR  all\n", b"OK\n"),
            (b"CLIENT PROTOCOL 2\nMONITOR trace\n", b"SERVER PROTOCOL 2\nOK\n"),
        ]
        for sent, answered in sent_and_answered:
            with socket.create_connection(("localhost", port), 5) as s:
                s.sendall(sent)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(DEADLINE)  # a connection kept open for events times out here
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            assert out == answered  # the replies already due, then the end of the connection


def test_clients_past_the_bound_get_an_error_line(port_env, monkeypatch):
    from rasd.services import client_port

    with Swarm(1, env=port_env):
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING" in r, DEADLINE)
        held = [socket.create_connection(("localhost", port), 5) for _ in range(client_port.MAX_CLIENTS)]
        try:
            for s in held[:3]:  # the held ones are served
                s.sendall(b"CLIENT PROTOCOL 2\n")
                s.settimeout(10)
                assert s.recv(64) == b"SERVER PROTOCOL 2\n"
            with socket.create_connection(("localhost", port), 5) as extra:
                extra.settimeout(10)
                reply = extra.recv(200)
            assert reply == f"ERROR: Too many client connections (limit {client_port.MAX_CLIENTS})\n".encode()
        finally:
            for s in held:
                s.close()
        assert "RUNNING" in status(port)


def test_a_job_of_one_process_gets_the_head_then_the_report(port_env):
    """A gather with no one to ask ends as it starts: its report still comes after the head, which the client port
    writes once the gather's request is out (rasd/services/client_port.py)."""
    with Swarm(1, env=port_env):
        port = base_port(port_env)
        report = wait_for_report(port, lambda r: "Errors\n======" in r, DEADLINE)
        assert report.startswith("torchras version ")
        assert report.index("Job summary") < report.index("Communicators...") < report.index("Errors\n======")
