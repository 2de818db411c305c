"""Whole calls of a wrapped function in this process (world size 1): the loop, injection, hand-shakes."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

import inprocess
from inprocess_jobs import free_ports

pytestmark = pytest.mark.slow  # every test runs a real call in a process of its own

SECONDS = datetime.timedelta(seconds=1)
HERE = Path(__file__).parent


@pytest.fixture
def single_rank(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    return free_ports(1)[0]


def fast(**kwargs):
    settings = dict(
        monitor_thread_interval=0.1 * SECONDS,
        monitor_process_interval=0.1 * SECONDS,
        progress_watchdog_interval=0.1 * SECONDS,
        last_call_wait=0.05 * SECONDS,
        soft_timeout=10 * SECONDS,
        hard_timeout=20 * SECONDS,
        heartbeat_timeout=15 * SECONDS,
        barrier_timeout=30 * SECONDS,
    )
    settings.update(kwargs)
    return settings


def test_a_call_restarts_in_place_and_restores_the_environment(single_rank):
    seen = []

    class Count(inprocess.initialize.Initialize):
        def __call__(self, state):
            seen.append(("initialize", state.iteration))
            return state

    @inprocess.Wrapper(store_kwargs={"port": single_rank}, initialize=Count(), **fast())
    def train(values: list[int], call_wrapper: inprocess.CallWrapper, scale: float = 2.0) -> float:
        seen.append(("train", call_wrapper.iteration, os.environ["RANK"], os.environ["WORLD_SIZE"]))
        call_wrapper.ping()
        if call_wrapper.iteration == 0:
            raise RuntimeError("first attempt fails")
        with call_wrapper.atomic():
            return sum(values) * scale

    assert train([1, 2]) == 6.0
    assert seen == [("initialize", 0), ("train", 0, "0", "1"), ("initialize", 1), ("train", 1, "0", "1")]
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
    assert inprocess.fault_source.active_call() is None
    assert train([1]) == 2.0  # a second call in the same process builds a fresh store on the same port


def test_retry_controller_ends_the_call_with_restart_abort(single_rank):
    @inprocess.Wrapper(
        store_kwargs={"port": single_rank}, initialize=inprocess.initialize.RetryController(max_iterations=2), **fast()
    )
    def train() -> None:
        raise ValueError("always")

    with pytest.raises(inprocess.exception.RestartAbort, match="iteration=2"):
        train()


def test_the_monitor_hand_shake_has_a_timeout(single_rank):
    from inprocess_stores import MonitorNeverConnects

    wrapper = inprocess.Wrapper(
        store_factory=MonitorNeverConnects,
        store_kwargs={"port": single_rank},
        **fast(
            soft_timeout=1 * SECONDS,
            hard_timeout=2 * SECONDS,
            heartbeat_timeout=2.5 * SECONDS,
            barrier_timeout=3 * SECONDS,
        ),
    )
    with pytest.raises(inprocess.exception.TimeoutError, match="monitor process"):
        wrapper(lambda: None)()
