"""--check: one line and an exit code, for scripts and health probes."""

from __future__ import annotations

import pytest

from rascli_helpers import addr, closed_port, rascli_run, run_cli, sample


@pytest.mark.parametrize(
    "name, code, verdict",
    [
        ("healthy.txt", 0, "healthy: the job at 127.0.0.1:{port} reports no errors and no warnings"),
        ("gpus.txt", 0, "healthy:"),
        ("mismatch.txt", 1, "unhealthy: the job at 127.0.0.1:{port} reports warning #0-0 (27a079b828ff1a75) MISMATCH"),
        (
            "dead.txt",
            1,
            "unhealthy: the job at 127.0.0.1:{port} reports error DEAD; error #0-0 (27a079b828ff1a75) "
            "INCOMPLETE; error #2-0 (9c41d0e2b7a3f615) INCOMPLETE",
        ),
        ("outliers.txt", 1, "warning TIMEOUT"),
        (
            "rasd_faulty_2x4.txt",
            1,
            "error INCOMPLETE; error DEAD; error #0-0 (27a079b828ff1a75) INCOMPLETE; "
            "error #0-0 (27a079b828ff1a75) ERROR; error #1-0 (0000000000001111) INCOMPLETE; "
            "and 3 more\n",
        ),
    ],
)
def test_verdicts(serve, name: str, code: int, verdict: str) -> None:
    server = serve(report=sample(name))
    result = run_cli(["--check"] + addr(server))
    assert result.code == code, result.err
    assert verdict.format(port=server.port) in result.out.decode()
    assert result.out.decode().count("\n") == 1


def test_a_report_that_does_not_parse_is_not_called_healthy(serve) -> None:
    odd = sample("healthy.txt").replace(b"Job summary", b"Job overview")
    result = run_cli(["--check"] + addr(serve(report=odd)))
    assert result.code == 5
    assert "cannot tell whether the job is healthy" in result.err


def test_no_job_is_not_healthy_either() -> None:
    done = rascli_run(["--check", "-h", "127.0.0.1", "-p", str(closed_port())])
    assert done.returncode == 3
    assert done.stdout == b""
