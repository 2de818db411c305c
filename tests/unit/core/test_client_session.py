"""The client protocol as a table of lines and replies (docs/protocol.md §1-2), without a socket."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from rasd.core.client_session import (
    LINE_LIMIT,
    ClientSession,
    CloseClient,
    Format,
    Reply,
    StartDiagnostics,
    StartStacks,
    StartStatus,
    profiler_mask,
)
from rasd.core.events import Group


def replies(*lines: bytes) -> list:
    s = ClientSession()
    out = []
    for line in lines:
        out.extend(s.feed(line))
    return out


@pytest.mark.parametrize(
    "line, reply",
    [
        (b"CLIENT PROTOCOL 2\n", "SERVER PROTOCOL 2\n"),
        (b"client protocol 7\n", "SERVER PROTOCOL 2\n"),
        (b"Client Protocol anything at all\n", "SERVER PROTOCOL 2\n"),
        (b"TIMEOUT 10\n", "OK\n"),
        (b"timeout 0\n", "OK\n"),
        (b"TIMEOUT \n", "OK\n"),  # strtol quirk: an empty value is 0
        (b"TIMEOUT -1\n", "ERROR: Invalid timeout value -1\n"),
        (b"TIMEOUT 5s\n", "ERROR: Invalid timeout value 5s\n"),
        (b"TIMEOUT 2.5\n", "OK\n"),  # NCCL 2.31's strtod (reference §9.4)
        (b"TIMEOUT .5e1\n", "OK\n"),
        (b"TIMEOUT  +3\n", "OK\n"),
        (b"TIMEOUT 3 \n", "ERROR: Invalid timeout value 3 \n"),
        (b"TIMEOUT inf\n", "ERROR: Invalid timeout value inf\n"),
        (b"TIMEOUT nan\n", "ERROR: Invalid timeout value nan\n"),
        (b"TIMEOUT 1e999\n", "ERROR: Invalid timeout value 1e999\n"),
        (b"TIMEOUT 1e-999\n", "ERROR: Invalid timeout value 1e-999\n"),
        (b"TIMEOUT 1_0\n", "ERROR: Invalid timeout value 1_0\n"),
        (b"TIMEOUT -0.5\n", "ERROR: Invalid timeout value -0.5\n"),
        (b"CONTROL PROFILER_MASK\n", "ERROR: Unknown CONTROL subcommand 'PROFILER_MASK'\n"),
        (b"control   foo bar\n", "ERROR: Unknown CONTROL subcommand 'foo bar'\n"),
        (b"CONTROL\n", "ERROR: Unknown command CONTROL\n"),
        (b"CONTROL PROFILER_MASK none \n", "ERROR: Invalid profiler mask value 'none '\n"),
        (b"CONTROL PROFILER_MASK coll, p2p\n", "ERROR: Invalid profiler mask value 'coll, p2p'\n"),
        (b"CONTROL PROFILER_MASK 0x\n", "ERROR: Invalid profiler mask value '0x'\n"),
        (b"CONTROL PROFILER_MASK 08\n", "ERROR: Invalid profiler mask value '08'\n"),
        (b"CONTROL PROFILER_MASK -1\n", "ERROR: Invalid profiler mask value '-1'\n"),
        (b"CONTROL PROFILER_MASK bogus\n", "ERROR: Invalid profiler mask value 'bogus'\n"),
        (b"DIAGNOSTICS \n", "ERROR: Unknown command DIAGNOSTICS \n"),
        (b"STACKS \n", "ERROR: Invalid STACKS arguments ''\n"),
        (b"STACKS ALL \n", "ERROR: Invalid STACKS arguments 'ALL '\n"),
        (b"STACKS RANKS\n", "ERROR: Invalid STACKS arguments 'RANKS'\n"),
        (b"STACKS RANKS 1,,2\n", "ERROR: Invalid STACKS arguments 'RANKS 1,,2'\n"),
        (b"STACKS RANKS 3-1\n", "ERROR: Invalid STACKS arguments 'RANKS 3-1'\n"),
        (b"STACKS RANKS -1\n", "ERROR: Invalid STACKS arguments 'RANKS -1'\n"),
        (b"STACKS RANKS 0-99999999\n", "ERROR: Invalid STACKS arguments 'RANKS 0-99999999'\n"),
        (b"STACKS ALL ALL\n", "ERROR: Invalid STACKS arguments 'ALL ALL'\n"),
        (b"STACKSALL\n", "ERROR: Unknown command STACKSALL\n"),
        ("\u017ftatus\n".encode(), "ERROR: Unknown command \u017ftatus\n"),  # only ASCII letters change case
        ("CONTROL PROFILER_MASK \u212aernelch\n".encode(), "ERROR: Invalid profiler mask value '\u212aernelch'\n"),
        (b"TIMEOUT\n", "ERROR: Unknown command TIMEOUT\n"),
        (b"SET FORMAT json\n", "OK\n"),
        (b"set format TEXT\n", "OK\n"),
        (b"SET FORMAT xml\n", "ERROR: Invalid format xml\n"),
        (b"MONITOR\n", "OK\n"),
        (b"monitor lifecycle,TRACE\n", "OK\n"),
        (b"MONITOR ,,all,\n", "OK\n"),
        (b"MONITOR foo\n", "ERROR: Invalid event group 'foo'\n"),
        # NCCL skips every blank after MONITOR, then splits on ',' (strtok_r): no other blank is dropped.
        (b"MONITOR  trace\n", "OK\n"),
        (b"MONITOR \n", "OK\n"),
        (b"MONITOR   bogus\n", "ERROR: Invalid event group 'bogus'\n"),
        (b"MONITOR trace, all\n", "ERROR: Invalid event group ' all'\n"),
        (b"MONITOR trace \n", "ERROR: Invalid event group 'trace '\n"),
        (b"MONITOR \ttrace\n", "ERROR: Invalid event group '\ttrace'\n"),
        (b"MONITOR\ttrace\n", "ERROR: Unknown command MONITOR\ttrace\n"),
        (b"monitorx\n", "ERROR: Unknown command monitorx\n"),  # the line as typed, as NCCL's "%s" of it
        # NCCL matches "client protocol " with its blank: without it, the handshake is an unknown command.
        (b"CLIENT PROTOCOL\n", "ERROR: Unknown command CLIENT PROTOCOL\n"),
        (b"client protocol\n", "ERROR: Unknown command client protocol\n"),
        (b"CLIENT PROTOCOL \n", "SERVER PROTOCOL 2\n"),
        (b"\n", "ERROR: Unknown command \n"),
        (b"HELP\n", "ERROR: Unknown command HELP\n"),
        (b" STATUS\n", "ERROR: Unknown command  STATUS\n"),
        (b"VERBOSE  STATUS\n", "ERROR: Unknown command VERBOSE  STATUS\n"),
        (b"STATUS \n", "ERROR: Unknown command STATUS \n"),
    ],
)
def test_command_table(line, reply):
    assert replies(line) == [Reply(reply)]


@pytest.mark.parametrize(
    "value, mask",
    [
        ("none", 0),
        ("ALL", 0x7FFF),
        ("0x1F", 0x1F),
        ("017", 0o17),
        ("0", 0),
        ("42", 42),
        ("coll", 1 << 1),
        ("Group,KernelLaunch,cebatch", (1 << 0) | (1 << 11) | (1 << 14)),
    ],
)
def test_a_valid_profiler_mask_is_parsed_as_nccl_does_and_refused_with_an_error(value, mask):
    assert profiler_mask(value) == mask
    (reply,) = replies(f"control  PROFILER_MASK {value}\n".encode())
    assert reply.text.startswith(f"ERROR: CONTROL PROFILER_MASK {value} (0x{mask:x}) not applied")
    assert reply.text.endswith("\n") and reply.text.count("\n") == 1


def test_control_and_diagnostics_errors_leave_the_connection_open():
    s = ClientSession()
    assert s.feed(b"CONTROL PROFILER_MASK x\nCONTROL nope\nTIMEOUT 1\n")[-1] == Reply("OK\n")
    assert not s.closed and not s.reporting


def test_diagnostics_starts_a_report_with_the_client_settings_and_reads_no_more():
    s = ClientSession()
    out = s.feed(b"TIMEOUT 2.5\nSET FORMAT json\ndiagnostics\nSTATUS\n")
    assert out[-1] == StartDiagnostics(timeout=2.5, format=Format.JSON)
    assert s.reporting and len(out) == 3


@pytest.mark.parametrize(
    "line, all_threads, ranks",
    [
        (b"STACKS\n", False, None),
        (b"stacks all\n", True, None),
        (b"STACKS RANKS 2\n", False, frozenset({2})),
        (b"Stacks All Ranks 0,2,5-7\n", True, frozenset({0, 2, 5, 6, 7})),
    ],
)
def test_stacks_starts_a_report_with_its_arguments(line, all_threads, ranks):
    s = ClientSession()
    (out,) = s.feed(b"TIMEOUT 2\n" + line)[1:]
    assert out == StartStacks(all_threads=all_threads, ranks=ranks, timeout=2.0, format=Format.TEXT)
    assert s.reporting


def test_crlf_is_accepted_like_lf():
    assert replies(b"CLIENT PROTOCOL 2\r\n") == [Reply("SERVER PROTOCOL 2\n")]


def test_status_and_verbose_status_start_a_report_with_the_client_settings():
    assert replies(b"status\n") == [StartStatus(verbose=False, timeout=None, format=Format.TEXT)]
    assert replies(b"TIMEOUT 3\nSET FORMAT json\nverbose status\n")[-1] == StartStatus(True, 3.0, Format.JSON)
    assert replies(b"TIMEOUT 0\nSTATUS\n")[-1] == StartStatus(False, float("inf"), Format.TEXT)


def test_nothing_is_read_after_status():
    s = ClientSession()
    assert len(s.feed(b"STATUS\nSTATUS\nHELP\n")) == 1
    assert s.feed(b"STATUS\n") == []


def test_monitor_masks():
    s = ClientSession()
    s.feed(b"MONITOR\n")
    assert s.monitor == Group.LIFECYCLE and s.monitoring
    s.feed(b"MONITOR trace\n")
    assert s.monitor == Group.TRACE
    s.feed(b"MONITOR all\n")
    assert s.monitor & Group.LIFECYCLE and s.monitor & Group.TRACE
    s.feed(b"monitor   lifecycle\n")
    assert s.monitor == Group.LIFECYCLE
    assert s.feed(b"MONITOR  trace,bogus\n") == [Reply("ERROR: Invalid event group 'bogus'\n")]
    assert s.monitor == Group.LIFECYCLE  # a rejected MONITOR leaves the groups as they were


def test_end_of_input_closes_a_monitor_and_any_other_client():
    # `echo monitor | nc`: NCCL's recv() returns 0 and the client is terminated, monitor or not.
    s = ClientSession()
    assert s.feed(b"MONITOR\n") == [Reply("OK\n")]
    assert s.monitoring
    assert s.end_of_input() == [CloseClient("end of input")]
    assert s.closed and not s.monitoring
    assert s.feed(b"STATUS\n") == []
    assert s.end_of_input() == []  # said once
    idle = ClientSession()
    assert idle.end_of_input() == [CloseClient("end of input")]
    partial = ClientSession()
    assert partial.feed(b"STATUS") == []
    assert partial.end_of_input() == [CloseClient("end of input")]  # a line without its newline never runs


def test_end_of_input_during_a_report_is_not_read():
    # `echo status | nc`: the report still goes out (NCCL reads nothing from a client whose report runs).
    for request in (b"VERBOSE STATUS\n", b"MONITOR all\nSTATUS\n", b"DIAGNOSTICS\n"):
        s = ClientSession()
        s.feed(request)
        assert s.end_of_input() == []
        assert s.reporting and not s.closed


def test_lines_split_across_packets():
    s = ClientSession()
    assert s.feed(b"CLIENT PRO") == []
    assert s.feed(b"TOCOL 2\nTIME") == [Reply("SERVER PROTOCOL 2\n")]
    assert s.feed(b"OUT 4\n") == [Reply("OK\n")]


def test_a_line_over_the_limit_closes_silently():
    s = ClientSession()
    assert s.feed(b"x" * (LINE_LIMIT - 1)) == []
    assert s.feed(b"x") == [CloseClient("excessively long input line")]
    assert s.feed(b"STATUS\n") == []
    # A 1023-character command with its newline still fits.
    assert replies(b"y" * (LINE_LIMIT - 1) + b"\n") == [Reply("ERROR: Unknown command " + "y" * 1023 + "\n")]
    assert replies(b"y" * LINE_LIMIT + b"\n") == [CloseClient("excessively long input line")]


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=1500), max_size=12))
def test_any_bytes_give_only_well_formed_outputs(chunks):
    s = ClientSession()
    closed = False
    for chunk in chunks:
        outs = s.feed(chunk)
        if closed:
            assert outs == []
        for out in outs:
            assert isinstance(out, (Reply, StartStatus, CloseClient))
            if isinstance(out, Reply):
                assert out.text.endswith("\n")
                assert out.text.startswith(("OK", "ERROR: ", "SERVER PROTOCOL 2"))
            if isinstance(out, CloseClient):
                closed = True
