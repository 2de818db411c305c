"""Options: ncclras's options with its defaults, the getopt conventions, TORCHRAS_ADDR, and clear usage errors."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rascli.errors import Exit, RasCliError
from rascli.options import DEFAULT_PORT, Options, parse, parse_addr
from rascli_helpers import run_cli


def test_defaults_are_ncclras_defaults() -> None:
    options = parse([], {})
    assert (options.host, options.port, options.timeout, options.verbose, options.format, options.monitor) == (
        "localhost",
        28028,
        None,
        False,
        None,
        None,
    )
    assert options.default_addr


def test_h_is_host_not_help() -> None:
    assert parse(["-h", "node7"], {}).host == "node7"
    assert parse(["--host=node7"], {}).host == "node7"
    assert not parse(["-h", "node7"], {}).default_addr


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["-p", "1234"], {"port": 1234}),
        (["--port", "1234"], {"port": 1234}),
        (["-p1234"], {"port": 1234}),
        (["-t", "10"], {"timeout": 10}),
        (["-t0"], {"timeout": 0}),
        (["--timeout=7"], {"timeout": 7}),
        (["-v"], {"verbose": True}),
        (["-vt10"], {"verbose": True, "timeout": 10}),
        (["-f", "JSON"], {"format": "JSON"}),
        (["--format=text"], {"format": "text"}),
        (["-m"], {"monitor": ""}),
        (["-mtrace"], {"monitor": "trace"}),
        (["--monitor"], {"monitor": ""}),
        (["--monitor=lifecycle,trace"], {"monitor": "lifecycle,trace"}),
        (["-vmall"], {"verbose": True, "monitor": "all"}),
        (["--verb", "--watch", "2.5"], {"verbose": True, "watch": 2.5}),
        (["--watch"], {"watch": 2.0}),  # with no number, every 2 s (as watch(1))
        (["--watch", "-v"], {"watch": 2.0, "verbose": True}),
        (["--wat", "--timeout", "3"], {"watch": 2.0, "timeout": 3}),
        (["--watch=0.5"], {"watch": 0.5}),
        (["--watch", "10", "-v"], {"watch": 10.0, "verbose": True}),
        (["--check"], {"check": True}),
        (["--list"], {"list": True}),
        (["--no-color"], {"no_color": True}),
        ([], {"retry_for": None}),  # the default (protocol.DEFAULT_RETRY_FOR)
        (["--retry-for", "120"], {"retry_for": 120.0}),
        (["--retry=2.5"], {"retry_for": 2.5}),
        (["--retry-for=0"], {"retry_for": float("inf")}),  # forever, as ncclras
        ([], {"diagnostics": False, "stacks": False, "all_threads": False, "ranks": None, "command": None}),
        (["-D"], {"diagnostics": True}),
        (["--diagnostics"], {"diagnostics": True}),
        (["--diag", "-t", "3"], {"diagnostics": True, "timeout": 3}),
        (["-Dv"], {"diagnostics": True, "verbose": True}),
        (["--stacks"], {"stacks": True, "all_threads": False, "ranks": None}),
        (["--stacks", "--all-threads"], {"stacks": True, "all_threads": True}),
        (["--stacks", "-r", "0,2-3"], {"stacks": True, "ranks": "0,2-3"}),
        (["--stacks", "-r0,2-3"], {"stacks": True, "ranks": "0,2-3"}),
        (["--stacks", "--ranks=7"], {"stacks": True, "ranks": "7"}),
        (["--stacks", "--all", "--ranks", "1-1,5"], {"stacks": True, "all_threads": True, "ranks": "1-1,5"}),
        # Words after the options are one command, as ncclras 2.31 takes them: joined by single blanks.
        (["CONTROL", "PROFILER_MASK", "none"], {"command": "CONTROL PROFILER_MASK none"}),
        (["-t", "5", "control", "profiler_mask", "coll,p2p"], {"command": "control profiler_mask coll,p2p"}),
        (["STATUS", "-p", "9"], {"command": "STATUS", "port": 9}),  # options may follow the words
        (["-f", "json", "DIAGNOSTICS"], {"command": "DIAGNOSTICS", "format": "json", "diagnostics": False}),
    ],
)
def test_options(argv: list[str], expected: dict[str, object]) -> None:
    options = parse(argv, {})
    for name, value in expected.items():
        assert getattr(options, name) == value, name


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-t", "x"], "invalid timeout 'x'"),
        (["-t", "-1"], "invalid timeout '-1'"),
        (["-t", "1.5"], "invalid timeout '1.5'"),
        (["-f", "xml"], "invalid format 'xml' (must be text or json)"),
        (["-p", "0"], "invalid port '0'"),
        (["-p", "http"], "invalid port 'http'"),
        (["-x"], "invalid option -- 'x'"),
        (["--bogus"], "unrecognized option '--bogus'"),
        (["--verbose=yes"], "doesn't allow an argument"),
        (["-h"], "requires an argument -- 'h'"),
        (["--port"], "option '--port' requires an argument"),
        (["-m", "trace"], "monitor groups must be attached: -mtrace or --monitor=trace"),
        (["-m", "trace", "more"], "monitor groups must be attached: -mtrace or --monitor=trace"),
        (["-m", "--check"], "--monitor and --check cannot be used together"),
        (["--watch", "0"], "invalid --watch interval '0'"),
        (["--watch", "nan"], "invalid --watch interval"),
        (["--watch", "-1"], "invalid --watch interval '-1'"),
        (["--watch="], "invalid --watch interval ''"),
        (["--watch", "soon"], "--watch and the command 'soon' cannot be used together"),
        (["--check", "-f", "json"], "--check reads the text report"),
        (["--watch=1", "-fjson"], "--watch reads the text report"),
        (["--list", "--check"], "--check and --list cannot be used together"),
        (["--retry-for", "-1"], "invalid --retry-for '-1'"),
        (["--retry-for=soon"], "invalid --retry-for 'soon'"),
        (["--retry-for=inf"], "invalid --retry-for 'inf'"),
        (["--retry-for"], "option '--retry-for' requires an argument"),
        (["--stacks", "-r", "x"], "invalid --ranks 'x' (ranks and ranges: 0,2,5-7)"),
        (["--stacks", "-r", "1,,2"], "invalid --ranks '1,,2'"),
        (["--stacks", "-r", "-1"], "invalid --ranks '-1'"),
        (["--stacks", "--ranks=2-"], "invalid --ranks '2-'"),
        (["--stacks", "--ranks="], "invalid --ranks ''"),
        (["--stacks", "-r"], "option requires an argument -- 'r'"),
        (["-r", "1"], "--all-threads, --native and --ranks go with --stacks"),
        (["--all-threads"], "--all-threads, --native and --ranks go with --stacks"),
        (["-D", "--all-threads"], "--all-threads, --native and --ranks go with --stacks"),
        (["--native"], "--all-threads, --native and --ranks go with --stacks"),
        (["-D", "--stacks"], "--diagnostics and --stacks cannot be used together"),
        (["-D", "-m"], "--monitor and --diagnostics cannot be used together"),
        (["--stacks", "--check"], "--check and --stacks cannot be used together"),
        (["--stacks", "--watch"], "--watch and --stacks cannot be used together"),
        (["-D", "CONTROL", "PROFILER_MASK", "none"], "--diagnostics and the command 'CONTROL PROFILER_MASK none'"),
        (["--stacks", "STACKS"], "--stacks and the command 'STACKS' cannot be used together"),
        (["-m", "STATUS"], "monitor groups must be attached: -mSTATUS or --monitor=STATUS"),
        (["-mtrace", "STATUS"], "--monitor and the command 'STATUS' cannot be used together"),
        (["--list", "CONTROL"], "--list and the command 'CONTROL' cannot be used together"),
    ],
)
def test_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(RasCliError) as caught:
        parse(argv, {})
    assert caught.value.code == Exit.USAGE
    assert message in caught.value.message
    result = run_cli(argv)
    assert result.code == 2
    assert message in result.err and "rascli --help" in result.err
    assert result.out == b""


def test_addr_from_environment() -> None:
    options = parse([], {"TORCHRAS_ADDR": "node3:29000"})
    assert (options.host, options.port, options.default_addr) == ("node3", 29000, False)
    assert parse([], {"TORCHRAS_ADDR": "[::1]:29001"}).host == "::1"
    assert parse(["-p", "5"], {"TORCHRAS_ADDR": "node3:29000"}).host == "node3"
    assert parse(["-h", "other"], {"TORCHRAS_ADDR": "node3:29000"}).port == 29000
    # -h and -p together do not need TORCHRAS_ADDR to make sense
    assert parse(["-h", "a", "-p", "9"], {"TORCHRAS_ADDR": "junk:junk"}).port == 9


def test_bad_environment_address_is_a_usage_error() -> None:
    result = run_cli([], environ={"TORCHRAS_ADDR": "a:b:c"})
    assert result.code == 2 and "TORCHRAS_ADDR" in result.err


@given(st.from_regex(r"[a-z][a-z0-9.\-]{0,20}", fullmatch=True), st.integers(1, 65535))
def test_addr_roundtrip(host: str, port: int) -> None:
    assert parse_addr(f"{host}:{port}") == (host, port)
    assert parse_addr(f"[{host}]:{port}") == (host, port)
    assert parse_addr(host) == (host, DEFAULT_PORT)


def test_help_and_version_go_to_stdout_and_exit_0() -> None:
    result = run_cli(["--help"])
    assert result.code == 0
    text = result.out.decode()
    for word in (
        "--host",
        "--timeout",
        "--monitor[=GROUPS]",
        "--watch",
        "--check",
        "--list",
        "--retry-for=SECS",
        "--diagnostics",
        "--stacks",
        "--all-threads",
        "--ranks=LIST",
        "CONTROL PROFILER_MASK",
        "Exit codes:",
        "TORCHRAS_ADDR",
    ):
        assert word in text
    version = run_cli(["--version"])
    assert version.code == 0 and version.out.decode().startswith("rascli (torchras) ")


def test_options_are_frozen_values() -> None:
    assert parse(["-v"], {}) == Options(verbose=True)
