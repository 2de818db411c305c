"""``rasd.record_restart``: what inprocess.Wrapper calls on the training thread after each restart. It hands the
call to the RAS thread of this process's node (a real runtime here: its thread and a loopback mesh port) and never
raises, with or without a node."""

from __future__ import annotations

import logging
import os
import threading

import pytest

import rasd
from rasd import api
from rasd.core.comms import RestartRecord
from rasd.core.config import Timers
from rasd.core.events import Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.net.runtime import Runtime


@pytest.fixture
def node(monkeypatch):
    """A running node of one process, installed as this process's node (without rasd.start's process hooks)."""
    rt = Runtime(lambda port: PeerInfo(Addr("127.0.0.1", port), os.getpid(), "test", 1, (), 0), b"secret",
                 "127.0.0.1", Timers())
    rt.start()
    assert rt.running
    monkeypatch.setattr(api, "_runtime", rt)
    try:
        yield rt
    finally:
        rt.stop(goodbye=False)


def test_without_a_node_it_does_nothing_and_says_so_at_debug(monkeypatch, caplog):
    monkeypatch.setattr(api, "_runtime", None)
    with caplog.at_level(logging.DEBUG, logger="rasd"):
        assert rasd.record_restart(1, "PEER_DEAD of rank 2", [2], 0.5) is None
    assert "not recorded" in caplog.text


def test_the_node_emits_restart_and_contributes_it_to_gathers(node):
    sub = rasd.subscribe({Kind.RESTART})
    rasd.record_restart(2, "PEER_DEAD of rank 3", (3,), 0.75)
    event = sub.get(timeout=30)
    assert event is not None and event.kind is Kind.RESTART
    assert event.restart == RestartRecord(2, 1, "PEER_DEAD of rank 3", (3,), 0.75)
    assert event.peer is not None and event.peer.pid == os.getpid()
    done = threading.Event()
    snapshots = []
    node.call(lambda: node.gather(lambda snapshot: (snapshots.append(snapshot), done.set())))
    assert done.wait(30)
    assert [data.restart for data in snapshots[0].responses.values()] == [event.restart]
    sub.close()


def test_bad_arguments_never_raise_into_training(node):
    sub = rasd.subscribe({Kind.RESTART})
    rasd.record_restart("three", "x", [1], 0.0)  # type: ignore[arg-type]
    rasd.record_restart(3, "x", None, 0.0)  # type: ignore[arg-type]
    rasd.record_restart(3, "x", [1], "soon")  # type: ignore[arg-type]
    rasd.record_restart(3, object(), ["1"], 1)  # accepted: any cause is text, any rank an integer
    event = sub.get(timeout=30)
    assert event is not None and event.restart == RestartRecord(3, 1, event.restart.cause, (1,), 1.0)
    assert sub.get(timeout=0.2) is None
    sub.close()
