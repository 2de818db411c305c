"""Every way the other end can fail: one clear message each, a documented exit code, no endless retry, no
traceback."""

from __future__ import annotations

import signal
import socket

import pytest

from rascli.connection import Connection
from rascli.errors import RasCliError
from rascli.protocol import Timeouts, timeout_factor
from rascli_helpers import FAST, addr, closed_port, finish, rascli_process, rascli_run, read_until, run_cli, sample


def test_nothing_listening(serve) -> None:
    port = closed_port()
    result = run_cli(["-h", "127.0.0.1", "-p", str(port)])
    assert result.code == 3
    assert f"cannot connect to the RAS status port at 127.0.0.1:{port}" in result.err
    assert "Connection refused" in result.err
    assert "TORCHRAS_ADDR" in result.err  # not the default address: check -h/-p/TORCHRAS_ADDR
    assert result.out == b""


def test_default_address_hint_points_at_list() -> None:
    # With no -h, -p or TORCHRAS_ADDR the likely mistake is the node, not the address.
    with pytest.raises(RasCliError) as caught:
        Connection.open("127.0.0.1", closed_port(), timeout=5, default_addr=True)
    assert caught.value.code == 3
    assert "Is a torchras job running on this node? 'rascli --list' shows the jobs" in caught.value.message


def test_unknown_host() -> None:
    result = run_cli(["-h", "no-such-host.invalid"])
    assert result.code == 3
    assert "cannot resolve 'no-such-host.invalid'" in result.err


def test_silent_server_is_retried_on_fresh_connections_until_the_deadline(serve) -> None:
    server = serve(handshake=None)
    # -t 0 does not make the handshake wait forever
    result = run_cli(["-t", "0"] + addr(server), timeouts=FAST)
    assert result.code == 4
    assert server.connections >= 2  # each retry is a new connection (a new source port: maybe another process)
    assert result.err.count("retrying on a new connection") == server.connections - 1
    assert f"no answer from 127.0.0.1:{server.port} to 'CLIENT PROTOCOL 2' within 0.5 s; retrying" in result.err
    assert f"no process of the job at 127.0.0.1:{server.port} answered 'CLIENT PROTOCOL 2'" in result.err
    assert f"({server.connections} connections, 0.5 s each)" in result.err
    assert "stopped or hung" in result.err and "--retry-for" in result.err


def test_connections_to_a_stopped_process_are_retried_until_one_answers(serve) -> None:
    # The kernel gives the first connections to a stopped process of the job: more than rascli's three tries of
    # old. Like ncclras, rascli goes on with fresh connections until one reaches a process that answers.
    server = serve(silent_connections=4, report=sample("healthy.txt"))
    result = run_cli(
        ["-t", "3"] + addr(server), timeouts=Timeouts(connect=10, reply=0.5, retry_for=60, report_extra=10)
    )
    assert result.code == 0, result.err
    assert result.out == sample("healthy.txt")
    assert server.connections >= 5
    assert result.err.count("retrying on a new connection") == server.connections - 1
    assert bytes(server.received[-1]) == b"CLIENT PROTOCOL 2\nTIMEOUT 3\nSTATUS\n"


def test_retry_for_option_sets_the_deadline(serve) -> None:
    server = serve(handshake=None)
    quick = Timeouts(connect=2.0, reply=0.5, retry_for=3600.0, report_extra=0.5)  # --retry-for overrides it
    result = run_cli(["--retry-for=0.1"] + addr(server), timeouts=quick)
    assert result.code == 4
    assert "no process of the job" in result.err


def test_a_connect_that_times_out_is_retried_on_a_fresh_connection() -> None:
    # A stopped process whose accept queue is full drops new connections: the connect times out rather than being
    # refused. A fresh connection (another source port) may go to another process, so it is retried too.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # never accepts: once its queue is full, new connections are dropped
        port = full.getsockname()[1]
        queued: list[socket.socket] = []
        try:
            while len(queued) < 16:  # fill the queue (one connection on Linux)
                try:
                    queued.append(socket.create_connection(("127.0.0.1", port), 0.3))
                except TimeoutError:
                    break
            else:
                pytest.skip(
                    "this kernel queued 16 connections on a listen(0) socket without dropping one, so a connect "
                    "that times out cannot be produced here (Linux drops the second)"
                )
            timeouts = Timeouts(connect=0.3, reply=0.5, retry_for=0.5, report_extra=0.5)
            result = run_cli(["-h", "127.0.0.1", "-p", str(port)], timeouts=timeouts)
        finally:
            for sock in queued:
                sock.close()
    assert result.code == 3
    assert f"connecting to 127.0.0.1:{port} timed out; retrying on a new connection" in result.err
    assert f"cannot connect to the RAS status port at 127.0.0.1:{port} (127.0.0.1: timed out)" in result.err


@pytest.mark.parametrize(
    "script, expected",
    [
        (
            {"replies": {"CLIENT PROTOCOL 2": b"HTTP/1.1 400 Bad Request\r\n"}},
            "is not a RAS service: it answered 'HTTP/1.1 400 Bad Request'",
        ),
        ({"greeting": b"SSH-2.0-OpenSSH_9.6\r\n"}, "is not a RAS service: it answered 'SSH-2.0-OpenSSH_9.6'"),
        ({"greeting": b"\x00\xff" * 1000}, "is not a RAS service"),
        (
            {"replies": {"CLIENT PROTOCOL 2": b"garbage without end"}, "hangup": "reply"},
            "closed the connection without answering 'CLIENT PROTOCOL 2': it is not a RAS service",
        ),
        ({"hangup": "connect"}, "closed the connection without answering 'CLIENT PROTOCOL 2'"),
    ],
)
def test_foreign_service(serve, script: dict, expected: str) -> None:
    server = serve(**script)
    result = run_cli(addr(server))
    assert result.code == 5, result.err
    assert expected in result.err
    assert result.out == b""


def test_protocol_version_mismatch_warns_and_goes_on(serve) -> None:
    server = serve(handshake=b"SERVER PROTOCOL 3\n", report=sample("healthy.txt"))
    result = run_cli(addr(server))
    assert result.code == 0
    assert "RAS protocol '3'" in result.err
    assert result.out == sample("healthy.txt")


def test_rejected_timeout(serve) -> None:
    server = serve(replies={"TIMEOUT 10": b"ERROR: Invalid timeout value 10\n"}, report=sample("healthy.txt"))
    result = run_cli(["-t", "10"] + addr(server))
    assert result.code == 5
    assert "the job rejected 'TIMEOUT 10': ERROR: Invalid timeout value 10" in result.err
    assert bytes(server.received[0]) == b"CLIENT PROTOCOL 2\nTIMEOUT 10\n"


def test_rejected_monitor_groups(serve) -> None:
    server = serve(replies={"MONITOR BOGUS": b"ERROR: Invalid event group 'bogus'\n"})
    result = run_cli(["-mbogus"] + addr(server))
    assert result.code == 5
    assert "monitor mode activation failed" in result.err and "Invalid event group 'bogus'" in result.err


@pytest.mark.parametrize("tty", [False, True])
def test_server_that_stops_mid_report(serve, tty: bool) -> None:
    report = sample("dead.txt")
    server = serve(report=report, cut_at=300)
    result = run_cli(addr(server), tty=tty)
    assert result.code == 6
    assert "before the report was complete (300 bytes received)" in result.err
    assert result.out == report[:300]  # what did arrive is shown, as it arrived


def test_json_that_stops_mid_report(serve) -> None:
    server = serve(report=sample("healthy.json"), cut_at=500)
    result = run_cli(["-f", "json"] + addr(server))
    assert result.code == 6
    assert result.out == sample("healthy.json")[:500]


def test_server_that_stalls_mid_report(serve) -> None:
    report = sample("healthy.txt")
    server = serve(report=report, cut_at=120, cut="stall")
    result = run_cli(["-t", "1"] + addr(server), timeouts=FAST)
    assert result.code == 4
    assert "nothing more arrived for 1.5 s (120 bytes received)" in result.err
    assert "gathering timeout is 1 s" in result.err
    assert result.out == report[:120]


def test_server_that_closes_without_a_report(serve) -> None:
    result = run_cli(addr(serve(report=b"")))
    assert result.code == 6
    assert "(0 bytes received)" in result.err


@pytest.mark.parametrize("argv", [["-t", "nope"], ["--frobnicate"], ["-m", "trace"]])
def test_no_traceback_for_bad_options(argv: list[str]) -> None:
    done = rascli_run(argv)
    assert done.returncode == 2
    assert b"Traceback" not in done.stderr and done.stderr.startswith(b"rascli: ")


def test_no_traceback_when_nothing_listens() -> None:
    done = rascli_run(["-h", "127.0.0.1", "-p", str(closed_port())])
    assert done.returncode == 3
    assert b"Traceback" not in done.stderr and b"Connection refused" in done.stderr


def test_ctrl_c_during_a_status_query(serve) -> None:
    report = sample("healthy.txt")
    server = serve(report=report, cut_at=150, cut="stall")
    with rascli_process(["-t", "30"] + addr(server)) as client:
        assert read_until(client.stdout, report[:150]) == report[:150]
        client.send_signal(signal.SIGINT)
        _, err = finish(client)
    assert client.returncode == 130
    assert err == b"rascli: interrupted\n"


def test_the_waits_for_a_report_scale_with_the_jobs_timeout_factor() -> None:
    """The job's default gathering timeout and its hard extra are 5 s x TORCHRAS_TIMEOUT_FACTOR each: a client
    with the job's factor in its environment waits for them (as ncclras 2.31 scales by NCCL_RAS_TIMEOUT_FACTOR)."""
    plain = Timeouts()
    assert plain.report(None) == 5 + plain.report_extra and plain.report(2) == 2 + plain.report_extra
    slow = Timeouts(factor=5.0)
    assert slow.report(None) == 25 + plain.report_extra + 20  # the gather's 25 s, then its hard extra's 20 s more
    assert slow.report(2) == 2 + plain.report_extra + 20 and slow.report(0) is None
    assert Timeouts(factor=0.2).report(None) == 1 + plain.report_extra  # a fast job: never below the extra itself
    warnings: list[str] = []
    assert timeout_factor({"TORCHRAS_TIMEOUT_FACTOR": "5"}, warnings.append) == 5.0 and not warnings
    for bad in ("0", "-1", "nan", "inf", "fast"):
        assert timeout_factor({"TORCHRAS_TIMEOUT_FACTOR": bad}, warnings.append) == 1.0
    assert len(warnings) == 5 and "TORCHRAS_TIMEOUT_FACTOR='fast' is not a positive number" in warnings[-1]
