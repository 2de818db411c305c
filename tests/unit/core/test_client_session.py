"""The client protocol as a table of lines and replies (docs/protocol.md §1-2), without a socket."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from rasd.core.client_session import LINE_LIMIT, ClientSession, CloseClient, Format, Reply, StartStatus
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
        (b"TIMEOUT\n", "ERROR: Unknown command TIMEOUT\n"),
        (b"SET FORMAT json\n", "OK\n"),
        (b"set format TEXT\n", "OK\n"),
        (b"SET FORMAT xml\n", "ERROR: Invalid format xml\n"),
        (b"MONITOR\n", "OK\n"),
        (b"monitor lifecycle,TRACE\n", "OK\n"),
        (b"MONITOR ,,all,\n", "OK\n"),
        (b"MONITOR foo\n", "ERROR: Invalid event group 'foo'\n"),
        (b"\n", "ERROR: Unknown command \n"),
        (b"HELP\n", "ERROR: Unknown command HELP\n"),
        (b" STATUS\n", "ERROR: Unknown command  STATUS\n"),
        (b"VERBOSE  STATUS\n", "ERROR: Unknown command VERBOSE  STATUS\n"),
        (b"STATUS \n", "ERROR: Unknown command STATUS \n"),
    ],
)
def test_command_table(line, reply):
    assert replies(line) == [Reply(reply)]


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
