"""Restarts as an operator sees them: the RESTART event in MONITOR mode and the Restarts section of the report.

The unit tests drive rascli with a fake server; the last test is a real job (``rasd swarm`` members that report
restarts as ``inprocess.Wrapper`` does, through ``rasd.record_restart``) queried over its client port.
"""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from polling import wait_for
from rascli.changes import describe, diff
from rascli.monitor import event_text
from rascli.report import ReportFormatError, parse_report
from rascli_helpers import addr, closed_port, read_until, run_cli, sample

#: A real event (from a ``rasd swarm``; restarts.txt is the report of the same job).
RESTART_EVENT = (
    b"[2026-11-22 22:56:21] RESTART: Process 11850 on node 127.0.0.1 managing CPU restart 2 (iteration 2) "
    b"after PEER_HUNG of rank 2 (pid 11852): rank 2 terminated, 0.412s lost\n"
)


def test_the_restarts_section_parses_and_keeps_the_job_healthy() -> None:
    report = parse_report(sample("restarts.txt").decode())
    assert report.restarts == (
        "Iteration 2 after 2 restarts",
        "Last restart: PEER_HUNG of rank 2 (pid 11852); rank 2 terminated, 0.412s lost",
        "1 job process is at an older iteration",
        "Process 11852 on node 127.0.0.1 managing CPU at iteration 1",
    )
    assert report.healthy and not report.errors and not report.warnings
    assert [row.errors for row in report.comms or ()] == ["OK", "OK"]
    assert parse_report(sample("healthy.txt").decode()).restarts == ()


@pytest.mark.parametrize(
    "section",
    [
        "\nRestarts\n========\n\n\nErrors",  # empty
        "\nRestarts\n========\n\nIteration 2\n\nErrors",  # not indented
        "\nRestarts\n========\n  Iteration 2\n\nErrors",  # no blank line after the underline
    ],
)
def test_a_damaged_restarts_section_is_refused(section: str) -> None:
    text = sample("healthy.txt").decode().replace("\nErrors", section, 1)
    with pytest.raises(ReportFormatError):
        parse_report(text)


def test_terminal_view_shows_the_restarts_after_what_is_wrong(serve) -> None:
    result = run_cli(addr(serve(report=sample("restarts.txt"))), tty=True, width=100)
    assert result.code == 0 and result.out == b""
    screen = result.screen
    assert screen.splitlines()[0] == "✔ healthy: no errors, no warnings  (iteration 2 after 2 restarts)"
    assert screen.index("Restarts") < screen.index("Communicators") < screen.index("Job summary")
    for line in (
        "Iteration 2 after 2 restarts",
        "Last restart: PEER_HUNG of rank 2 (pid 11852); rank 2 terminated, 0.412s lost",
        "Process 11852 on node 127.0.0.1 managing CPU at iteration 1",
    ):
        assert line in screen
    assert result.console is not None
    assert "\x1b[1;36mRestarts\x1b[0m" in result.console.export_text(styles=True)  # bold cyan: not an error


def test_in_a_pipe_the_report_is_the_jobs_bytes(serve) -> None:
    result = run_cli(addr(serve(report=sample("restarts.txt"))))
    assert result.code == 0 and result.out == sample("restarts.txt")


def test_check_calls_a_job_that_restarted_healthy(serve) -> None:
    server = serve(report=sample("restarts.txt"))
    result = run_cli(["--check"] + addr(server))
    assert result.code == 0, result.out
    assert (
        result.out
        == (
            f"healthy: the job at 127.0.0.1:{server.port} reports no errors and no warnings "
            "(iteration 2 after 2 restarts)\n"
        ).encode()
    )


def test_check_names_the_restarts_of_an_unhealthy_job_too(serve) -> None:
    block = "\nRestarts\n========\n\n  Iteration 1 after 1 restart\n  Last restart: no rank terminated, 0.100s lost\n"
    text = sample("dead.txt").decode().replace("\nErrors\n", block + "\nErrors\n", 1)
    result = run_cli(["--check"] + addr(serve(report=text.encode())))
    assert result.code == 1
    assert result.out.startswith(b"unhealthy: ") and result.out.endswith(b"(iteration 1 after 1 restart)\n")


def test_watch_notices_a_new_restart() -> None:
    before = parse_report(sample("restarts.txt").decode())
    text = sample("restarts.txt").decode().replace("Iteration 2 after 2 restarts", "Iteration 3 after 3 restarts")
    changes = diff(before, parse_report(text))
    assert changes.restarts_changed and changes.any and not changes.new_items
    assert describe(changes) == "changed since the last report: restarts changed"
    assert not diff(before, before).any


def test_monitor_relays_and_colours_restart(serve) -> None:
    piped = run_cli(["-m"] + addr(serve(events=[RESTART_EVENT])))
    assert piped.code == 0 and piped.out == RESTART_EVENT
    text = event_text(RESTART_EVENT.decode().rstrip("\n"))
    assert text.plain == RESTART_EVENT.decode().rstrip("\n")

    def style_of(word: str) -> str:
        start = text.plain.index(word)
        return " ".join(str(span.style) for span in text.spans if span.start <= start < span.end)

    assert style_of("RESTART") == "bold cyan"
    assert "yellow" in style_of("rank 2 terminated")
    assert "bold" in style_of("0.412s lost")
    terminal = run_cli(["-m"] + addr(serve(events=[RESTART_EVENT])), tty=True, width=200)
    assert terminal.screen.rstrip() == RESTART_EVENT.decode().rstrip()
    assert terminal.console is not None
    assert "\x1b[1;36mRESTART\x1b[0m" in terminal.console.export_text(styles=True)


# --- a real job ---------------------------------------------------------------------------------------------------


def _connect(port: int) -> socket.socket:
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", port), 10)
        s.settimeout(3)
        s.sendall(b"CLIENT PROTOCOL 2\n")
        try:
            if s.recv(64) == b"SERVER PROTOCOL 2\n":
                s.settimeout(None)
                return s
        except (TimeoutError, ConnectionResetError):
            pass
        s.close()
    raise AssertionError("no process of the job answered the handshake")


def _next_json_event(sock: socket.socket, kind: str, deadline: float = 30.0) -> dict:
    """Read pretty-printed JSON events (one object each) until one of ``kind`` arrives."""
    decoder, buffer = json.JSONDecoder(), ""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        buffer += read_until(sock, b"}\n", deadline=max(0.1, end - time.monotonic())).decode()
        while buffer.strip():
            try:
                event, used = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                break  # an object still arriving
            buffer = buffer.lstrip()[used:]
            if event.get("event") == kind:
                return event
    raise AssertionError(f"no {kind} event within {deadline}s")


def _status(port: int, command: bytes) -> str:
    with _connect(port) as s:
        s.settimeout(30)
        s.sendall(command)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks).decode()


def _wait_for_status(port: int, predicate, deadline: float = 30.0) -> str:
    return wait_for(lambda: _status(port, b"VERBOSE STATUS\n"), predicate, deadline, 0.2, what="a report")


@pytest.mark.slow
def test_a_real_job_shows_its_restarts(tmp_path) -> None:
    from rasd.swarm import Swarm

    port = closed_port()
    swarm = Swarm(
        2,
        env={
            "TORCHRAS_ADDR": f"127.0.0.1:{port}",
            "TORCHRAS_RUN_DIR": str(tmp_path / "run"),
            "TORCHRAS_SWARM_STEP_S": "0",
        },
    )
    try:
        swarm.start(timeout=60)
        pids = [m.pid for m in swarm.members]
        text_monitor, json_monitor = _connect(port), _connect(port)
        text_monitor.sendall(b"MONITOR\n")
        json_monitor.sendall(b"SET FORMAT json\nMONITOR lifecycle\n")
        assert read_until(text_monitor, b"OK\n") == b"OK\n"
        assert read_until(json_monitor, b"OK\nOK\n") == b"OK\nOK\n"

        # Every rank restarts (each member's node emits RESTART to its own monitor clients).
        for i in range(2):
            swarm.command(i, "restart", "1", "3", "0.25", "PEER_HUNG", "of", "rank", "3")
        seen = read_until(text_monitor, b"lost\n", deadline=30).decode()
        line = next((ln + "\n" for ln in seen.splitlines() if " RESTART: " in ln), seen)
        match = re.fullmatch(
            r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] RESTART: Process (\d+) on node 127\.0\.0\.1 "
            r"managing CPU restart 1 \(iteration 1\) after PEER_HUNG of rank 3: rank 3 terminated, "
            r"0\.250s lost\n",
            line,
        )
        assert match and int(match.group(1)) in pids, line
        event = _next_json_event(json_monitor, "RESTART")
        assert (event["group"], event["event"]) == ("LIFECYCLE", "RESTART")
        assert event["peer"]["pid"] in pids
        assert {k: event[k] for k in ("iteration", "restarts_count", "cause", "terminated_ranks", "seconds_lost")} == {
            "iteration": 1,
            "restarts_count": 1,
            "cause": "PEER_HUNG of rank 3",
            "terminated_ranks": [3],
            "seconds_lost": 0.25,
        }

        # Both members' nodes hold the first restart (the monitors saw one member's event; the other's command may
        # still be on its way) before member 0 restarts once more.
        _wait_for_status(port, lambda r: "Iteration 1 after 1 restart\n" in r and "older iteration" not in r)
        # Member 0 restarts once more, member 1 has not yet: the job is at iteration 2, member 1 behind.
        swarm.command(0, "restart", "2", "-", "1.5", "COMM_STUCK")
        report = _wait_for_status(port, lambda r: "Iteration 2" in r)
        block = (
            "\nRestarts\n========\n\n  Iteration 2 after 2 restarts\n"
            "  Last restart: COMM_STUCK; no rank terminated, 1.500s lost\n"
            "  1 job process is at an older iteration\n"
            f"  Process {pids[1]} on node 127.0.0.1 managing CPU at iteration 1\n\nErrors\n======\n\n"
        )
        assert block in report
        parsed = parse_report(report)
        assert parsed.healthy and parsed.restarts[0] == "Iteration 2 after 2 restarts"
        doc = json.loads(_status(port, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
        assert doc["restarts"] == {
            "iteration": 2,
            "restarts_count": 2,
            "last_cause": "COMM_STUCK",
            "last_terminated_ranks": [],
            "last_seconds_lost": 1.5,
            "processes_behind": [{"host": "127.0.0.1", "pid": pids[1], "iteration": 1}],
        }
        text_monitor.close()
        json_monitor.close()
    finally:
        swarm.close()
