"""What a user of nvidia-resiliency-ext relies on, behaviour by behaviour (issue 11; docs/inprocess.md, parity).

Unit tests run in this process; the one slow test runs ``inprocess_parity_calls.py`` (real single-rank calls of
wrapped functions) in a subprocess, because a hard timeout kills the trainer and the trainer must not be pytest.
"""

from __future__ import annotations

import datetime
import gc
import io
import json
import logging
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

import inprocess
from inprocess import State
from inprocess.compose import Compose
from inprocess.health_check import (
    ChainedGPUHealthCheck,
    ChainedNicHealthCheck,
    ChainedNVLHealthCheck,
    HealthCheck,
    restart_health_check,
)
from inprocess.monitor_thread import RankShouldRestart, async_abort_main_thread, async_raise, reraise_if_unraisable
from inprocess.nested_restarter import (
    NestedRestarterAborted,
    NestedRestarterCallback,
    NestedRestarterFinalized,
    NestedRestarterHandlingCompleted,
    NestedRestarterHandlingStarting,
    NestedRestarterLogger,
)
from inprocess.progress_watchdog import ProgressWatchdog, Timestamp
from inprocess.store import HashStore, PrefixStore
from inprocess_jobs import free_ports

HERE = Path(__file__).parent
REPOSITORY = HERE.parents[1]
FROZEN = State(0, 2, active_rank=0, active_world_size=2).freeze()


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


# ---- item 5: health checks as in the reference -----------------------------------------------------------------


class Recorder(HealthCheck):
    def __init__(self, name: str, order: list) -> None:
        self.name, self.order = name, order

    def __call__(self, state):
        self.order.append(self.name)
        return state


def test_restart_health_check_appends_gpu_nvl_nic_when_local_rank_is_set(monkeypatch):
    order: list = []
    user = Compose(Recorder("user1", order), Recorder("user2", order))
    monkeypatch.setenv("LOCAL_RANK", "0")
    composed = inprocess.Wrapper(health_check=user).restart_health_check
    kinds = [type(check) for check in composed.instances]
    assert kinds == [Recorder, Recorder, ChainedGPUHealthCheck, ChainedNVLHealthCheck, ChainedNicHealthCheck]
    assert all(check.device_index == 0 for check in composed.instances[2:])
    assert isinstance(composed, HealthCheck)
    # No NVML, no GPU, no InfiniBand here: the chained checks pass and the user's run last to first.
    assert composed(FROZEN) is FROZEN and order == ["user2", "user1"]
    assert inprocess.Wrapper().restart_health_check.instances[0].device_index == 0


def test_restart_health_check_is_the_users_without_local_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert inprocess.Wrapper().restart_health_check is None
    single = Recorder("user", [])
    assert restart_health_check(single).instances == [single]
    monkeypatch.setenv("LOCAL_RANK", "not a number")
    assert restart_health_check(None) is None


def test_nic_health_check_fails_when_a_link_went_down(monkeypatch, tmp_path):
    counter = tmp_path / "mlx5_0" / "ports" / "1" / "counters" / "link_downed"
    counter.parent.mkdir(parents=True)
    counter.write_text("3\n")
    monkeypatch.setattr(inprocess.health_check, "_INFINIBAND", str(tmp_path))
    check = ChainedNicHealthCheck(device_index=0)
    assert check(FROZEN) is FROZEN
    counter.write_text("4\n")
    with pytest.raises(inprocess.exception.HealthCheckError, match="link down"):
        check(FROZEN)
    assert check(FROZEN) is FROZEN  # a new baseline: the same loss is reported once


# ---- item 6: details users script against -------------------------------------------------------------------


class Collect:
    def __init__(self) -> None:
        self.stamps: list[Timestamp] = []

    def send_timestamp(self, timestamp: Timestamp) -> None:
        self.stamps.append(timestamp)


def test_progress_watchdog_takes_a_timedelta_and_pauses():
    collect = Collect()
    watchdog = ProgressWatchdog(0, collect, datetime.timedelta(milliseconds=5))
    assert watchdog.interval == 0.005
    watchdog.start()
    try:
        _spin(0.5)
        assert collect.stamps
        assert all(isinstance(stamp.auto, float) and stamp.manual is None for stamp in collect.stamps)
        autos = [stamp.auto for stamp in collect.stamps]
        assert autos == sorted(autos)
        watchdog.pause_and_synchronize()
        paused = len(collect.stamps)
        _spin(0.2)
        assert len(collect.stamps) == paused
        watchdog.resume()
        _spin(0.5)
        assert len(collect.stamps) > paused
    finally:
        watchdog.shutdown(5)
    with pytest.raises(RuntimeError):
        watchdog.resume()


def test_prefix_store_takes_an_iteration():
    base = HashStore()
    store = PrefixStore(3, base)
    store.set("key", "value")
    assert base.get("_inprocess_3/key") == b"value"
    assert store.iteration == 3 and store.base_store is base
    assert base.iteration_store(3).get("key") == b"value"


# ---- item 7: nested restarter, checkpoint processes, flight recorder, monitor_thread helpers -------------------


@pytest.fixture
def restarter_lines():
    logger = NestedRestarterLogger()
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    saved = list(logger.restarter_logger.handlers)
    logger.restarter_logger.handlers = [handler]
    yield logger, output
    logger.restarter_logger.handlers = saved


STATE_STAGE = re.compile(r"NestedRestarter.*state=(?P<state>[a-z]+)(\s+stage=(?P<stage>[a-z]+))?")


def test_nested_restarter_lines_match_the_outer_restarters_patterns(restarter_lines):
    logger, output = restarter_lines

    def last() -> tuple:
        match = list(STATE_STAGE.finditer(output.getvalue()))[-1]
        return match.group("state"), match.group("stage")

    NestedRestarterCallback(restarter_state="initialize", logger=logger)(FROZEN)
    assert last() == ("initialize", None)
    completed = NestedRestarterHandlingCompleted()
    completed.logger = logger
    completed(FROZEN)
    assert last() == ("initialize", None)
    completed(FROZEN)
    assert last() == ("handling", "completed")
    for callback, expected in (
        (NestedRestarterHandlingStarting(), ("handling", "starting")),
        (NestedRestarterFinalized(), ("finalized", None)),
        (NestedRestarterAborted(), ("aborted", None)),
    ):
        callback.logger = logger
        assert callback(FROZEN) is FROZEN
        assert last() == expected
    lines = len(output.getvalue().splitlines())
    NestedRestarterAborted(special_rank=1).__class__  # noqa: B018 - built, not called
    other = NestedRestarterFinalized(special_rank=1)
    other.logger = logger
    other(FROZEN)  # initial rank 0 is not the special rank: no line
    assert len(output.getvalue().splitlines()) == lines
    assert isinstance(completed, inprocess.initialize.Initialize)
    assert isinstance(NestedRestarterHandlingStarting(), inprocess.abort.Abort)
    assert isinstance(NestedRestarterFinalized(), inprocess.completion.Completion)
    assert isinstance(NestedRestarterAborted(), inprocess.terminate.Terminate)


def _checkpoint_writer() -> None:
    time.sleep(600)


def test_abort_persistent_checkpoint_processes_stops_the_writers():
    forked = multiprocessing.get_context("fork").Process(target=_checkpoint_writer, daemon=True)
    forked.start()
    spawned = subprocess.Popen(["sleep", "600"])
    closed = []

    class Queue:
        def close(self, abort: bool = False) -> None:
            closed.append(abort)

    abort = inprocess.abort.AbortPersistentCheckpointProcesses(forked, spawned, Queue(), grace=10)
    assert abort(None) is None
    assert not forked.is_alive() and spawned.poll() is not None and closed == [True]
    assert abort(FROZEN) is FROZEN  # already stopped: harmless


def test_abort_torch_distributed_dumps_the_flight_recorder_per_iteration(tmp_path, monkeypatch, caplog):
    """On the CPU, torch's flight recorder records gloo collectives: one file per rank and iteration."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    abort = inprocess.abort.AbortTorchDistributed(torch_fr_trace_path=str(tmp_path))
    for iteration in (0, 1):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.all_reduce(torch_ones())
        abort(State(0, 1, iteration=iteration).freeze())
        assert not dist.is_initialized()
    for iteration in (0, 1):
        trace = json.loads((tmp_path / f"iter_{iteration}" / "_dump_0.json").read_text())
        assert "pg_status" in trace and "version" in trace
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    with caplog.at_level(logging.INFO, logger="inprocess.abort"):
        abort(State(0, 1, iteration=2).freeze())
    assert not (tmp_path / "iter_2").exists()
    assert "flight recorder: not dumped" in caplog.text


def torch_ones():
    import torch

    return torch.ones(4)


class Hit(Exception):
    pass


def _once_spinning(deliver, *args):
    """A thread that calls ``deliver(*args)`` once the main thread spins. An asynchronous exception delivered while
    the main thread is still inside ``Thread.start()`` breaks CPython's own bookkeeping there (its clean-up of the
    new thread's entry fails with a KeyError that hides the exception): the test's start, not what it tests."""
    spinning: list[bool] = []

    def run():
        while not spinning:
            time.sleep(0.001)
        deliver(*args)

    threading.Thread(target=run).start()
    return spinning


def test_async_raise_and_async_abort_main_thread():
    with pytest.raises(Hit):
        spinning = _once_spinning(async_raise, threading.main_thread().ident, Hit)
        spinning.append(True)
        _spin(20)
    with pytest.raises(RankShouldRestart, match="from a test"):
        spinning = _once_spinning(async_abort_main_thread, "from a test")
        spinning.append(True)
        _spin(20)
    with pytest.raises(RuntimeError):
        async_raise(0, Hit)


class Dropper:
    def __del__(self) -> None:
        raise Hit("raised in __del__")


@pytest.mark.parametrize("style", ["context manager", "decorator"])
def test_reraise_if_unraisable(style, monkeypatch):
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)
    original = sys.unraisablehook

    def body() -> None:
        dropper = Dropper()
        with pytest.raises(Hit):
            del dropper
            gc.collect()
            _spin(20)

    if style == "decorator":
        reraise_if_unraisable(Hit)(body)()
    else:
        with reraise_if_unraisable(Hit):
            body()
    assert sys.unraisablehook is original


# ---- issue 12: dead code is gone (``wrap.HealthCheckPassed`` is back as a name: issue 26) ------------------------


def test_dead_helpers_are_gone():
    for name in ("send_heartbeat", "get_heartbeat", "is_completed"):
        assert not hasattr(inprocess.store.StoreMixin, name)
    assert not hasattr(Timestamp, "is_timed_out")
    assert not hasattr(inprocess.param_utils, "optional_seconds")


# ---- items 1, 3, 6, 7 and Mode.INITIALIZED: real calls, in a subprocess -----------------------------------------


@pytest.mark.slow
def test_real_calls_leave_nothing_behind_and_restart_as_the_reference(tmp_path):
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        TORCHRAS_ENABLE="0",
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), str(HERE), os.environ.get("PYTHONPATH")])),
    )
    ports = ",".join(map(str, free_ports(3)))
    completed = subprocess.run(
        [sys.executable, str(HERE / "inprocess_parity_calls.py"), str(tmp_path), ports],
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    results = {line["scenario"]: line for line in map(json.loads, completed.stdout.splitlines())}
    assert len(results) == 3, f"{completed.returncode}\n{completed.stdout}\n{completed.stderr[-3000:]}"
    for result in results.values():
        assert "error" not in result, result

    # Item 1: three calls (the second raises, its exception kept): no store, thread, handler or fd survives.
    leaks = results["nothing_outlives_a_call"]
    assert leaks["raised"] == 1
    for after in leaks["after"]:
        assert after == leaks["before"], (leaks["before"], after)
    # Item 6: the pid file persists after the call, every monitor log line names the trainer it guards.
    assert leaks["pidfile"] and int(leaks["pidfile"]) > 0
    assert leaks["log_lines"] and all("target_pid=" in line for line in leaks["log_lines"])

    # Item 2: a rank left in Mode.INITIALIZED restarts once (iteration 0 never calls the function) ...
    explicit = results["initialized_then_rank_should_restart"]
    assert explicit["assignment_calls"] == 3 and explicit["iterations"] == [1, 2]
    # ... item 3: RankShouldRestart raised by the workload records an interruption (every rank restarts).
    assert explicit["result"] == "done"
    assert any("RankShouldRestart raised on rank 0" in line for line in explicit["messages"]), explicit["messages"]

    # Item 7: the reference's hang-protection tests (soft 1.25 s, hard 1.5 s, 1 s intervals): no timeout fires
    # during a 2 s sleep inside disable_hang_protection(), and an exception inside it still restarts.
    hang = results["hang_protection_holds_under_tight_timeouts"]
    assert (hang["result"], hang["calls"]) == ("restarted", [0, 1])
    assert not [line for line in hang["messages"] if "TIMEOUT" in line], hang["messages"]
