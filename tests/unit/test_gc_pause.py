"""rasd.net.gc_pause: the collector paused for one block, and left as the training set it."""

import gc

import pytest

from rasd.net.gc_pause import collector_paused


@pytest.fixture(autouse=True)
def _restore_collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_an_enabled_collector_is_paused_for_the_block_and_resumed_after():
    gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_training_turned_off_stays_off():
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_collector_resumes_when_the_block_raises():
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a report that failed")
    assert gc.isenabled()


def test_the_ras_thread_handles_what_a_connection_brings_with_the_collector_paused():
    """A mesh connection's bytes reach the node with the collector paused (the root decodes a leg's fold of
    thousands of processes in one input: docs/architecture.md §11), and it runs again after."""
    from types import SimpleNamespace

    from rasd.net.runtime import _MeshProtocol

    seen: list[bool] = []
    node = SimpleNamespace(received=lambda cid, data, now: seen.append(gc.isenabled()) or [])
    runtime = SimpleNamespace(metrics=None, node=node, feed=lambda step: step(0.0))
    gc.enable()
    _MeshProtocol(runtime, 3).data_received(b"frame")  # type: ignore[arg-type]
    assert seen == [False] and gc.isenabled()
