"""MONITOR mode: events relayed as they come (exact bytes in a pipe, one coloured line each on a terminal), until
the job closes the connection, the job is killed, or Ctrl+C; each ends with a clean message and exit code 0."""

from __future__ import annotations

import signal

from rascli.monitor import BANNER, event_text
from rascli_helpers import addr, fake_server_process, finish, rascli_process, read_until, run_cli

EVENTS = [
    b"[2026-11-21 11:00:00] PEER_NEW: Process 41871 on node 127.0.0.1 managing CPU \n",
    b"[2026-11-21 11:00:07] PEER_DEAD: Process 41874 on node 127.0.0.1 managing CPU \n",
    b"[2026-11-21 11:00:08] COMM_STUCK: #0-0 (27a079b828ff1a75) AllReduce 120 on ranks 0,1,2 waits for rank 3\n",
    b"[2026-11-21 11:00:09] COMM_RECOVERED: #0-0 (27a079b828ff1a75) \n",
]
JSON_EVENT = (
    b'{\n  "timestamp": "2026-11-21 11:00:07",\n  "group": "LIFECYCLE",\n  "event": "PEER_DEAD",\n'
    b'  "peer": {\n    "host": "127.0.0.1",\n    "pid": 41874,\n    "cuda_devs": [],\n'
    b'    "nvml_devs": []\n  },\n  "details": ""\n}\n'
)


def test_events_pass_through_unchanged_in_a_pipe(serve) -> None:
    server = serve(events=EVENTS)
    result = run_cli(["-m"] + addr(server))
    assert result.code == 0
    assert result.out == b"".join(EVENTS)
    assert BANNER in result.err
    assert result.err.rstrip().endswith("Connection closed by the job.")


def test_events_split_across_packets_are_whole_lines_on_a_terminal(serve) -> None:
    pieces = [EVENTS[0][:10], EVENTS[0][10:] + EVENTS[1][:30], EVENTS[1][30:]]
    server = serve(events=pieces, event_gap=0.02)
    result = run_cli(["-m"] + addr(server), tty=True, width=120)
    assert result.code == 0
    assert [line.rstrip() for line in result.screen.splitlines()] == [e.decode().rstrip() for e in EVENTS[:2]]


def style_of(line: bytes, word: str) -> str:
    text = event_text(line.decode().rstrip("\n"))
    start = text.plain.index(word)
    return " ".join(str(span.style) for span in text.spans if span.start <= start < span.end)


def test_terminal_colours_by_meaning(serve) -> None:
    result = run_cli(["-m"] + addr(serve(events=EVENTS)), tty=True, width=140)
    assert result.code == 0
    assert len(result.screen.splitlines()) == len(EVENTS)
    assert result.console is not None
    assert "\x1b[1;31mPEER_DEAD\x1b[0m" in result.console.export_text(styles=True)
    assert style_of(EVENTS[0], "PEER_NEW") == "green"
    assert style_of(EVENTS[1], "PEER_DEAD") == "bold red"
    assert style_of(EVENTS[2], "COMM_STUCK") == "bold red"
    assert style_of(EVENTS[3], "COMM_RECOVERED") == "green"
    assert "cyan" in style_of(EVENTS[1], "Process 41874")


def test_event_text_keeps_unknown_lines() -> None:
    assert event_text("not an event").plain == "not an event"
    line = "[2026-11-21 11:00:00] PEER_HUNG: Process 7 on node 10.0.0.1 managing GPU 1 silent for 5s"
    assert event_text(line).plain == line


def test_json_events_pass_through_even_on_a_terminal(serve) -> None:
    result = run_cli(["-m", "-f", "json"] + addr(serve(events=[JSON_EVENT, JSON_EVENT])), tty=True)
    assert result.code == 0
    assert result.out == JSON_EVENT * 2


def test_monitor_through_a_kill(tmp_path) -> None:
    server, port = fake_server_process(tmp_path, events=EVENTS[:2], close_after_events=False)
    try:
        with rascli_process(["-m", "-h", "127.0.0.1", "-p", str(port)]) as client:
            seen = read_until(client.stdout, EVENTS[1])
            assert seen == EVENTS[0] + EVENTS[1]
            server.kill()  # kill -9: the kernel closes the job's end of the connection
            server.wait(10)
            out, err = finish(client)
            assert client.returncode == 0
            assert out == b""
            assert err.decode().rstrip().endswith("Connection closed by the job.")
            assert b"Traceback" not in err
    finally:
        server.kill()
        server.wait(10)


def test_ctrl_c_ends_the_monitor_cleanly(serve) -> None:
    server = serve(events=EVENTS[:1], close_after_events=False)
    with rascli_process(["-m"] + addr(server)) as client:
        assert read_until(client.stdout, EVENTS[0]) == EVENTS[0]
        client.send_signal(signal.SIGINT)
        _, err = finish(client)
    assert client.returncode == 0
    assert err.decode().rstrip().endswith("Monitoring stopped by user.")
    assert b"Traceback" not in err
