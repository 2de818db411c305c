"""rasd.net.collector: the collector paused for one block, and left as the training set it."""

import gc

import pytest

from rasd.net.collector import collector_paused


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
