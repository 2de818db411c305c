"""The timers: NCCL's ladder, our additions, all scaled by one factor."""

import pytest

from rasd.core.config import Timers


def test_the_default_ladder():
    t = Timers()
    assert (t.keepalive, t.unresponsive, t.hang, t.reset, t.dead) == (1.0, 5.0, 10.0, 20.0, 60.0)
    assert t.keepalive < t.unresponsive < t.hang < t.reset < t.dead
    assert (t.connect_retry, t.connect_warn, t.leg_timeout, t.gather_extra, t.idle) == (1.0, 5.0, 5.0, 5.0, 60.0)
    assert t.fast_death is True
    assert t.tick <= t.keepalive / 4


@pytest.mark.parametrize("factor", [0.01, 0.2, 1.0, 3.0])
def test_every_duration_scales_with_the_factor(factor):
    base, t = Timers(), Timers().scaled(factor)
    for name in (
        "keepalive",
        "unresponsive",
        "reset",
        "dead",
        "hang",
        "connect_retry",
        "connect_warn",
        "handshake",
        "idle",
        "leg_timeout",
        "gather_extra",
    ):
        assert getattr(t, name) == pytest.approx(getattr(base, name) * factor), name
    # The runtime ticks often enough to see each rung within a quarter of a keepalive.
    assert t.tick == pytest.approx(min(base.tick, base.keepalive * factor / 4))
    assert t.fast_death == base.fast_death


@pytest.mark.parametrize("factor", [0, -1])
def test_a_non_positive_factor_is_refused(factor):
    with pytest.raises(ValueError):
        Timers().scaled(factor)


def test_from_env_defaults():
    assert Timers.from_env({}) == Timers()


def test_from_env_reads_the_factor_the_hang_limit_and_fast_death():
    t = Timers.from_env({"TORCHRAS_TIMEOUT_FACTOR": "0.5", "TORCHRAS_HANG_LIMIT": "30", "TORCHRAS_FAST_DEATH": "0"})
    assert t.dead == 30.0 and t.unresponsive == 2.5
    assert t.hang == 15.0  # the hang limit is given before scaling
    assert t.fast_death is False


@pytest.mark.parametrize(
    "value,expected", [("1", True), ("yes", True), ("0", False), ("false", False), ("OFF", False), (" no ", False)]
)
def test_fast_death_switch(value, expected):
    assert Timers.from_env({"TORCHRAS_FAST_DEATH": value}).fast_death is expected


def test_an_empty_factor_means_one():
    assert Timers.from_env({"TORCHRAS_TIMEOUT_FACTOR": ""}) == Timers()


def test_scaling_twice_multiplies():
    assert Timers().scaled(0.5).scaled(0.2).dead == pytest.approx(6.0)
