"""The bytes on the wire: the handshake, then only the commands an option asks for, in ncclras's order."""

from __future__ import annotations

import io

import pytest

from rascli import watch
from rascli.options import parse
from rascli.output import Streams
from rascli.protocol import final_command, setup_commands
from rascli_helpers import FAST, PATIENT, addr, run_cli, sample

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


# --- the commands of -D, --stacks and a command given as words (docs/cli.md) ---------------------------------------

#: What a job answers to DIAGNOSTICS or STACKS: a report, then it closes the connection.
REPORT = b"node0:100 NCCL DIAG [OK]   Hosts: 2 ranks on 1 host(s): node0\nnode0:100 NCCL DIAG done\n"


@pytest.mark.parametrize(
    "argv, wire",
    [
        (["-D"], b"CLIENT PROTOCOL 2\nDIAGNOSTICS\n"),
        (["--diagnostics", "-t", "3", "-f", "json"], b"CLIENT PROTOCOL 2\nTIMEOUT 3\nSET FORMAT json\nDIAGNOSTICS\n"),
        (["--stacks"], b"CLIENT PROTOCOL 2\nSTACKS\n"),
        (["--stacks", "--all-threads"], b"CLIENT PROTOCOL 2\nSTACKS ALL\n"),
        (["--stacks", "--all-threads", "-r", "1,3"], b"CLIENT PROTOCOL 2\nSTACKS ALL RANKS 1,3\n"),
        (["--stacks", "-r0-2,5", "-t0"], b"CLIENT PROTOCOL 2\nTIMEOUT 0\nSTACKS RANKS 0-2,5\n"),
    ],
)
def test_diagnostics_and_stacks_send_one_command_and_print_the_report_as_it_came(
    serve, argv: list[str], wire: bytes
) -> None:
    server = serve(report=REPORT)
    result = run_cli(argv + addr(server))
    assert result.code == 0, result.err
    assert server.connections == 1
    assert bytes(server.received[0]) == wire
    assert result.out == REPORT and result.err == ""


@pytest.mark.parametrize(
    "argv, wire",
    [
        (["CONTROL", "PROFILER_MASK", "none"], b"CLIENT PROTOCOL 2\nCONTROL PROFILER_MASK none\n"),
        (
            ["-t", "5", "-f", "text", "control", "profiler_mask", "coll,p2p"],
            b"CLIENT PROTOCOL 2\nTIMEOUT 5\nSET FORMAT text\ncontrol profiler_mask coll,p2p\n",
        ),
    ],
)
def test_a_command_given_as_words_is_sent_as_one_line_after_the_setup(serve, argv: list[str], wire: bytes) -> None:
    server = serve(replies={wire.split(b"\n")[-2].decode().upper(): b"OK\n"})
    result = run_cli(argv + addr(server))
    assert result.code == 0, result.err
    assert bytes(server.received[0]) == wire
    assert result.out == b"OK\n"


@pytest.mark.parametrize(
    "argv, replies, hangup, code",
    [
        # The job refuses a command with an ERROR line and keeps the connection open (NCCL's rule).
        (["CONTROL", "PROFILER_MASK", "all"], {}, "", 5),  # the fake's "ERROR: Unknown command ..."
        (["CONTROL", "PROFILER_MASK", "bogus"], {"CONTROL PROFILER_MASK BOGUS": b"error: invalid\n"}, "", 5),
        (["CONTROL", "PROFILER_MASK", "none"], {"CONTROL PROFILER_MASK NONE": b"OK\n"}, "", 0),
        (["SOMETHING"], {"SOMETHING": b"fine, not an error\n"}, "", 0),
        # Another DIAGNOSTICS runs in the process that took the connection: BUSY, then it closes.
        (["-D"], {"DIAGNOSTICS": b"BUSY: diagnostics already in progress\n"}, "reply", 5),
        (["--stacks", "-r", "3-1"], {"STACKS RANKS 3-1": b"ERROR: Invalid STACKS arguments 'RANKS 3-1'\n"}, "", 5),
        (["--stacks"], {"STACKS": b"ERROR: internal error while building the stacks report\n"}, "reply", 5),
        (["--stacks"], {"STACKS": b"Stacks of 2 of 2 processes\n"}, "reply", 0),
    ],
)
def test_an_error_or_busy_reply_exits_5_and_any_other_exits_0(
    serve, argv: list[str], replies: dict[str, bytes], hangup: str, code: int
) -> None:
    server = serve(replies=replies, hangup=hangup)
    result = run_cli(argv + addr(server))
    assert result.code == code, result.err
    line = bytes(server.received[0]).split(b"\n")[-2].decode()
    assert result.out == replies.get(line.upper(), f"ERROR: Unknown command {line}\n".encode())
    assert "Traceback" not in result.err


def test_a_job_that_closes_without_answering_diagnostics_is_a_protocol_error(serve) -> None:
    server = serve(replies={"DIAGNOSTICS": b""}, hangup="reply")
    result = run_cli(["-D", *addr(server)])
    assert result.code == 5 and "closed the connection without answering 'DIAGNOSTICS'" in result.err


def test_the_final_command_of_each_mode() -> None:
    assert final_command(parse(["-D", "-v"], {})) == "DIAGNOSTICS"
    assert final_command(parse(["--stacks"], {})) == "STACKS"
    assert final_command(parse(["--stacks", "--all-threads"], {})) == "STACKS ALL"
    assert final_command(parse(["--stacks", "-r", "2"], {})) == "STACKS RANKS 2"
    assert final_command(parse(["--stacks", "--all-threads", "--ranks=0,2-3"], {})) == "STACKS ALL RANKS 0,2-3"
    assert final_command(parse(["-v", "CONTROL", "PROFILER_MASK", "0x3"], {})) == "CONTROL PROFILER_MASK 0x3"


STACKS_TEXT = (
    b"Stacks of 3 of 4 processes (main threads), gathered in 2.1 ms; identical stacks folded\n\n"
    b"ranks 0,1 (2 processes on node0, thread MainThread):\n    train.py:40 (train)\n    dist.py:9 (all_reduce)\n\n"
    b"rank 2 (node1:7, thread MainThread):\n    train.py:31 (next_batch)\n    queue.py:171 (get)\n\n"
    b"Not answering (stopped, its RAS thread starved by a GIL hog, or dead and not yet known):\n"
    b"    rank 3 (node1:8): no position seen\n"
)


def test_on_a_terminal_stacks_are_the_jobs_text_styled_where_each_group_waits_standing_out(serve) -> None:
    server = serve(replies={"STACKS": STACKS_TEXT}, hangup="reply")
    result = run_cli(["--stacks", *addr(server)], tty=True)
    assert result.code == 0, result.err
    assert result.out == b""  # drawn on the console, not written raw
    assert result.screen == STACKS_TEXT.decode()  # every line as the job wrote it
    assert result.console is not None
    styled = result.console.export_text(clear=False, styles=True)
    bold_yellow = "\x1b[1;33m"
    assert f"{bold_yellow}    dist.py:9 (all_reduce)" in styled and f"{bold_yellow}    queue.py:171 (get)" in styled
    assert f"{bold_yellow}    train.py:40 (train)" not in styled  # an outer frame: plain
    assert "\x1b[1;31mNot answering" in styled


def test_on_a_terminal_diagnostics_mark_what_differs(serve) -> None:
    text = (
        b"n:1 NCCL DIAG === RAS Diagnostics ===\n"
        b"n:1 NCCL DIAG [OK]   torch version: 2.13.0 consistent across 2 ranks\n"
        b"n:1 NCCL DIAG [INFO] NCCL environment: mismatch across 2 ranks for NCCL_ALGO\n"
        b"n:1 NCCL DIAG RAS diagnostics completed in 1.0 ms across 2 RAS peers\n"
    )
    server = serve(replies={"DIAGNOSTICS": text}, hangup="reply")
    result = run_cli(["-D", *addr(server)], tty=True)
    assert result.code == 0 and result.screen == text.decode()
    assert result.console is not None
    styled = result.console.export_text(clear=False, styles=True)
    assert (
        "\x1b[32mn:1 NCCL DIAG [OK]" in styled and "\x1b[1;33mn:1 NCCL DIAG [INFO] NCCL environment: mismatch" in styled
    )


def test_on_a_terminal_a_cut_reply_still_shows_what_arrived(serve) -> None:
    server = serve(replies={"STACKS": STACKS_TEXT[:120]}, hangup="")  # then silent: the wait for the rest ends
    result = run_cli(["--stacks", "-t", "1", *addr(server)], tty=True, timeouts=FAST)
    assert result.code == 4 and result.screen.startswith("Stacks of 3 of 4 processes")
