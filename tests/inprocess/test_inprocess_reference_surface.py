"""What code and tests written against nvidia-resiliency-ext's ``inprocess`` find here (issue 26), without processes.

Names where the reference has them (``inprocess.wrap.ChainedGPUHealthCheck`` patchable, every public name of the
reference's modules in the module of the same name), its logger and record fields, the progress watchdog's timing,
and the reference's helpers (``utils``, ``param_utils``, ``sibling_monitor``, ``monitor_process``). docs/inprocess.md
section 6 lists what differs on purpose.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import logging
import threading
import time
import unittest.mock
from pathlib import Path

import pytest

import inprocess
from inprocess import State, logs
from inprocess.compose import Compose
from inprocess.health_check import HealthCheck
from inprocess.monitor_thread import RankShouldRestart, delayed_async_raise
from inprocess.progress_watchdog import ProgressWatchdog, Timestamp
from inprocess.store import HashStore
from inprocess.store_mixin import PrefixedStore
from polling import wait_until

DOCS = Path(__file__).parents[2] / "docs" / "inprocess.md"

# ---- item 2: names ---------------------------------------------------------------------------------------------

#: Every public name each module of the reference defines, or imports from the reference's own ``inprocess``
#: package (its re-exports, which code and tests reach through that module: ``mock.patch("...wrap.ChainedGPU...")``),
#: read from nvidia-resiliency-ext's src/nvidia_resiliency_ext/inprocess (commit d8686d9). Not listed: the
#: standard library's and torch's modules those files import, and names from the reference's other packages
#: (shared_utils' ``GPUHealthCheck``, ``NVLHealthCheck``, ``NicHealthCheck``, ``LogConfig``, ``setup_logger``;
#: fault_tolerance's ``RankMonitorLogger``; checkpointing's and attribution's helpers), which are not inprocess.
REFERENCE_NAMES = {
    "inprocess": "CallWrapper Compose FrozenState Mode State Wrapper completion exception finalize health_check "
    "initialize monitor_thread nested_restarter rank_assignment state terminate abort attribution compose "
    "monitor_process param_utils progress_watchdog sibling_monitor store utils wrap",
    "abort": "Abort AbortPersistentCheckpointProcesses AbortTorchDistributed AbortTransformerEngine FrozenState utils",
    "attribution": "Interruption InterruptionRecord format_interruption_records format_rank_set",
    "completion": "Completion FrozenState",
    "compose": "Compose T find_common_ancestor",
    "exception": "HealthCheckError InternalError RestartAbort RestartError TimeoutError",
    "finalize": "Finalize FrozenState ThreadedFinalize exception",
    "health_check": "ChainedGPUHealthCheck ChainedNVLHealthCheck ChainedNicHealthCheck CudaHealthCheck FaultCounter "
    "FaultCounterExceeded FrozenState HealthCheck exception",
    "initialize": "FrozenState Initialize RetryController exception",
    "monitor_process": "Interruption InterruptionRecord Message MonitorProcess PrefixStore SiblingMonitor StoreMixin "
    "Timestamp daemonize_fn is_process_active terminate_process utils",
    "monitor_thread": "MonitorThread RankShouldRestart async_abort_main_thread async_raise attribution "
    "delayed_async_raise exception log_exc reraise_if_unraisable",
    "nested_restarter": "Abort Completion FrozenState Initialize NestedRestarterAborted NestedRestarterCallback "
    "NestedRestarterFinalized NestedRestarterHandlingCompleted NestedRestarterHandlingStarting NestedRestarterLogger "
    "Terminate",
    "param_utils": "check_type count_type_in_params enforce_subclass enforce_type enforce_value substitute_param_value",
    "progress_watchdog": "MAX_PENDING ProgressWatchdog Timestamp exception",
    "rank_assignment": "ActivateAllRanks ActiveWorldSizeDivisibleBy FillGaps FilterCountGroupedByKey Layer LayerFlag "
    "MaxActiveWorldSize Mode Node RankAssignment RankAssignmentCtx RankDiscarded RankFilter ShiftRanks State "
    "StoreMixin Tree bounded_activate exception propagate_terminations utils",
    "sibling_monitor": "Heartbeat Interruption InterruptionRecord SiblingMonitor exception utils",
    "state": "FrozenState Mode State freeze_dataclass",
    "store": "BarrierError BarrierOverflow BarrierTimeout FileStore InterruptionRecord Mode PrefixStore State "
    "StoreMixin TCPStore exception utils",
    "terminate": "FrozenState Terminate",
    "utils": "Logging find_nearest_handler format_exc format_rank_set format_rank_set_brief format_rank_set_verbose "
    "log_exc log_exec torch_older_than",
    "wrap": "Abort AbortTorchDistributed ActivateAllRanks CallWrapper ChainedGPUHealthCheck ChainedNVLHealthCheck "
    "ChainedNicHealthCheck Completion Compose Finalize HealthCheck HealthCheckError HealthCheckPassed Initialize "
    "InternalError Interruption InterruptionRecord Mode MonitorProcess MonitorThread PrefixStore ProgressWatchdog "
    "RankAssignment RankAssignmentCtx RankShouldRestart ShiftRanks State StoreMixin TCPStore Terminate Wrapper "
    "enforce_subclass enforce_type enforce_value log_exc param_utils reraise_if_unraisable reserve_fn",
}

#: Internal helpers of the reference's own mechanism that have no counterpart here (docs/inprocess.md section 6
#: names each, with the reason).
ABSENT = {
    ("monitor_process", "daemonize_fn"),  # the monitor is a fresh interpreter (subprocess), never a double fork
    ("rank_assignment", "Node"),  # Tree's internals (its results are the reference's, case by case)
    ("rank_assignment", "bounded_activate"),
    ("rank_assignment", "propagate_terminations"),
    ("wrap", "reserve_fn"),  # a reserve rank waits in the completion barrier
}


def _module(name: str):
    return inprocess if name == "inprocess" else getattr(inprocess, name)


def test_every_public_name_of_the_reference_modules_is_in_the_module_of_the_same_name():
    missing = [
        f"{module}.{name}"
        for module, names in REFERENCE_NAMES.items()
        for name in names.split()
        if (module, name) not in ABSENT and not hasattr(_module(module), name)
    ]
    assert not missing
    text = DOCS.read_text()
    section6 = text[text.index("## 6.") : text.index("## 7.")]
    for module, name in ABSENT:
        assert not hasattr(_module(module), name), f"{module}.{name} exists now: drop it from ABSENT and section 6"
        assert f"`{module}.{name}`" in section6 or f"`{name}`" in section6, f"{module}.{name} is not in section 6"


def test_the_re_exported_names_are_the_same_objects():
    assert inprocess.wrap.ChainedGPUHealthCheck is inprocess.health_check.ChainedGPUHealthCheck
    assert inprocess.wrap.TCPStore is inprocess.store.TCPStore
    assert inprocess.wrap.log_exc is inprocess.utils.log_exc is inprocess.monitor_thread.log_exc
    assert inprocess.monitor_process.SiblingMonitor is inprocess.sibling_monitor.SiblingMonitor
    assert inprocess.monitor_process.PrefixStore is inprocess.store.PrefixStore
    assert inprocess.monitor_process.Timestamp is Timestamp
    assert inprocess.store.State is State and inprocess.rank_assignment.StoreMixin is inprocess.store.StoreMixin
    assert issubclass(inprocess.wrap.HealthCheckPassed, Exception)
    with pytest.raises(AttributeError):
        inprocess.monitor_process.NoSuchName  # noqa: B018 - the lazy names are the listed ones only


class Trace(HealthCheck):
    """A check that notes its name when it runs (the reference's tests patch the chained checks with such)."""

    order: list[str] = []

    def __init__(self, name: str = "user", device_index: int | None = None) -> None:
        self.name, self.device_index = name, device_index

    def __call__(self, state):
        self.order.append(self.name)
        return state


def _traced(name: str) -> type:
    return type(
        f"Traced{name}", (Trace,), {"__init__": lambda self, device_index: Trace.__init__(self, name, device_index)}
    )


def test_the_chained_checks_are_patchable_in_the_wrap_module(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    Trace.order = []
    with (
        unittest.mock.patch("inprocess.wrap.ChainedGPUHealthCheck", _traced("gpu")),
        unittest.mock.patch("inprocess.wrap.ChainedNVLHealthCheck", _traced("nvl")),
        unittest.mock.patch("inprocess.wrap.ChainedNicHealthCheck", _traced("nic")),
    ):
        wrapper = inprocess.Wrapper(health_check=Compose(Trace("user1"), Trace("user2")))
    checks = wrapper.restart_health_check.instances
    assert [type(check).__name__ for check in checks] == ["Trace", "Trace", "Tracedgpu", "Tracednvl", "Tracednic"]
    assert [check.device_index for check in checks[2:]] == [2, 2, 2]
    state = unittest.mock.Mock()
    assert wrapper.restart_health_check(state) is state
    assert Trace.order == ["nic", "nvl", "gpu", "user2", "user1"]
    # Outside the patch, the real checks again.
    assert type(inprocess.Wrapper().restart_health_check.instances[0]) is inprocess.health_check.ChainedGPUHealthCheck


# ---- item 3: logs ----------------------------------------------------------------------------------------------

REFERENCE_FORMAT = (
    "%(asctime)s [%(levelname)s] [node] [workload:%(workload_rank)s(%(workload_local_rank)s) "
    "infra:%(infra_rank)s(%(infra_local_rank)s)] %(filename)s:%(lineno)d %(message)s"
)


@pytest.fixture
def nvrx_records():
    """A handler on the reference's logger ``nvrx`` at DEBUG, formatting with the reference's format string."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(REFERENCE_FORMAT))
    records: list[logging.LogRecord] = []
    keep = logging.Handler(logging.DEBUG)
    keep.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("nvrx")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    logger.addHandler(keep)
    yield stream, records
    logger.removeHandler(handler)
    logger.removeHandler(keep)
    logger.setLevel(level)


def test_records_pass_through_the_reference_logger_with_its_fields(nvrx_records, monkeypatch):
    stream, records = nvrx_records
    for name, value in dict(RANK="3", LOCAL_RANK="1", SLURM_PROCID="7", SLURM_LOCALID="2").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    inprocess.wrap.log.debug("restart %s", 1)
    inprocess.monitor_thread.log.info("from another module")
    assert [record.name for record in records] == ["inprocess.wrap", "inprocess.monitor_thread"]
    lines = stream.getvalue().splitlines()
    assert "[DEBUG] [node] [workload:3(1) infra:7(2)] test_inprocess_reference_surface.py:" in lines[0]
    assert lines[0].endswith(" restart 1") and lines[1].endswith(" from another module")
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("RANK", "None")  # a reserve rank's RANK
    inprocess.store.log.warning("no rank")
    assert (records[-1].workload_rank, records[-1].workload_local_rank) == ("?", "?")
    # The package's own logger sits between the modules' and nvrx: its level and handlers apply as well.
    assert logging.getLogger("inprocess").parent is logging.getLogger("nvrx")
    assert logging.getLogger("inprocess.wrap").parent is logging.getLogger("inprocess")


def test_importing_configures_no_handler_and_records_still_reach_the_root(caplog):
    for name in ("nvrx", "inprocess", "inprocess.wrap", "inprocess.monitor_process"):
        assert logging.getLogger(name).handlers == [], name
        assert logging.getLogger(name).propagate, name
    with caplog.at_level(logging.INFO, logger="inprocess.wrap"):
        inprocess.wrap.log.info("seen by the root's handlers")
    assert caplog.records[-1].getMessage() == "seen by the root's handlers"


def test_records_hold_no_exception_but_print_its_traceback(nvrx_records):
    stream, records = nvrx_records

    class Holder:
        pass

    def fail(holder: Holder) -> None:
        raise ValueError("kept")

    holder = Holder()
    try:
        fail(holder)
    except ValueError as error:
        inprocess.wrap.log.warning("rank %s: %r failed (%s)", 0, error, error, exc_info=error)
    record = records[-1]
    assert record.exc_info is None and "ValueError: kept" in record.exc_text
    assert record.getMessage() == "rank 0: ValueError('kept') failed (kept)"
    assert not any(isinstance(arg, BaseException) for arg in record.args)
    assert "Traceback (most recent call last)" in stream.getvalue() and "in fail" in stream.getvalue()


def test_records_of_two_calls_never_double(nvrx_records):
    """The reference's logging test: a second handler after the first is removed sees what the first saw."""
    stream, records = nvrx_records
    inprocess.wrap.log.debug("one line")
    inprocess.wrap.log.debug("one line")
    assert stream.getvalue().count("one line") == 2


def test_the_older_logging_set_up_of_the_reference_is_opt_in_and_undone():
    logger = logging.getLogger("inprocess")
    stream = io.StringIO()
    nvrx = logging.getLogger("nvrx")
    handler = logging.StreamHandler(stream)
    nvrx.addHandler(handler)
    try:
        inprocess.utils.Logging.initialize()
        assert handler in logger.handlers and not logger.propagate
        inprocess.utils.Logging.deinitialize()
        assert logger.handlers == [] and logger.propagate
    finally:
        nvrx.removeHandler(handler)

    class Marker(logging.Handler):
        pass

    marker = Marker()
    nvrx.addHandler(marker)
    try:
        assert inprocess.utils.find_nearest_handler(logging.getLogger("inprocess.wrap"), Marker) is marker
    finally:
        nvrx.removeHandler(marker)
    assert inprocess.utils.find_nearest_handler(logging.getLogger("inprocess.wrap"), Marker) is None


# ---- item 4: the progress watchdog's timing --------------------------------------------------------------------


class Collect:
    def __init__(self) -> None:
        self.stamps: list[tuple[float, Timestamp]] = []  # (when sent, what)

    def send_timestamp(self, timestamp: Timestamp) -> None:
        self.stamps.append((time.monotonic(), dataclasses.replace(timestamp)))


def _run_python(seconds: float) -> None:
    """The main thread executes bytecode (so the pending calls run), with short sleeps as the reference's tests."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(1e-4)


def _wait_for(predicate, what: str) -> None:
    """Until ``predicate()`` holds (30 s at most), asked every 0.1 ms: the main thread executes bytecode between
    the short sleeps, as ``_run_python`` does, so the watchdog's pending calls run."""
    wait_until(predicate, 30.0, 1e-4, what=what)


@pytest.fixture
def watchdog():
    collect = Collect()
    dog = ProgressWatchdog(0, collect, datetime.timedelta(milliseconds=1))
    dog.start()
    yield dog, collect
    dog.shutdown(5)


def test_automatic_stamps_are_at_least_an_interval_apart(watchdog):
    dog, collect = watchdog
    _wait_for(lambda: len({stamp.auto for _, stamp in collect.stamps}) > 20, "21 distinct automatic stamps")
    dog.pause_and_synchronize()
    sends = [sent for sent, _ in collect.stamps[:-1]]  # the last one: the pause's reset
    autos = [stamp.auto for _, stamp in collect.stamps[:-1]]
    assert len(set(autos)) > 20 and all(isinstance(auto, float) for auto in autos)
    assert autos == sorted(autos)
    assert all(stamp.manual is None for _, stamp in collect.stamps)
    # Each turn of the loop waits an interval: at most one stamp per interval, and the main thread's proofs of
    # life (the times the calls were scheduled) are an interval apart too.
    # (A timed wait may end a few microseconds early: the bound allows 0.1 of the interval for it.)
    assert all(later - earlier >= 0.0009 for earlier, later in zip(sends, sends[1:], strict=False))
    distinct = sorted(set(autos))
    assert all(later - earlier >= 0.0009 for earlier, later in zip(distinct, distinct[1:], strict=False))


def test_pause_stops_the_stamps_and_resume_starts_them_again(watchdog):
    dog, collect = watchdog
    _wait_for(lambda: len(collect.stamps) > 5, "6 stamps")
    dog.pause_and_synchronize()
    paused = len(collect.stamps)
    _run_python(0.05)
    assert len(collect.stamps) == paused  # nothing while paused (the last stamp was the pause's own reset)
    dog.resume()
    _wait_for(lambda: len({stamp.auto for _, stamp in collect.stamps[paused:]}) > 2, "3 stamps after the resume")
    # From the pause's own reset on (a turn sends the stamps only when they changed: inprocess.busy).
    after = [stamp.auto for _, stamp in collect.stamps[paused - 1 :]]
    # No proof of life is made up for the pause: the first new one comes from a call scheduled after the resume,
    # so the stamps after the resume jump by at least the pause (as the reference's test asks: more than 10 ms).
    assert max(later - earlier for earlier, later in zip(after, after[1:], strict=False)) >= 0.049
    dog.resume()  # twice: harmless
    count = len(collect.stamps)
    _wait_for(lambda: len(collect.stamps) > count + 2, "stamps after a second resume")


def test_shutdown_sends_one_last_stamp_and_a_second_one_nothing():
    collect = Collect()
    dog = ProgressWatchdog(0, collect, datetime.timedelta(milliseconds=1))
    dog.start()
    _wait_for(lambda: len(collect.stamps) > 5, "6 stamps")
    dog.pause_and_synchronize()  # no turn under way: what shutdown sends is exactly its own stamp
    before = len(collect.stamps)
    dog.shutdown()
    assert len(collect.stamps) == before + 1 and not dog.is_alive()
    _run_python(0.02)
    dog.shutdown()
    assert len(collect.stamps) == before + 1
    with pytest.raises(RuntimeError):
        dog.resume()
    never_started = ProgressWatchdog(1, collect, 0.001)
    never_started.shutdown()  # nothing to stop, nothing sent
    assert len(collect.stamps) == before + 1


# ---- item 5: the reference's helpers ---------------------------------------------------------------------------


def test_param_utils_in_the_reference_forms():
    from inprocess.param_utils import check_type, count_type_in_params, enforce_subclass, enforce_type, enforce_value

    def fn(a: int, call_wrapper: inprocess.CallWrapper | None = None, other: inprocess.CallWrapper = None):
        return call_wrapper, other

    assert count_type_in_params(fn, inprocess.CallWrapper) == 2
    assert check_type(inprocess.CallWrapper | None, inprocess.CallWrapper) and not check_type(int, str)
    marker = object()
    args, kwargs = inprocess.param_utils.substitute_param_value(fn, (1,), {}, {inprocess.CallWrapper: marker})
    assert fn(*args, **kwargs) == (marker, marker)

    timeout = 3  # read by enforce_type from this frame
    enforce_type("timeout", int)  # the reference's form: the caller's local variable
    with pytest.raises(TypeError, match="timeout"):
        enforce_type("timeout", str)
    factory = HashStore  # noqa: F841 - read by enforce_subclass from this frame, as the reference's does
    enforce_subclass("factory", inprocess.store.StoreMixin)
    with pytest.raises(TypeError):
        enforce_subclass("factory", str)
    soft, hard = 5, timeout
    enforce_value(soft < hard + 10)
    with pytest.raises(ValueError, match=r'Condition "soft < hard" failed\. Variables: hard=3, soft=5'):
        enforce_value(soft < hard)


def test_utils_format_as_the_reference(monkeypatch):
    from inprocess import utils

    assert utils.format_rank_set_verbose([9, 1, 2, 3, 5, 7, 8]) == "{1-3, 5, 7-9}"
    assert utils.format_rank_set_brief(range(16)) == "{0, 1, 2, 3...12, 13, 14, 15 (total: 16)}"
    assert utils.format_rank_set_brief({2, 1}) == "{1, 2}" and utils.format_rank_set([]) == "{}"
    monkeypatch.setenv("NVRX_LOG_RANK_FORMAT_VERBOSE", "1")
    assert utils.format_rank_set(range(16)) == "{0-15}"
    assert utils.log_exc(State(3, 4), ValueError("x"), "fn_ex").endswith("] rank=3 fn_ex: ValueError('x')")
    assert utils.log_exc(5, KeyError("k"), "e").endswith("rank=5 e: KeyError('k')")
    assert utils.torch_older_than("999.0") and not utils.torch_older_than("1.0")

    @utils.log_exec
    def timed(x: int) -> int:
        return x + 1

    assert timed(1) == 2
    with utils.log_exec("a block"):
        pass
    frozen = inprocess.state.freeze_dataclass(State)
    assert [field.name for field in dataclasses.fields(frozen)] == [f.name for f in dataclasses.fields(State)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen(0, 1).rank = 2  # type: ignore[misc]
    assert inprocess.compose.find_common_ancestor(Trace(), inprocess.health_check.FaultCounter()) is HealthCheck


def test_delayed_async_raise_arrives_after_the_caller_returned():
    with pytest.raises(RankShouldRestart):
        delayed_async_raise(threading.main_thread().ident, RankShouldRestart)
        _run_python(20)


def test_monitor_process_helpers():
    import subprocess
    import sys

    from inprocess.monitor_process import Message, is_process_active, terminate_process

    assert Message.TIMESTAMP == "ts" and Message("stop") is Message.TERMINATE
    ignore_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
    stubborn = subprocess.Popen([sys.executable, "-c", ignore_sigterm + "time.sleep(600)"], stdout=subprocess.PIPE)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"1\n"  # SIGTERM is ignored from now
        assert is_process_active(stubborn.pid)
        terminate_process(stubborn.pid, datetime.timedelta(milliseconds=50), logging.getLogger("test"))
        assert stubborn.wait(30) == -9  # SIGTERM ignored: SIGKILL after the grace time
    finally:
        stubborn.kill()
    assert not is_process_active(stubborn.pid)


# ---- the sibling monitor (a dead node): counters, the watcher's clock ------------------------------------------


def test_a_sibling_whose_heartbeat_stops_is_terminated_and_the_next_one_watched():
    raw = HashStore()
    call = PrefixedStore("_inprocess_call/x/1", raw)
    store = call.iteration_store(0)
    for rank in range(4):
        store.set_initial_rank(rank, rank)
    beats = {rank: inprocess.sibling_monitor.Heartbeat(rank, store, 1.0) for rank in range(4)}
    watcher = inprocess.sibling_monitor.SiblingMonitor(store, 1, 4, 4, datetime.timedelta(seconds=5), 1.0)
    assert watcher.sibling_rank == 2
    now = time.monotonic()
    for second in range(0, 12):
        for rank, beat in beats.items():
            if rank != 2 or second < 3:  # rank 2's node dies after 3 s
                beat.beat(now + second)
        watcher.check_heartbeats(now + second + 0.5)
    assert store.get_terminated_ranks() == {2}
    assert watcher.sibling_rank == 3 and watcher.seen_unresponsive_ranks == {2}
    assert any(
        reason.startswith("UNRESPONSIVE rank 2: no heartbeat for")
        for reason in store.get_packed(inprocess.store.FAULT_REASONS_KEY, "\n")
    )
    assert store.get("heartbeat_1") == str(beats[1].count).encode()  # a counter, not a time
    store.iteration_barrier([0, 1, 3], 4, 5)  # rank 2 was registered on its behalf: the others do not wait
    call.termination_barrier([0, 1, 3], 4, 5)  # and its initial rank at the termination barrier


def test_a_sibling_still_connecting_at_start_up_is_given_the_startup_timeout_and_no_more():
    """In a job's start-up a monitor beats only once connected to the store (20 s to a loaded etcd were seen): a
    sibling that has never beaten gets ``startup_timeout``, not ``heartbeat_timeout``; one that never comes at all
    is still terminated, after it; and one that beat and stopped gets ``timeout`` as before."""
    store = PrefixedStore("c", HashStore()).iteration_store(0)
    for rank in range(3):
        store.set_initial_rank(rank, rank)
    late = inprocess.sibling_monitor.Heartbeat(1, store, 1.0)
    watcher = inprocess.sibling_monitor.SiblingMonitor(store, 0, 3, 3, 5.0, 1.0, startup_timeout=60.0)
    # The watcher's clock is given (``now``), not read: the seconds below are the rule's, no measured speed.
    now = time.monotonic()
    for second in range(40):
        if second >= 20:  # its monitor connected after 20 s, four heartbeat timeouts
            late.beat(now + second)
        watcher.check_heartbeats(now + second)
    assert store.get_terminated_ranks() == set() and watcher.sibling_rank == 1
    for second in range(40, 46):  # it stops: the heartbeat timeout again (its last beat at 39)
        watcher.check_heartbeats(now + second)
        assert (1 in store.get_terminated_ranks()) == (second > 39 + 5), second
    assert watcher.sibling_rank == 2
    for second in range(46, 46 + 70):  # rank 2 never beats at all: terminated once the start-up timeout is over
        watcher.check_heartbeats(now + second)
        assert (2 in store.get_terminated_ranks()) == (second > 45 + 60), second


def test_counters_not_clocks_a_slow_clock_elsewhere_is_no_death():
    store = PrefixedStore("c", HashStore()).iteration_store(0)
    beat = inprocess.sibling_monitor.Heartbeat(1, store, 1.0)
    watcher = inprocess.sibling_monitor.SiblingMonitor(store, 0, 2, 2, 5.0, 1.0)
    now = time.monotonic()
    for second in range(30):
        beat.beat(now + second)  # its counter moves, whatever its host's wall clock says
        watcher.check_heartbeats(now + second)
    assert store.get_terminated_ranks() == set()


def test_a_single_rank_watches_nobody():
    watcher = inprocess.sibling_monitor.SiblingMonitor(PrefixedStore("c", HashStore()), 0, 1, 1, 1.0, 0.1)
    assert watcher.sibling_rank is None
    watcher.check_heartbeats(time.monotonic() + 100)


def test_rank_fields_follow_slurm_job_arrays(monkeypatch):
    for name, value in dict(SLURM_PROCID="3", SLURM_ARRAY_TASK_ID="2", SLURM_NNODES="4").items():
        monkeypatch.setenv(name, value)
    assert logs.rank_fields()["infra_rank"] == 2 * 4 + 3
    monkeypatch.delenv("SLURM_NNODES")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "5")
    assert logs.rank_fields()["infra_rank"] == 2 * 5 + 3
