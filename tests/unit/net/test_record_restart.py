"""``rasd.record_restart``: what inprocess.Wrapper calls on the training thread after each restart. It hands the
call to the RAS thread of this process's node (a real node here: its thread, a loopback mesh port and the client
port) and never raises, with or without a node."""

from __future__ import annotations

import json
import logging
import os

import pytest

import rasd
from mesh_of_one import query
from rasd.core.comms import RestartRecord
from rasd.core.events import Kind


@pytest.fixture(autouse=True)
def no_node_of_earlier_tests():
    """One node per process: an earlier test of the suite that started one in this process must not be seen here."""
    rasd.stop(goodbye=False)
    yield
    rasd.stop(goodbye=False)


def status_json(address: tuple[str, int]) -> dict:
    data = query(address, "SET FORMAT json", "STATUS")
    return json.loads(data[data.index(b"{") :])


def test_without_a_node_it_does_nothing_and_says_so_at_debug(caplog):
    assert rasd.node() is None
    with caplog.at_level(logging.DEBUG, logger="rasd"):
        assert rasd.record_restart(1, "PEER_DEAD of rank 2", [2], 0.5) is None
    assert "not recorded" in caplog.text


def test_the_node_emits_restart_and_contributes_it_to_gathers(node):
    sub = node.subscribe({Kind.RESTART})
    rasd.record_restart(2, "PEER_DEAD of rank 3", (3,), 0.75)
    event = sub.get(timeout=30)
    assert event is not None and event.kind is Kind.RESTART
    assert event.restart == RestartRecord(2, 1, "PEER_DEAD of rank 3", (3,), 0.75)
    assert event.peer is not None and event.peer.pid == os.getpid()
    assert node.client_address is not None
    restarts = status_json(node.client_address)["restarts"]
    assert (
        restarts["iteration"],
        restarts["restarts_count"],
        restarts["last_cause"],
        restarts["last_terminated_ranks"],
        restarts["last_seconds_lost"],
    ) == (2, 1, "PEER_DEAD of rank 3", [3], 0.75)
    sub.close()


def test_bad_arguments_never_raise_into_training(node):
    sub = node.subscribe({Kind.RESTART})
    rasd.record_restart("three", "x", [1], 0.0)  # type: ignore[arg-type]
    rasd.record_restart(3, "x", None, 0.0)  # type: ignore[arg-type]
    rasd.record_restart(3, "x", [1], "soon")  # type: ignore[arg-type]
    rasd.record_restart(3, object(), ["1"], 1)  # accepted: any cause is text, any rank an integer
    event = sub.get(timeout=30)
    assert event is not None and event.restart == RestartRecord(3, 1, event.restart.cause, (1,), 1.0)
    assert sub.get(timeout=0.2) is None
    sub.close()
