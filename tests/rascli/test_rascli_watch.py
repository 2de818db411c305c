"""--watch: the report round after round, with what changed since the previous round marked."""

from __future__ import annotations

import io
import signal

from rascli import watch
from rascli.changes import diff
from rascli.options import parse
from rascli.output import Streams
from rascli.report import parse_report
from rascli_helpers import PATIENT, addr, finish, make_console, rascli_process, read_until, sample


def rounds(server, reports: list[bytes | None], tty: bool = False):
    """Run len(reports) rounds; before each round the server serves that report (``None``: it is gone)."""
    out, err = io.BytesIO(), io.StringIO()
    console = make_console(120) if tty else None
    plan = iter(reports[1:])

    def between(_: float) -> None:
        report = next(plan)
        server.script.hangup = "connect" if report is None else ""
        server.script.report = report or b""

    server.script.report = reports[0]
    options = parse(["--watch", "2"] + addr(server), {})
    code = watch.run(options, PATIENT, Streams(out, err, console), rounds=len(reports), sleep=between)
    return code, out.getvalue().decode(), err.getvalue(), console


def test_diff_names_new_and_resolved_items() -> None:
    healthy, dead = parse_report(sample("healthy.txt").decode()), parse_report(sample("dead.txt").decode())
    changes = diff(healthy, dead)
    assert changes.new_items == {"DEAD", "#0-0 (27a079b828ff1a75) INCOMPLETE", "#2-0 (9c41d0e2b7a3f615) INCOMPLETE"}
    assert changes.changed_rows == {0, 1, 2}
    back = diff(dead, healthy)
    assert set(back.resolved_items) == changes.new_items and not back.new_items
    assert not diff(dead, dead).any
    assert diff(None, dead) == diff(dead, dead)


def test_watch_in_a_pipe(serve) -> None:
    server = serve()
    code, out, err, _ = rounds(
        server, [sample("healthy.txt"), sample("healthy.txt"), sample("dead.txt"), sample("healthy.txt")]
    )
    assert code == 0
    parts = out.split("=== rascli --watch 2s")
    assert len(parts) == 5
    assert sample("healthy.txt").decode() in parts[1] and "---" not in parts[1]
    assert "--- no change since the last report" in parts[2]
    assert sample("dead.txt").decode() in parts[3]
    assert "--- changed since the last report: new: #0-0 (27a079b828ff1a75) INCOMPLETE, " in parts[3]
    assert "resolved: DEAD, #0-0 (27a079b828ff1a75) INCOMPLETE" in parts[4]
    assert server.connections == 4


def test_watch_goes_on_when_a_round_fails(serve) -> None:
    server = serve()
    code, out, _, _ = rounds(server, [sample("healthy.txt"), None, sample("mismatch.txt")])
    assert code == 0
    parts = out.split("=== rascli --watch 2s")
    assert "rascli: the service at" in parts[2] and "closed the connection" in parts[2]
    # the third round is compared with the last report that arrived
    assert "new: #0-0 (27a079b828ff1a75) MISMATCH" in parts[3]


def test_watch_on_a_terminal_marks_what_is_new(serve) -> None:
    server = serve()
    code, _, _, console = rounds(server, [sample("healthy.txt"), sample("mismatch.txt")], tty=True)
    assert code == 0
    screen = console.export_text(styles=False, clear=False)
    last = screen.split("rascli --watch 2s")[-1]
    assert "MISMATCH  NEW" in last
    assert "✘ 1 warning" in last
    styled = console.export_text(styles=True)
    assert "\x1b[7m" in styled  # the changed communicator row is drawn in reverse


def test_ctrl_c_ends_the_watch_cleanly(serve) -> None:
    server = serve(report=sample("healthy.txt"))
    with rascli_process(["--watch", "0.2"] + addr(server)) as client:
        first = read_until(client.stdout, b"========\n\n")
        assert sample("healthy.txt") in first
        client.send_signal(signal.SIGINT)
        _, err = finish(client)
    assert client.returncode == 0
    assert b"Watching stopped by user." in err and b"Traceback" not in err


def test_watch_without_a_number_refreshes_every_two_seconds(serve) -> None:
    server = serve()
    server.script.report = sample("healthy.txt")
    slept: list[float] = []
    out = io.BytesIO()
    options = parse(["--watch"] + addr(server), {})
    code = watch.run(options, PATIENT, Streams(out, io.StringIO(), None), rounds=2, sleep=slept.append)
    assert code == 0
    assert slept == [2.0]
    assert out.getvalue().decode().count("=== rascli --watch 2s") == 2
