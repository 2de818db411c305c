"""The bytes on the wire: the handshake, then only the commands an option asks for, in ncclras's order."""

from __future__ import annotations

import io

import pytest

from rascli import watch
from rascli.options import parse
from rascli.output import Streams
from rascli.protocol import final_command, setup_commands
from rascli_helpers import PATIENT, addr, run_cli, sample

EVENT = b"[2026-11-21 11:00:00] PEER_NEW: Process 41871 on node 127.0.0.1 managing CPU \n"


@pytest.mark.parametrize(
    "argv, wire",
    [
        ([], b"CLIENT PROTOCOL 2\nSTATUS\n"),
        (["-v"], b"CLIENT PROTOCOL 2\nVERBOSE STATUS\n"),
        (["-t", "10"], b"CLIENT PROTOCOL 2\nTIMEOUT 10\nSTATUS\n"),
        (["-v", "-t", "10"], b"CLIENT PROTOCOL 2\nTIMEOUT 10\nVERBOSE STATUS\n"),
        (["-t0"], b"CLIENT PROTOCOL 2\nTIMEOUT 0\nSTATUS\n"),
        (["-f", "text"], b"CLIENT PROTOCOL 2\nSET FORMAT text\nSTATUS\n"),
        (["-f", "JSON", "-v"], b"CLIENT PROTOCOL 2\nSET FORMAT JSON\nVERBOSE STATUS\n"),
        (["-v", "-f", "json", "-t", "3"], b"CLIENT PROTOCOL 2\nTIMEOUT 3\nSET FORMAT json\nVERBOSE STATUS\n"),
        (["--check"], b"CLIENT PROTOCOL 2\nSTATUS\n"),
        (["--check", "-v", "-t5"], b"CLIENT PROTOCOL 2\nTIMEOUT 5\nVERBOSE STATUS\n"),
        (["--no-color", "-v"], b"CLIENT PROTOCOL 2\nVERBOSE STATUS\n"),
    ],
)
def test_status_sequences(serve, argv: list[str], wire: bytes) -> None:
    report = sample("healthy.json") if any(a.lower().endswith("json") for a in argv) else sample("healthy.txt")
    server = serve(report=report)
    result = run_cli(argv + addr(server))
    assert result.code == 0, result.err
    assert server.connections == 1
    assert bytes(server.received[0]) == wire


@pytest.mark.parametrize(
    "argv, wire",
    [
        (["-m"], b"CLIENT PROTOCOL 2\nMONITOR\n"),
        (["-mtrace"], b"CLIENT PROTOCOL 2\nMONITOR trace\n"),
        (["--monitor=lifecycle,trace"], b"CLIENT PROTOCOL 2\nMONITOR lifecycle,trace\n"),
        (["-m", "-t", "2"], b"CLIENT PROTOCOL 2\nTIMEOUT 2\nMONITOR\n"),
        (["-mall", "-f", "json"], b"CLIENT PROTOCOL 2\nSET FORMAT json\nMONITOR all\n"),
    ],
)
def test_monitor_sequences(serve, argv: list[str], wire: bytes) -> None:
    server = serve(events=[EVENT])
    result = run_cli(argv + addr(server))
    assert result.code == 0, result.err
    assert bytes(server.received[0]) == wire


def test_watch_sends_one_status_per_round(serve) -> None:
    server = serve(report=sample("healthy.txt"))
    options = parse(["--watch", "1", "-v", "-t", "4"] + addr(server), {})
    watch.run(options, PATIENT, Streams(io.BytesIO(), io.StringIO()), rounds=3, sleep=lambda s: None)
    assert server.connections == 3
    assert all(bytes(r) == b"CLIENT PROTOCOL 2\nTIMEOUT 4\nVERBOSE STATUS\n" for r in server.received)


def test_list_does_not_touch_the_network(serve, tmp_path) -> None:
    server = serve(report=sample("healthy.txt"))
    result = run_cli(
        ["--list"], environ={"TORCHRAS_RUN_DIR": str(tmp_path), "TORCHRAS_ADDR": f"127.0.0.1:{server.port}"}
    )
    assert result.code == 0
    assert server.connections == 0


def test_command_functions() -> None:
    assert setup_commands(parse(["-t", "9", "-f", "Json"], {})) == ["TIMEOUT 9", "SET FORMAT Json"]
    assert final_command(parse(["-m"], {})) == "MONITOR"
    assert final_command(parse(["-v"], {})) == "VERBOSE STATUS"
