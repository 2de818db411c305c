"""The status report: byte for byte in a pipe and with --no-color, JSON unchanged, and on a terminal drawn with
rich from the parsed text (problems first), falling back to the text whenever it does not parse."""

from __future__ import annotations

import io
import socket

import pytest

from rascli.main import run
from rascli.output import Streams
from rascli_helpers import PATIENT, addr, make_console, rascli_run, run_cli, sample

#: rasd_faulty_2x4.txt is the text of rasd's own renderer (its golden test file), a check on the parser.
TEXT_SAMPLES = ["healthy.txt", "mismatch.txt", "dead.txt", "outliers.txt", "gpus.txt", "rasd_faulty_2x4.txt"]


@pytest.mark.parametrize("name", TEXT_SAMPLES)
def test_text_passthrough_in_a_pipe_is_byte_equal(serve, name: str) -> None:
    server = serve(report=sample(name))
    result = run_cli(["-v"] + addr(server))
    assert result.code == 0, result.err
    assert result.out == sample(name)
    assert result.err == ""


def test_no_color_on_a_terminal_is_byte_equal(serve) -> None:
    server = serve(report=sample("dead.txt"))
    result = run_cli(["--no-color"] + addr(server), tty=True)
    assert result.code == 0
    assert result.out == sample("dead.txt")
    assert result.screen == ""


@pytest.mark.parametrize("tty", [False, True])
@pytest.mark.parametrize("name", ["healthy.json", "rasd_two_comms.json"])
def test_json_passthrough(serve, tty: bool, name: str) -> None:
    server = serve(report=sample(name))
    result = run_cli(["-f", "json"] + addr(server), tty=tty)
    assert result.code == 0, result.err
    assert result.out == sample(name)


def test_a_real_pipe_gets_the_exact_bytes(serve) -> None:
    server = serve(report=sample("outliers.txt"))
    done = rascli_run(["-v", "-t", "10"] + addr(server))
    assert done.returncode == 0, done.stderr
    assert done.stdout == sample("outliers.txt")
    assert done.stderr == b""


def test_terminal_draws_problems_first(serve) -> None:
    server = serve(report=sample("dead.txt"))
    result = run_cli(addr(server), tty=True, width=100)
    assert result.code == 0, result.err
    assert result.out == b""
    screen = result.screen
    assert screen.splitlines()[0].startswith("✘ 3 errors")
    assert screen.index("DEAD") < screen.index("Communicators") < screen.index("Job summary")
    assert "Rank 3 -- CPU managed by process 41874 on node 127.0.0.1" in screen
    assert "#2-0 (9c41d0e2b7a3f615) INCOMPLETE" in screen
    assert "torchras version 0.1.0 with torch 2.13.0" in screen
    # the communicator table keeps every row and value
    rows = [line.split() for line in screen.splitlines() if line.strip().startswith(("0 ", "1 ", "2 "))]
    assert ["0", "1", "1", "3", "4", "3", "RUNNING", "INCOMPLETE"] in rows
    assert ["1", "1", "1", "2", "2", "2", "RUNNING", "OK"] in rows


def test_terminal_colours_statuses_and_errors(serve) -> None:
    server = serve(report=sample("dead.txt"))
    result = run_cli(addr(server), tty=True)
    assert result.console is not None
    html = result.console.export_html(inline_styles=True)
    assert "color: #800000" in html  # red: the Errors panel and INCOMPLETE
    assert "color: #008000" in html  # green: RUNNING and OK


def test_terminal_healthy_and_warning_headlines(serve) -> None:
    healthy = run_cli(addr(serve(report=sample("healthy.txt"))), tty=True)
    assert healthy.screen.splitlines()[0].startswith("✔ healthy: no errors, no warnings")
    assert "Errors (" not in healthy.screen and "Warnings (" not in healthy.screen
    mismatch = run_cli(addr(serve(report=sample("mismatch.txt"))), tty=True)
    assert mismatch.screen.splitlines()[0].startswith("✘ 1 warning")
    assert "Rank 2 has launched up to operation 119" in mismatch.screen


def test_terminal_outlier_layout(serve) -> None:
    result = run_cli(addr(serve(report=sample("outliers.txt"))), tty=True, width=120)
    screen = result.screen
    assert "The outlier node:" in screen
    assert "Node 10.1.0.4 running processes 5101,5102,5103,5104,5105,5106,5107" in screen
    assert "INCOMPLETE,MISMATCH" in screen and "7-8" in screen
    assert screen.index("TIMEOUT") < screen.index("Communicators")


def test_terminal_view_of_a_report_from_rasd(serve) -> None:
    result = run_cli(["-v"] + addr(serve(report=sample("rasd_faulty_2x4.txt"))), tty=True, width=120)
    assert result.code == 0 and result.out == b""
    screen = result.screen
    assert screen.startswith("✘ 6 errors, 2 warnings")
    assert "Rank 5 reported Remote process error -- GPU 1 managed by process 1005 on node 10.0.0.2" in screen
    assert "INCOMPLETE,ERROR,MISMATCH" in screen


def test_terminal_without_communicators(serve) -> None:
    result = run_cli(addr(serve(report=sample("gpus.txt"))), tty=True)
    assert "No communicator data collected!" in result.screen


def test_terminal_falls_back_to_the_text_when_it_does_not_parse(serve) -> None:
    odd = sample("healthy.txt").replace(b"Job summary\n===========", b"Job overview\n============")
    result = run_cli(addr(serve(report=odd)), tty=True)
    assert result.code == 0
    assert result.out == odd
    assert result.screen == ""


def test_narrow_terminal_still_shows_everything(serve) -> None:
    result = run_cli(addr(serve(report=sample("mismatch.txt"))), tty=True, width=60)
    assert result.code == 0
    assert "MISMATCH" in result.screen and "41873" in result.screen


def test_address_from_torchras_addr(serve) -> None:
    server = serve(report=sample("healthy.txt"))
    result = run_cli([], environ={"TORCHRAS_ADDR": f"127.0.0.1:{server.port}"})
    assert result.code == 0 and result.out == sample("healthy.txt")
    done = rascli_run(["-h", "127.0.0.1"], env={"TORCHRAS_ADDR": f"node-that-is-overridden:{server.port}"})
    assert done.returncode == 0 and done.stdout == sample("healthy.txt")


def test_brackets_in_the_report_are_text_not_markup(serve) -> None:
    odd = sample("dead.txt").replace(b"managing CPU\n", b"managing [bold]CPU[/] [/oops]\n")
    result = run_cli(addr(serve(report=odd)), tty=True)
    assert result.code == 0 and result.out == b""
    assert "managing [bold]CPU[/] [/oops]" in result.screen


def test_a_rendering_failure_falls_back_to_the_text(serve, monkeypatch) -> None:
    def broken(report: object) -> object:
        raise RuntimeError("a bug in the view")

    monkeypatch.setattr("rascli.main.render_report", broken)
    result = run_cli(addr(serve(report=sample("dead.txt"))), tty=True)
    assert result.code == 0
    assert result.out == sample("dead.txt") and result.screen == ""


def test_ipv6_address(serve) -> None:
    server = serve(host="::1", report=sample("healthy.txt"))
    result = run_cli([], environ={"TORCHRAS_ADDR": f"[::1]:{server.port}"})
    assert result.code == 0, result.err
    assert result.out == sample("healthy.txt")


def test_every_address_of_the_host_is_tried_in_order(serve, monkeypatch) -> None:
    # A name that resolves to ::1 first and 127.0.0.1 second, where only 127.0.0.1 serves (as when a job binds
    # the first address of localhost and the client's resolver orders them differently).
    server = serve(report=sample("healthy.txt"))
    real = socket.getaddrinfo

    def both(host: str, port: int, *args: object) -> list:
        return real("::1", port, *args) + real("127.0.0.1", port, *args)

    monkeypatch.setattr(socket, "getaddrinfo", both)
    result = run_cli(["-h", "twofold", "-p", str(server.port)])
    assert result.code == 0, result.err
    assert result.out == sample("healthy.txt")
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port, *args: real("::1", port, *args))
    refused = run_cli(["-h", "twofold", "-p", str(server.port)])
    assert refused.code == 3 and f"at twofold:{server.port} (::1: Connection refused)" in refused.err


def test_messages_go_through_the_spinner_terminal_when_there_is_one(serve) -> None:
    server = serve(report=sample("healthy.txt"), handshake=b"SERVER PROTOCOL 3\n")
    screen, progress, err = make_console(), make_console(), io.StringIO()
    code = run(addr(server), Streams(io.BytesIO(), err, screen, None, progress), {}, PATIENT)
    assert code == 0
    assert "rascli: the job speaks RAS protocol '3'" in progress.export_text()
    assert err.getvalue() == ""
    assert screen.export_text().startswith("✔ healthy")
