"""A call of a wrapped function leaves nothing behind (issue 26, item 1), measured as the reference's tests do.

nvidia-resiliency-ext's own tests call wrapped functions inside the test process and check, after each test, that
no ``TCPStore`` is reachable (``gc.get_objects()``), that ``threading.enumerate()`` is what it was, and that no
logging handler was added. Under pytest every record is kept by its log capture, so a record that held an exception
(and through its traceback the call's frames and stores) failed that check; so did the RAS thread ``torchras-rasd``,
which the Wrapper started and never stopped. These tests run real calls here, with the mesh on and off
(``TORCHRAS_ENABLE``), the log capture keeping every record, and compare everything a call could leave behind.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch.distributed

import inprocess
from inprocess_jobs import free_ports

pytestmark = pytest.mark.slow  # real calls: a monitor process each, a store server per port

SECONDS = datetime.timedelta(seconds=1)
HERE = Path(__file__).parent


def fast(port: int, **kwargs) -> dict:
    settings = dict(
        store_kwargs={"port": port, "timeout": 30 * SECONDS},
        monitor_thread_interval=0.05 * SECONDS,
        monitor_process_interval=0.05 * SECONDS,
        progress_watchdog_interval=0.01 * SECONDS,
        last_call_wait=0.01 * SECONDS,
        termination_grace_time=0.01 * SECONDS,
        soft_timeout=20 * SECONDS,
        hard_timeout=40 * SECONDS,
        heartbeat_timeout=30 * SECONDS,
        barrier_timeout=60 * SECONDS,
    )
    settings.update(kwargs)
    return settings


def footprint() -> dict:
    """What a call could leave in this process."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gc.get_objects() touches torch.distributed's deprecated names
        stores = {id(item) for item in gc.get_objects() if isinstance(item, torch.distributed.Store)}
    return dict(
        stores=stores,
        threads=list(threading.enumerate()),
        handlers={name: list(logging.getLogger(name).handlers) for name in ("", "nvrx", "inprocess")},
        wake=signal.getsignal(signal.SIGURG),
        unraisablehook=sys.unraisablehook,
        environment={name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")},
        init_process_group=torch.distributed.init_process_group,
    )


def assert_nothing_left(before: dict, what: str) -> None:
    after = footprint()
    new_stores = after.pop("stores") - before["stores"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        left = [item for item in gc.get_objects() if id(item) in new_stores]
    assert not left, f"{what}: stores still reachable: {left}"
    for key, value in after.items():
        assert value == before[key], f"{what}: {key} was {before[key]}, is {value}"


@pytest.fixture
def single_rank(monkeypatch, caplog):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    caplog.set_level(logging.DEBUG, logger="nvrx")  # every record of the calls kept, as pytest keeps them
    return free_ports(1)[0]


class FailingCheck(inprocess.health_check.HealthCheck):
    def __call__(self, state):
        raise ZeroDivisionError("unhealthy")


class FailingAbort(inprocess.abort.Abort):
    """Raises in the monitor thread (logged there with its traceback, and swallowed, as in the reference)."""

    def __call__(self, state):
        raise ZeroDivisionError("abort failed")


@pytest.mark.parametrize("mesh", ["on", "off"])
def test_a_call_that_returns_raises_or_gives_up_leaves_nothing_behind(single_rank, monkeypatch, tmp_path, caplog, mesh):
    monkeypatch.setenv("TORCHRAS_ENABLE", "1" if mesh == "on" else "0")
    import rasd

    assert rasd.node() is None, "another test left a RAS node running"
    logfile, pidfile = str(tmp_path / "monitor{rank}.log"), str(tmp_path / "monitor{rank}.pid")
    before = footprint()

    @inprocess.Wrapper(**fast(single_rank, monitor_process_logfile=logfile, monitor_process_pidfile=pidfile))
    def returns(call_wrapper: inprocess.CallWrapper | None = None) -> int:
        assert call_wrapper is not None
        if call_wrapper.iteration == 0:
            raise RuntimeError("the first iteration fails")
        if mesh == "on":
            assert any(thread.name == "torchras-rasd" for thread in threading.enumerate())
        return call_wrapper.iteration

    assert returns() == 1
    assert_nothing_left(before, "a call that returned after a restart")

    returns_despite_abort = inprocess.Wrapper(**fast(single_rank, abort=FailingAbort()))(returns.__wrapped__)
    assert returns_despite_abort() == 1
    assert_nothing_left(before, "a call whose abort raised in the monitor thread")

    @inprocess.Wrapper(**fast(single_rank, initialize=inprocess.initialize.RetryController(max_iterations=2)))
    def gives_up() -> None:
        raise ValueError("every iteration fails")

    with pytest.raises(inprocess.exception.RestartAbort) as given_up:  # kept, as a caller may keep it
        gives_up()
    assert_nothing_left(before, "a call the Wrapper gave up")

    @inprocess.Wrapper(**fast(single_rank, health_check=FailingCheck()))
    def unhealthy() -> None:
        raise RuntimeError("restart, then the restart health check fails")

    with pytest.raises(inprocess.exception.HealthCheckError) as raised:
        unhealthy()
    assert_nothing_left(before, "a call whose restart health check raised")
    assert given_up.value is not None and raised.value is not None
    # The captured records kept every traceback, as text (a record holds no exception: inprocess.logs).
    ours = [record for record in caplog.records if record.name.startswith("inprocess")]
    assert any("ZeroDivisionError: unhealthy" in (record.exc_text or "") for record in ours)
    assert all(record.exc_info is None for record in ours)
    assert {"inprocess.store_server", "inprocess.wrap"} <= {record.name for record in ours}
    assert all(record.workload_rank == 0 and record.infra_rank == "?" for record in ours)  # the reference's fields

    # Item 3: every line of the monitor process's log names the trainer it guards and the module that wrote it.
    lines = Path(logfile.format(rank=0)).read_text().splitlines()
    assert lines and all("target_pid=" in line and "monitor_process" in line for line in lines), lines
    assert "inprocess.monitor_process: target_pid=" in lines[0]
    assert int(Path(pidfile.format(rank=0)).read_text()) > 0


def test_a_ras_node_the_user_started_stays(single_rank, monkeypatch):
    monkeypatch.setenv("TORCHRAS_ENABLE", "1")
    import rasd

    node = rasd.start(None)  # the user's own node (a mesh of one), started before any call
    assert node is not None
    try:
        before = footprint()

        @inprocess.Wrapper(**fast(single_rank))
        def train() -> str:
            assert rasd.node() is not None and rasd.node().address == node.address  # the call joined the user's node
            return "done"

        assert train() == "done" and train() == "done"
        assert node.running and rasd.node() is not None and rasd.node().address == node.address
        assert_nothing_left(before, "calls that joined the user's node")
    finally:
        node.stop()


def test_a_ras_node_the_user_asked_for_with_install_stays(single_rank, monkeypatch):
    """``rasd.install()`` asks for a node (started by the first ``init_process_group``); the call starts it first,
    and it stays the user's: running after the call, with the user's hooks."""
    monkeypatch.setenv("TORCHRAS_ENABLE", "1")
    import rasd
    import rasd.torch

    hooks = rasd.install()
    try:

        @inprocess.Wrapper(**fast(single_rank))
        def train() -> bool:
            return rasd.node() is not None

        assert train()
        assert rasd.node() is not None and rasd.node().running
        assert rasd.torch.installed() is hooks
    finally:
        rasd.stop()
        rasd.torch.uninstall()
