"""The documented API surface: parameters and their validation, State, Compose, callbacks, injection, store."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading
import time

import pytest
import torch.distributed as dist

import inprocess
from inprocess import Compose, FrozenState, Mode, State, exception, health_check, initialize, param_utils
from inprocess.attribution import Interruption, InterruptionRecord, format_interruption_records, format_rank_set
from inprocess.fault_source import ExternalVerdict, VerdictKind, report_fault
from inprocess.monitor_thread import MonitorThread, RankShouldRestart
from inprocess.progress_watchdog import ProgressWatchdog
from inprocess.store import BarrierOverflow, BarrierTimeout, HashStore, TCPStore

SECONDS = datetime.timedelta(seconds=1)


# ---- package surface -------------------------------------------------------------------------------------------


def test_package_surface_matches_the_reference():
    for name in ("Wrapper", "CallWrapper", "State", "FrozenState", "Mode", "Compose"):
        assert hasattr(inprocess, name)
    for module in (
        "abort",
        "completion",
        "compose",
        "exception",
        "finalize",
        "health_check",
        "initialize",
        "monitor_process",
        "monitor_thread",
        "progress_watchdog",
        "rank_assignment",
        "state",
        "store",
        "terminate",
        "wrap",
        "fault_source",
    ):
        assert hasattr(inprocess, module)
    ra = inprocess.rank_assignment
    for name in (
        "RankAssignment",
        "RankAssignmentCtx",
        "RankDiscarded",
        "Layer",
        "LayerFlag",
        "Tree",
        "FillGaps",
        "ShiftRanks",
        "FilterCountGroupedByKey",
        "RankFilter",
        "ActivateAllRanks",
        "MaxActiveWorldSize",
        "ActiveWorldSizeDivisibleBy",
    ):
        assert hasattr(ra, name)
    assert issubclass(exception.RestartAbort, BaseException) and not issubclass(exception.RestartAbort, Exception)
    assert issubclass(RankShouldRestart, BaseException) and not issubclass(RankShouldRestart, Exception)
    assert issubclass(exception.HealthCheckError, exception.RestartError)


# ---- Wrapper parameters ----------------------------------------------------------------------------------------


def test_wrapper_defaults():
    wrapper = inprocess.Wrapper()
    assert (wrapper.soft_timeout, wrapper.hard_timeout, wrapper.barrier_timeout) == (60, 90, 120)
    assert (wrapper.heartbeat_timeout, wrapper.completion_timeout, wrapper.last_call_wait) == (30, 120, 1)
    assert wrapper.termination_grace_time == 5 and wrapper.monitor_thread_interval == 1
    assert wrapper.store_factory is inprocess.store.TCPStore
    assert isinstance(wrapper.abort, inprocess.abort.AbortTorchDistributed)
    assert isinstance(wrapper.rank_assignment, inprocess.rank_assignment.RankAssignment)
    if "LOCAL_RANK" not in os.environ:
        assert wrapper.restart_health_check is None  # the GPU/NVL/NIC checks come with LOCAL_RANK only


@pytest.mark.parametrize(
    "kwargs, condition",
    [
        (dict(soft_timeout=90 * SECONDS), "soft_timeout < hard_timeout < barrier_timeout"),
        (dict(hard_timeout=200 * SECONDS), "soft_timeout < hard_timeout < barrier_timeout"),
        (dict(heartbeat_timeout=150 * SECONDS), "heartbeat_timeout < barrier_timeout"),
        (dict(heartbeat_interval=31 * SECONDS), "heartbeat_interval < heartbeat_timeout"),
        (
            dict(monitor_process_interval=61 * SECONDS, heartbeat_timeout=100 * SECONDS, hard_timeout=110 * SECONDS),
            "monitor_process_interval < soft_timeout",
        ),
        (dict(monitor_thread_interval=60 * SECONDS), "monitor_thread_interval < soft_timeout"),
        (dict(progress_watchdog_interval=61 * SECONDS), "progress_watchdog_interval < soft_timeout"),
        (dict(monitor_process_logfile="relative.log"), "monitor_process_logfile is None"),
    ],
)
def test_wrapper_validates_the_timeout_ladder(kwargs, condition):
    with pytest.raises(ValueError, match="Condition") as info:
        inprocess.Wrapper(**kwargs)
    assert condition in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [dict(soft_timeout="60"), dict(store_factory=dict), dict(initialize=lambda state: state), dict(enabled=1)],
)
def test_wrapper_rejects_wrong_types(kwargs):
    with pytest.raises(TypeError):
        inprocess.Wrapper(**kwargs)


def test_disabled_wrapper_returns_the_function():
    def fn():
        return 1

    assert inprocess.Wrapper(enabled=False)(fn) is fn


def test_call_wrapper_refuses_an_initialized_process_group():
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"not torch.distributed.is_initialized\(\)"):
            inprocess.Wrapper()(lambda: None)()
    finally:
        dist.destroy_process_group()


# ---- State -----------------------------------------------------------------------------------------------------


def test_state_positional_and_defaults(monkeypatch):
    state = State(3, 8)
    assert (state.initial_rank, state.initial_world_size, state.iteration, state.mode) == (3, 8, 0, Mode.INITIALIZED)
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "6")
    assert (State.from_env().rank, State.from_env().world_size) == (5, 6)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (State.from_env().rank, State.from_env().world_size) == (0, 1)


def test_frozen_state_is_read_only():
    frozen = State(1, 2).freeze()
    assert isinstance(frozen, FrozenState)
    fields = [(field.name, field.type, field.default) for field in dataclasses.fields(State)]
    assert [(field.name, field.type, field.default) for field in dataclasses.fields(FrozenState)] == fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.rank = 0


def test_state_advance_and_distributed_vars(monkeypatch):
    state = State(1, 4, active_rank=None, active_world_size=3, fn_exception=RuntimeError())
    state.advance()
    assert state.iteration == 1 and state.fn_exception is None
    monkeypatch.setenv("RANK", "x")
    state.set_distributed_vars()
    assert os.environ["RANK"] == "None" and os.environ["WORLD_SIZE"] == "3"


# ---- Compose and callbacks -------------------------------------------------------------------------------------


class Append(initialize.Initialize):
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def __call__(self, state):
        self.log.append(self.name)
        return state


def test_compose_calls_last_to_first_and_keeps_the_common_base():
    log: list = []
    composed = Compose(Append(log, "a"), Append(log, "b"), initialize.RetryController())
    assert isinstance(composed, initialize.Initialize)
    frozen = State(0, 1).freeze()
    assert composed(frozen) is frozen
    assert log == ["b", "a"]


def test_compose_chains_plain_callables_and_warns_on_none():
    assert Compose(lambda x: x + 1, lambda x: x * 10)(2) == 21
    with pytest.warns(UserWarning):
        Compose(lambda x: x, lambda x: None)(1)


def test_retry_controller_limits():
    controller = initialize.RetryController(max_iterations=3, min_world_size=2)
    controller(State(0, 2, iteration=2).freeze())
    with pytest.raises(exception.RestartAbort, match="iteration=3"):
        controller(State(0, 2, iteration=3).freeze())
    with pytest.raises(exception.RestartAbort):
        controller(State(0, 1).freeze())


def test_fault_counter_counts_local_faults_only():
    counter = health_check.FaultCounter(max_rank_faults=1)
    counter(State(0, 1).freeze())
    counter(State(0, 1, fn_exception=RuntimeError()).freeze())
    with pytest.raises(health_check.FaultCounterExceeded):
        counter(State(0, 1, fn_exception=RuntimeError()).freeze())


def test_cuda_health_check_is_a_no_op_without_cuda():
    frozen = State(0, 1).freeze()
    assert health_check.CudaHealthCheck()(frozen) is frozen


def test_threaded_finalize_times_out_without_cuda():
    finalize = inprocess.finalize.ThreadedFinalize(datetime.timedelta(seconds=0.1), time.sleep, args=(5,))
    with pytest.raises(exception.TimeoutError):
        finalize(State(0, 1).freeze())
    assert inprocess.finalize.ThreadedFinalize(SECONDS, lambda: None)(State(0, 1).freeze()) is not None


def test_abort_without_a_process_group_is_a_no_op():
    assert inprocess.abort.AbortTorchDistributed()(None) is None


# ---- argument injection ----------------------------------------------------------------------------------------


def test_injection_finds_the_call_wrapper_in_any_annotation_style():
    CallWrapper = inprocess.CallWrapper

    def plain(a: list[int], cw: CallWrapper, b: int = 1): ...
    def optional(cw: CallWrapper | None = None, d: dict[str, list[int]] = None): ...
    def union(cw: int | CallWrapper): ...
    def strings(x: list[int], cw: inprocess.CallWrapper): ...
    def unknown(x: NotDefinedAnywhere, cw: CallWrapper | None): ...  # noqa: F821 - an annotation that cannot resolve
    def pep604(cw: CallWrapper | None): ...
    def none(a: int, b: list[str]): ...

    for fn in (plain, optional, union, strings, unknown, pep604):
        assert param_utils.injected_parameters(fn, CallWrapper) == ["cw"], fn.__name__
    assert param_utils.injected_parameters(none, CallWrapper) == []


def test_substitute_param_value_binds_defaults():
    def fn(a, cw=None, *, b=2):
        return a, cw, b

    args, kwargs = param_utils.substitute_param_value(fn, (1,), {}, {"cw": "X"})
    assert fn(*args, **kwargs) == (1, "X", 2)


# ---- attribution ---------------------------------------------------------------------------------------------


def test_interruption_records_round_trip_and_format():
    record = InterruptionRecord(3, Interruption.HARD_TIMEOUT)
    assert InterruptionRecord.from_str(str(record)) == record
    assert format_rank_set([0, 1, 2, 5, 7, 8]) == "{0-2, 5, 7-8}"
    text = format_interruption_records([record, InterruptionRecord(4, Interruption.HARD_TIMEOUT)])
    assert text == "Interruption.HARD_TIMEOUT affecting ranks {3-4}"


# ---- store -----------------------------------------------------------------------------------------------------


def test_reentrant_barrier_counts_distinct_ranks():
    store = HashStore()
    store.reentrant_barrier([0], "g", 3, 0)
    store.reentrant_barrier([0, 1], "g", 3, 0)  # rank 0 again, on someone's behalf
    with pytest.raises(BarrierTimeout):
        store.reentrant_barrier([1], "g", 3, datetime.timedelta(seconds=0.2))
    store.reentrant_barrier([2], "g", 3, SECONDS)


def test_counting_barrier_overflows():
    store = HashStore()
    store.barrier([0, 1], "g", 2, SECONDS)
    with pytest.raises(BarrierOverflow):
        store.barrier([0], "g", 2, SECONDS)


def test_store_keeps_torch_native_barrier():
    store = TCPStore(host_name="127.0.0.1", port=0, world_size=1, timeout=10 * SECONDS)
    store.barrier("native", 1)  # torch 2.13's Store.barrier(key, world_size)
    store.barrier([0], "ours", 1, SECONDS)
    other = store.new_connection()
    other.set("k", "v")
    assert store.get("k") == b"v"


def test_interruptions_terminations_and_completion():
    store = HashStore().iteration_store(4)
    assert not store.is_interrupted()
    store.record_terminated_ranks([3, 1])
    store.record_terminated_ranks([3])
    assert store.get_terminated_ranks() == {1, 3}
    store.record_interrupted([InterruptionRecord(1, Interruption.EXCEPTION)])
    store.lock_interruption_records()
    store.record_interrupted([InterruptionRecord(2, Interruption.EXCEPTION)])  # frozen: not recorded
    assert store.get_interruption_records() == [InterruptionRecord(1, Interruption.EXCEPTION)]
    assert store.is_interrupted()
    assert store.completion_barrier([0], 2, SECONDS) is False  # interrupted, not completed


def test_completion_barrier_completes():
    store = HashStore().iteration_store(0)
    with pytest.raises(BarrierTimeout):
        store.completion_barrier([1], 2, datetime.timedelta(seconds=0.1))  # rank 1 registered, nobody else yet
    assert store.completion_barrier([0], 2, SECONDS) is True


def test_rank_identities_per_iteration():
    base = HashStore()
    base.iteration_store(0).set_initial_rank(2, 5)
    assert base.iteration_store(0).get_rank_of_initial(5) == 2
    assert base.iteration_store(0).get_initial_ranks([2]) == [5]
    assert base.iteration_store(1).get_rank_of_initial(5) is None


# ---- fault source -----------------------------------------------------------------------------------------------


def test_external_verdict_normalises_and_needs_an_active_call():
    verdict = ExternalVerdict(iteration=0, ranks=[3, 3, 1], kind="PEER_DEAD")
    assert verdict.ranks == frozenset({1, 3}) and verdict.kind is VerdictKind.PEER_DEAD
    assert VerdictKind.PEER_HUNG.terminates and not VerdictKind.COMM_STUCK.terminates
    with pytest.raises(ValueError):
        ExternalVerdict(iteration=0, ranks=[1], kind="NOT_A_KIND")
    assert report_fault(verdict) is False  # no wrapper call is active in this process


# ---- the monitor thread and the progress watchdog, in this process ---------------------------------------------


def _monitor_thread(store, aborts: list, lock: threading.RLock) -> MonitorThread:
    return MonitorThread(
        state_fn=lambda: State(0, 1).freeze(),
        store=store,
        abort=lambda state: aborts.append(state),
        last_call_wait=0.0,
        soft_timeout=5.0,
        atomic_lock=lock,
        main_thread_id=threading.get_ident(),
        rank=0,
    )


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def test_monitor_thread_aborts_and_raises_into_the_main_thread():
    store, aborts, lock = HashStore().iteration_store(0), [], threading.RLock()
    monitor = _monitor_thread(store, aborts, lock)
    monitor.start()
    threading.Timer(0.2, store.record_interrupted, args=([InterruptionRecord(2, Interruption.EXCEPTION)],)).start()
    with pytest.raises(RankShouldRestart, match=r"EXCEPTION affecting ranks \{2\}"):
        _spin(20)
    monitor.leave_function()
    assert monitor.shutdown(5) and len(aborts) == 1


def _swallowing_loop(seconds: float) -> None:
    try:
        _spin(seconds)
    except RankShouldRestart:
        _spin(seconds)  # user code that swallowed the restart: the monitor raises again


def test_monitor_thread_raises_again_and_says_where_the_main_thread_is(caplog):
    store, aborts, lock = HashStore().iteration_store(0), [], threading.RLock()
    monitor = _monitor_thread(store, aborts, lock)
    monitor.soft_timeout = 0.3
    monitor.start()
    threading.Timer(0.2, store.record_interrupted, args=([InterruptionRecord(2, Interruption.EXCEPTION)],)).start()
    with caplog.at_level(logging.WARNING, logger="inprocess.monitor_thread"), pytest.raises(RankShouldRestart):
        _swallowing_loop(20)
    monitor.leave_function()
    assert monitor.shutdown(5)
    (warning,) = [r.getMessage() for r in caplog.records if "did not leave" in r.getMessage()]
    assert "_swallowing_loop" in warning and "_spin" in warning


def test_monitor_thread_waits_for_an_atomic_section():
    store, aborts, lock = HashStore().iteration_store(0), [], threading.RLock()
    monitor = _monitor_thread(store, aborts, lock)
    monitor.start()
    finished_atomic = False
    with pytest.raises(RankShouldRestart):
        with lock:  # what CallWrapper.atomic() holds
            store.record_interrupted([InterruptionRecord(0, Interruption.SOFT_TIMEOUT)])
            _spin(0.5)
            assert not aborts  # the abort waits too
            finished_atomic = True
        _spin(20)
    assert finished_atomic
    monitor.leave_function()
    monitor.shutdown(5)


def test_leave_function_cancels_an_undelivered_restart():
    store, aborts, lock = HashStore().iteration_store(0), [], threading.RLock()
    monitor = _monitor_thread(store, aborts, lock)
    monitor.start()
    monitor.leave_function()  # the main thread already left the function (e.g. it raised itself)
    store.record_interrupted([InterruptionRecord(0, Interruption.EXCEPTION)])
    assert monitor.wait_aborted(5)
    _spin(0.3)  # no RankShouldRestart arrives
    assert monitor.shutdown(5) and len(aborts) == 1


class Collector:
    def __init__(self) -> None:
        self.stamps: list = []

    def send_timestamp(self, timestamp) -> None:
        self.stamps.append(timestamp)


def test_progress_watchdog_stamps_only_while_the_main_thread_runs_bytecode():
    collector = Collector()
    watchdog = ProgressWatchdog(0, collector, 0.02)
    watchdog.start()
    try:
        _spin(0.4)
        running = watchdog.timestamp.auto
        assert running is not None and time.monotonic() - running < 0.3
        time.sleep(0.6)  # a C call: no bytecode, no stamps
        assert time.monotonic() - watchdog.timestamp.auto >= 0.5
        watchdog.ping()
        assert watchdog.timestamp.manual is not None and collector.stamps
    finally:
        watchdog.shutdown(5)


def test_the_first_end_of_an_iteration_wins():
    """A fault recorded after every rank completed cannot turn the completion into a restart, and vice versa."""
    completed = HashStore().iteration_store(0)
    assert completed.completion_barrier([0], 1, SECONDS) is True
    completed.record_interrupted([InterruptionRecord(0, Interruption.EXCEPTION)])
    assert completed.iteration_outcome() == "completed"
    interrupted = HashStore().iteration_store(0)
    interrupted.record_interrupted([InterruptionRecord(1, Interruption.EXCEPTION)])
    assert interrupted.completion_barrier([0], 1, SECONDS) is False
    assert interrupted.iteration_outcome() == "interrupted"
