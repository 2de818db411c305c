"""rascli against a real job: a ``rasd swarm`` of RAS processes serving the real client port.

A recording relay sits between rascli and the job's port where a test needs the exact bytes of both directions.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from polling import wait_until
from rascli.report import parse_report
from rascli_helpers import RecordingProxy, closed_port, finish, rascli_process, rascli_run, read_until, run_cli
from rasd.swarm import Swarm

pytestmark = pytest.mark.slow  # every test starts a swarm of real processes

PEERS = 4


def start_swarm(n: int, run_dir: Path) -> tuple[Swarm, int]:
    port = closed_port()
    swarm = Swarm(
        n, env={"TORCHRAS_ADDR": f"127.0.0.1:{port}", "TORCHRAS_RUN_DIR": str(run_dir), "TORCHRAS_SWARM_STEP_S": "0"}
    )
    try:
        swarm.start(timeout=60)
    except BaseException:
        swarm.close()
        raise
    return swarm, port


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Swarm, int, Path]]:
    """A healthy swarm shared by the tests that leave it as it is."""
    run_dir = tmp_path_factory.mktemp("run")
    swarm, port = start_swarm(PEERS, run_dir)
    try:
        yield swarm, port, run_dir
    finally:
        swarm.close()


@pytest.fixture
def relay(job: tuple[Swarm, int, Path]) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(("127.0.0.1", job[1]))
    try:
        yield proxy
    finally:
        proxy.close()


def via(proxy: RecordingProxy) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(proxy.port)]


@pytest.mark.parametrize(
    "argv, wire",
    [
        ([], b"CLIENT PROTOCOL 2\nSTATUS\n"),
        (["-v", "-t", "10"], b"CLIENT PROTOCOL 2\nTIMEOUT 10\nVERBOSE STATUS\n"),
        (["-t0", "-f", "TEXT"], b"CLIENT PROTOCOL 2\nTIMEOUT 0\nSET FORMAT TEXT\nSTATUS\n"),
        (["-v", "-f", "json"], b"CLIENT PROTOCOL 2\nSET FORMAT json\nVERBOSE STATUS\n"),
    ],
)
def test_the_job_accepts_each_sequence_and_rascli_prints_its_bytes(
    relay: RecordingProxy, argv: list[str], wire: bytes
) -> None:
    done = rascli_run(argv + via(relay))
    assert done.returncode == 0, done.stderr
    assert bytes(relay.sent[0]) == wire
    answered = bytes(relay.answered[0])
    handshake = b"SERVER PROTOCOL 2\n" + b"OK\n" * (argv.count("-t") + argv.count("-t0") + argv.count("-f"))
    assert answered.startswith(handshake)
    assert done.stdout == answered[len(handshake) :]  # the report, byte for byte
    if "json" in argv:
        report = json.loads(done.stdout)
        assert report["communicators_count"] == len(report["communicators"]) > 0 and report["torchras_version"]
    else:
        text = parse_report(done.stdout.decode())
        assert text.healthy and text.version_lines[0].startswith("torchras version ")


def test_terminal_view_of_the_real_report(job: tuple[Swarm, int, Path]) -> None:
    result = run_cli(["-v", "-h", "127.0.0.1", "-p", str(job[1])], tty=True)
    assert result.code == 0, result.err
    assert result.out == b""  # drawn, not passed through: the real text parsed
    assert result.screen.startswith("✔ healthy: no errors, no warnings")
    assert "RUNNING" in result.screen and "torchras version" in result.screen


def test_check_and_list_on_a_healthy_job(job: tuple[Swarm, int, Path]) -> None:
    swarm, port, run_dir = job
    check = rascli_run(["--check", "-h", "127.0.0.1", "-p", str(port)])
    assert check.returncode == 0 and check.stdout.startswith(b"healthy:")
    listed = rascli_run(["--list"], env={"TORCHRAS_RUN_DIR": str(run_dir)})
    assert listed.returncode == 0
    rows = [line.split() for line in listed.stdout.decode().splitlines()[1:]]
    assert [(row[0], row[2]) for row in rows] == [(str(port), str(PEERS))]


def _serving_pid(client_pid: int, port: int, members: list[int]) -> int | None:
    """The job process that accepted rascli's connection (the kernel picks one of those sharing the port)."""
    mine = [c.laddr.port for c in psutil.Process(client_pid).net_connections("tcp") if c.raddr and c.raddr.port == port]
    for pid in members:
        for conn in psutil.Process(pid).net_connections("tcp"):
            if conn.laddr.port == port and conn.raddr and conn.raddr.port in mine:
                return pid
    return None


def test_a_stopped_job_process_is_skipped_or_reported(job: tuple[Swarm, int, Path]) -> None:
    """SIGSTOP one process: a connection the kernel hands to it goes unanswered. rascli tries again on a fresh
    connection, a bounded number of times: it answers with the report or with a clear timeout, never hangs."""
    swarm, port, _ = job
    swarm.pause(PEERS - 1)
    try:
        done = rascli_run(["-t", "2", "-h", "127.0.0.1", "-p", str(port)], timeout=60)
    finally:
        swarm.resume(PEERS - 1)
    assert b"Traceback" not in done.stderr
    if done.returncode == 4:  # every attempt happened to reach the stopped process
        assert b"may be hung" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert parse_report(done.stdout.decode()).comms is not None


# This one kills processes of the shared job, so it comes last.
def test_monitor_through_kills(job: tuple[Swarm, int, Path]) -> None:
    swarm, port, _ = job
    with rascli_process(["-m", "-h", "127.0.0.1", "-p", str(port)]) as client:
        assert b"RAS Monitor Mode" in read_until(client.stderr, b"=" * 64)
        members = [m.pid for m in swarm.members]
        serving = wait_until(lambda: _serving_pid(client.pid, port, members), 10, 0.05, what="the serving member")
        victim = next(pid for pid in members if pid != serving)
        os.kill(victim, signal.SIGKILL)  # a crash: the job knows within seconds
        seen = read_until(client.stdout, b"PEER_DEAD: Process %d " % victim, deadline=30)
        assert b"PEER_DEAD: Process %d on node 127.0.0.1" % victim in seen
        assert all(line.startswith(b"[") for line in seen.splitlines())
        os.kill(serving, signal.SIGKILL)  # the process serving the monitor dies: the kernel closes it
        _, err = finish(client, timeout=20)
        assert client.returncode == 0
        assert err.decode().rstrip().endswith("Connection closed by the job.")
        assert b"Traceback" not in err
    check = rascli_run(["--check", "-v", "-h", "127.0.0.1", "-p", str(port)])
    assert check.returncode == 1
    assert b"error DEAD" in check.stdout
