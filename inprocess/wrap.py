"""``Wrapper`` and ``CallWrapper``: restart the wrapped function inside the surviving processes.

One call of a wrapped function, seen from one rank::

    CallWrapper()   start the monitor process (fresh interpreter), build the store, initial barrier,
                    wait for the monitor, start the progress watchdog, first rank assignment
    iteration i     monitor thread on; initialize; health check; fn (active) | wait (reserve);
                    completion barrier -----------------------------------------> success: completion, return
        fault       anyone records it -> every monitor thread: last_call_wait, abort, raise into fn
    restart         wait for the abort; finalize; health check; iteration barrier (dead ranks registered by
                    their monitor); rank assignment over terminated_ranks; i += 1
    exit            any BaseException: mark self terminated, register at the barriers, terminate, re-raise
    shutdown        termination barrier (bounded, also on the store host), stop threads and monitor, restore
                    RANK/WORLD_SIZE
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed

from torchras_formats import launch_events as launch_records

from . import (
    exception,
    fault_source,
    health_check as health_check_module,
    launch_events,
    logs,
    mesh_source,
    param_utils,
    release,
    repeated_faults as repeated_faults_module,
    restart_info,
    store as store_module,
    wake,
    wrapper_settings,
)
from .abort import Abort, AbortTorchDistributed, connection_key, established_connections
from .attribution import Interruption, InterruptionRecord
from .completion import Completion
from .compose import Compose
from .elastic import caches as dtensor_caches, joining as joining_module
from .exception import HealthCheckError, InternalError  # noqa: F401 - names of the reference's module
from .finalize import Finalize
from .health_check import ChainedGPUHealthCheck, ChainedNicHealthCheck, ChainedNVLHealthCheck, HealthCheck
from .initialize import Initialize
from .monitor_process import MonitorProcess
from .monitor_thread import MonitorThread, RankShouldRestart, reraise_if_unraisable  # noqa: F401 - names of the reference's module
from .param_utils import enforce_subclass, enforce_type, enforce_value  # noqa: F401 - names of the reference's module
from .progress_watchdog import ProgressWatchdog
from .rank_assignment import ActivateAllRanks, RankAssignment, RankAssignmentCtx, ShiftRanks
from .restart_info import RestartInfo
from .state import FrozenState, Mode, State
from .store import PrefixStore, StoreMixin, TCPStore  # noqa: F401 - names of the reference's module
from .terminate import Terminate
from .user_store import UserStoreConnection
from .utils import log_exc  # noqa: F401 - names of the reference's module
from .verdict_sink import VerdictSink

log = logs.get_logger(__name__)

# Shared default instances, as documented by the reference (both are stateless).
DEFAULT_ABORT = AbortTorchDistributed()


def _default_rank_assignment() -> RankAssignment:
    """``Compose`` of two rank assignments is an instance of ``RankAssignment`` (``inprocess.compose``: it takes
    the lowest common base class of its members), which the type checker cannot see; this says so."""
    composite = Compose(ActivateAllRanks(), ShiftRanks())
    assert isinstance(composite, RankAssignment), "Compose of rank assignments is a RankAssignment"
    return composite


DEFAULT_RANK_ASSIGNMENT = _default_rank_assignment()

_SECONDS = datetime.timedelta(seconds=1)


class HealthCheckPassed(Exception):
    """The reference's internal signal that the restart health check passed. Nothing here raises it (the restart is
    a plain step of ``CallWrapper._restart``); the name is kept for code that refers to it."""


class Wrapper(wrapper_settings.Settings):
    """Decorator that restarts the wrapped function in-process after a fault on any rank.

    All parameters are keyword-only; timeouts and intervals are ``datetime.timedelta`` (plain seconds are accepted
    too). Defaults and the validation of the timeout ladder follow nvidia-resiliency-ext's ``inprocess.Wrapper``.
    """

    def __init__(
        self,
        *,
        store_factory: type = store_module.TCPStore,
        store_kwargs: dict[str, Any] | None = None,
        initialize: Initialize | None = None,
        abort: Abort | None = DEFAULT_ABORT,
        finalize: Finalize | None = None,
        health_check: HealthCheck | None = None,
        rank_assignment: RankAssignment = DEFAULT_RANK_ASSIGNMENT,
        monitor_thread_interval: datetime.timedelta = _SECONDS,
        monitor_process_interval: datetime.timedelta = _SECONDS,
        heartbeat_interval: datetime.timedelta = _SECONDS,
        progress_watchdog_interval: datetime.timedelta = _SECONDS,
        soft_timeout: datetime.timedelta = 60 * _SECONDS,
        hard_timeout: datetime.timedelta = 90 * _SECONDS,
        heartbeat_timeout: datetime.timedelta = 30 * _SECONDS,
        barrier_timeout: datetime.timedelta = 120 * _SECONDS,
        completion_timeout: datetime.timedelta = 120 * _SECONDS,
        last_call_wait: datetime.timedelta = _SECONDS,
        termination_grace_time: datetime.timedelta = 5 * _SECONDS,
        monitor_process_logfile: str | None = None,
        monitor_process_pidfile: str | None = None,
        enabled: bool = True,
        completion: Completion | None = None,
        terminate: Terminate | None = None,
        joining: joining_module.Joining | None = None,
        repeated_faults: repeated_faults_module.RepeatedFaults
        | None
        | repeated_faults_module._FromEnvironment = repeated_faults_module.FROM_ENVIRONMENT,
    ) -> None:
        wrapper_settings.apply(self, dict(locals()))  # the keyword arguments, by name (``self`` is not read)
        self._construct_restart_health_check()

    def _construct_restart_health_check(self) -> None:
        """``restart_health_check``: the user's check plus GPU/NVLink/NIC checks when LOCAL_RANK is set, as in the
        reference (harmless on CPUs). The check classes are read from this module's namespace when the Wrapper is
        built, so ``unittest.mock.patch("inprocess.wrap.ChainedGPUHealthCheck", ...)`` replaces them."""
        self.restart_health_check = health_check_module.restart_health_check(
            self.health_check, ChainedGPUHealthCheck, ChainedNVLHealthCheck, ChainedNicHealthCheck
        )

    def __call__(self, fn: Callable) -> Callable:
        if not self.enabled:
            return fn

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            caught: list[BaseException] = []
            try:
                with CallWrapper(self) as call_wrapper:
                    caught = call_wrapper._caught
                    return call_wrapper(fn, args, kwargs)
            except BaseException as error:
                release.release_wrapper_frames(error)
                raise
            finally:  # nothing of a call outlives it, even through an exception its function raised and let go
                release.release_wrapper_frames(*caught)
                caught.clear()

        return wrapped


class CallWrapper:
    """One call of the wrapped function on this rank: the restart loop and what the function may use of it.

    Injected into every parameter of the wrapped function annotated ``CallWrapper`` (or ``Optional``/``Union``
    of it; string annotations work too).
    """

    def __init__(self, wrapper: Wrapper) -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise ValueError(
                'Condition "not torch.distributed.is_initialized()" failed: the wrapper creates the process groups '
                "inside the wrapped function; destroy the default process group before calling it"
            )
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("a wrapped function must be called from the main thread")
        self.wrapper = wrapper
        self._saved_env = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
        self.state = State.from_env()
        self.atomic_lock = threading.RLock()
        self.monitor_process: MonitorProcess | None = None
        self.watchdog: ProgressWatchdog | None = None
        self.monitor_thread: MonitorThread | None = None
        self.base_store: Any = None
        #: The wrapped function's own store in the current iteration, on the wrapper's durable backend (the store
        #: server process, or etcd): use it for ``init_process_group(store=call_wrapper.store, ...)``. The
        #: reference's attribute of the same name is its base store; this one is a fresh namespace per iteration.
        self.store: Any = None
        self._user_connection: Any = None
        #: Makes and cuts the connection behind ``self.store`` (inprocess.user_store): cut at every restart.
        self._user: UserStoreConnection | None = None
        self._monitor_connection: Any = None
        self._fault_connection: Any = None
        self._protected: set[tuple] = set()
        #: Applies the mesh's and the user's verdicts to this call (``inprocess.verdict_sink``).
        self.verdicts = VerdictSink(self)
        self._return_value: Any = None
        self.shut_down = False
        self.mesh: mesh_source.MeshFaultSource | None = None
        #: The last restart of this call (None before the first): what the wrapped function may print.
        self.last_restart: RestartInfo | None = None
        self._restarts = 0
        #: Called (no arguments) at every restart, out of the function: inprocess.elastic states restore here.
        self.restart_hooks: list[Callable[[], Any]] = []
        #: The rendezvous of processes joining the running job (``Wrapper(joining=...)``), else None.
        self.joining: joining_module.JoinDriver | None = None
        self._newcomer = wrapper.joining is not None and wrapper.joining.is_newcomer()
        #: The repeat count of this call (``inprocess.repeated_faults``); the training reports progress to it.
        self.repeats = wrapper.repeated_faults.tracker(self._tell_monitor_progress) if wrapper.repeated_faults else None
        self._previous_unraisablehook: Callable[[Any], Any] | None = None
        #: Whether this call holds the wake signal's handler (``inprocess.wake``), to give back at shutdown.
        self._wake_installed = False
        #: Exceptions the function raised in this iteration: the user may keep them (``fn_exception``), so the
        #: wrapper's frames in their tracebacks are released after the restart, or when the call ends.
        self._caught: list[BaseException] = []
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise

    # ---- set-up -----------------------------------------------------------------------------------------------

    def _new_connection(self) -> Any:
        try:
            return self.base_store.new_connection()
        except NotImplementedError:  # a store without new_connection: a fresh client, in this call's namespace
            return store_module.NamespaceStore(
                self.base_store.prefix, self.wrapper.store_factory(**self.wrapper.store_kwargs)
            )

    def _start(self) -> None:
        w = self.wrapper
        # Before the start-up barrier: a launcher that loses a worker before the job's first round restarts the
        # group only for a job whose workers run the Wrapper (torchras.launch.startup).
        launch_events.announce(launch_records.WrapperStarting(newcomer=self._newcomer))
        newcomer_store: Any = None
        if self._newcomer:  # docs/elastic.md section 5: the running call's namespace, the next initial rank
            assert w.joining is not None
            newcomer_store = joining_module.find_running_call(w.store_factory, w.store_kwargs, w.barrier_timeout)
            self.joining = joining_module.JoinDriver.for_newcomer(w.joining, newcomer_store[0])
            self.state = State(
                rank=None,
                world_size=0,
                initial_rank=self.joining.initial_rank,
                initial_world_size=self.joining.initial_world_size,
            )
        rank, world_size = self.state.rank, self.state.world_size
        initial_rank, initial_world_size = int(self.state.initial_rank or 0), int(self.state.initial_world_size or 1)
        self.monitor_process = MonitorProcess(  # first, so its start-up overlaps ours
            rank=initial_rank,
            world_size=initial_world_size,
            soft_timeout=w.soft_timeout,
            hard_timeout=w.hard_timeout,
            termination_grace_time=w.termination_grace_time,
            barrier_timeout=w.barrier_timeout,
            interval=w.monitor_process_interval,
            heartbeat_interval=w.heartbeat_interval,
            heartbeat_timeout=w.heartbeat_timeout,
            log_filename=w.monitor_process_logfile,
            pid_filename=w.monitor_process_pidfile,
            store_factory=w.store_factory,
            store_kwargs=w.store_kwargs,
        )
        # Every call works in a namespace of its own on a store that outlives it (docs/inprocess.md section 7).
        if newcomer_store is not None:
            self.base_store, raw_store = newcomer_store
        else:
            self.base_store, raw_store = store_module.open_base_store(
                w.store_factory, w.store_kwargs, w.barrier_timeout, initial_rank
            )
        self.monitor_process.store_ready(self.base_store.prefix, raw_store)
        if w.joining is not None and not self._newcomer:
            self.joining = joining_module.JoinDriver.for_initial_rank(
                w.joining, raw_store, self.base_store, initial_rank, initial_world_size
            )
        del raw_store, newcomer_store
        self._user = UserStoreConnection(self._new_connection)
        self._user_connection = self._user.connection
        self._monitor_connection = self._new_connection()
        self._fault_connection = self._new_connection()
        if not self._newcomer:
            self.base_store.initial_barrier([rank], world_size, w.barrier_timeout)
        self.monitor_process.wait_ready(w.barrier_timeout)
        self._join_mesh()
        self._protected = {connection_key(connection) for connection in established_connections()}
        self.watchdog = ProgressWatchdog(self.state.initial_rank, self.monitor_process, w.progress_watchdog_interval)
        self.watchdog.start()
        self._previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = self._unraisablehook
        # Before the first monitor thread starts: a restart reaches a main thread blocked in a C call.
        self._wake_installed = wake.install()
        fault_source.register_active_call(self)
        if self.joining is not None and self._newcomer:
            self.joining.join()  # in the wait list of the running round; admitted at the next round (__call__)
        # The launcher respawns a dead worker only where a replacement can be admitted (inprocess.launch_events).
        launch_events.announce(
            launch_records.Wrapper(
                joining=self.joining is not None, newcomer=self._newcomer, initial_rank=self.state.initial_rank
            )
        )

    def _join_mesh(self) -> None:
        """The rasd mesh's verdicts become restarts (``inprocess.mesh_source``); off with ``TORCHRAS_ENABLE=0``."""
        if not mesh_source.mesh_enabled():
            return
        initial_rank = _assigned(self.state.initial_rank, "the initial rank")
        source = mesh_source.MeshFaultSource(self, self._new_connection(), initial_rank)
        if source.start(self._new_connection()):
            self.mesh = source

    def _unraisablehook(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, RankShouldRestart) and self.monitor_thread is not None:
            self.monitor_thread.notify_swallowed()
        # Installed right after the previous hook was saved (``_start``), so it is set whenever this runs.
        if self._previous_unraisablehook is not None:
            self._previous_unraisablehook(unraisable)

    # ---- what the wrapped function uses -----------------------------------------------------------------------

    @property
    def iteration(self) -> int:
        return self.state.iteration

    def ping(self) -> None:
        """Manual progress stamp; the first ping of an iteration arms the timeout on manual stamps. An iteration
        that pings more often than the one before it did is progress (``inprocess.repeated_faults``)."""
        if self.watchdog is not None:
            self.watchdog.ping()
        if self.repeats is not None:
            self.repeats.ping()

    def progress(self) -> None:
        """The training got further than ever before in this call (a step, a commit): a fault that comes back after
        this is not a repeat of the one before (``inprocess.repeated_faults``). Cheap: call it every step."""
        if self.repeats is not None:
            self.repeats.progress("call")

    def _tell_monitor_progress(self) -> None:
        if self.monitor_process is not None:  # the hard timeout no longer counts the earlier iterations' hang
            self.monitor_process.progress()

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A section that a restart never cuts: the abort and the restart exception wait until it ends."""
        with self.atomic_lock:
            yield

    @contextlib.contextmanager
    def disable_hang_protection(self) -> Iterator[None]:
        """No soft/hard timeouts inside (exceptions still restart); progress is reset on exit."""
        self._disable_hang_protection()
        try:
            yield
        finally:
            self._enable_hang_protection()

    def _disable_hang_protection(self) -> None:
        if self.monitor_process is not None:
            self.monitor_process.disable_timeouts()

    def _enable_hang_protection(self) -> None:
        if self.watchdog is not None:
            self.watchdog.reset()
        if self.monitor_process is not None:
            self.monitor_process.enable_timeouts()

    # ---- what the abort uses ----------------------------------------------------------------------------------

    def _abort(self, state: Any) -> Any:
        """The Wrapper's ``abort``, then the function's store connection cut (inprocess.user_store): a rank blocked
        in ``init_process_group`` waiting for a dead peer's address leaves it at once."""
        try:
            return self.wrapper.abort(state) if self.wrapper.abort is not None else state
        finally:
            if self._user is not None:
                self._user.cut_now()

    def store_ports(self) -> set[int]:
        ports = set()
        for store in (self.base_store, self._user_connection, self._monitor_connection, self._fault_connection):
            port = getattr(store, "port", None)
            if isinstance(port, int):
                ports.add(port)
            ports.update(getattr(store, "ports", None) or ())  # a replicated store: every member's port
        return ports

    def protected_connections(self) -> set[tuple]:
        return set(self._protected)

    # ---- external verdicts (inprocess.verdict_sink) -------------------------------------------------------------

    @property
    def fault_connection(self) -> Any:
        """The store connection external verdicts are written on (None once the call is shut down)."""
        return self._fault_connection

    def report_fault(self, verdict: fault_source.ExternalVerdict) -> bool:
        """Apply an external verdict to this job (see ``inprocess.fault_source``); False if it was ignored."""
        return self.verdicts.report_fault(verdict)

    def leave_rendezvous(self, initial_rank: int, store: Any) -> None:
        """A mesh PEER_DEAD verdict: the dead process leaves the rendezvous (``store``: the caller's connection)."""
        self.verdicts.leave_rendezvous(initial_rank, store)

    # ---- the restart loop -------------------------------------------------------------------------------------

    def __call__(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        inject = param_utils.injected_parameters(fn, CallWrapper)
        try:
            if self._newcomer:
                self._admit_newcomer()
            else:
                initial_store = store_module.PrefixStore("initial", self.base_store)
                self._assign(initial_store, set())
            while True:
                if self._run_iteration(fn, args, kwargs, inject):
                    break
                self._restart()
            if self.joining is not None:
                self.joining.close()  # the job completed: pending joins fail, nobody joins it any more
            launch_events.announce(launch_records.Completed(iteration=self.state.iteration))
            if self.wrapper.completion is not None:
                try:
                    self.wrapper.completion(self.state.freeze())
                except Exception:  # documented: logged and swallowed
                    log.warning("completion failed", exc_info=True)
            return self._return_value
        except BaseException as error:
            self._exit_path(error)
            raise

    def _admit_newcomer(self) -> None:
        """Wait in the wait list until a round admits this process; then it runs that round's iteration."""
        assert self.joining is not None
        log.info("process %s waits to join the running job", self.joining.node)
        restart_info.announce_waiting(True)  # STATUS lists this process under WAITING until a round admits it
        try:
            with self.disable_hang_protection():
                admission = self.joining.wait_for_admission()
        finally:
            restart_info.announce_waiting(False)
        self._enter_admitted(admission)
        self._publish()
        launch_events.announce(
            launch_records.Joined(rank=admission.rank, world_size=admission.world_size, iteration=admission.iteration)
        )
        log.info(
            "process %s joins as rank %s of %s in iteration %s (round %s)",
            self.joining.node,
            admission.rank,
            admission.world_size,
            admission.iteration,
            admission.round,
        )

    def _enter_admitted(self, admission: joining_module.Admission) -> None:
        """The round's ranks are the iteration's ranks, every one active (docs/elastic.md section 5)."""
        self.state = dataclasses.replace(
            self.state,
            rank=admission.rank,
            world_size=admission.world_size,
            active_rank=admission.rank,
            active_world_size=admission.world_size,
            mode=Mode.ACTIVE,
            iteration=admission.iteration,
        )

    def _publish(self) -> None:
        """Announce this rank's identity in the namespace of the iteration it is about to run."""
        state = self.state
        store = self.base_store.iteration_store(state.iteration)
        store.set_initial_rank(state.rank, state.initial_rank)
        store.append("world_size", f"{state.world_size},")

    def _assign(self, store: Any, terminated: set[int]) -> None:
        ctx = self.wrapper.rank_assignment(RankAssignmentCtx(self.state, store, set(terminated)))
        # A mode other than ACTIVE/INACTIVE is a fault of the iteration (``_call_function``), as in the reference.
        self.state = ctx.state

    def _run_iteration(self, fn: Callable, args: tuple, kwargs: dict, inject: list[str]) -> bool:
        """One iteration; True when every rank completed, False when a restart is due."""
        w, state = self.wrapper, self.state
        if state.iteration == 0 and not self._newcomer:
            self._publish()  # later iterations (and a newcomer's first) publish right after their rank assignment
        state.set_distributed_vars()
        launch_events.announce(
            launch_records.Iteration(iteration=state.iteration, rank=state.rank, world_size=state.world_size)
        )
        store = self.base_store.iteration_store(state.iteration)
        assert self._user is not None
        self.store = self._user.store(state.iteration)
        self._user_connection = self._user.connection
        assert self.monitor_process is not None and self.watchdog is not None
        rank = _assigned(state.rank, "the rank")
        self.monitor_process.start_iteration(
            rank,
            state.world_size,
            state.iteration,
            _assigned(state.initial_rank, "the initial rank"),
            _assigned(state.initial_world_size, "the initial world size"),
        )
        self.watchdog.reset()
        if self.repeats is not None:
            self.repeats.new_iteration()
        if self.mesh is not None:
            self.mesh.begin_iteration(state.iteration)
        monitor = MonitorThread(
            state_fn=lambda: self.state.freeze(),
            store=self._monitor_connection.iteration_store(state.iteration),
            abort=self._abort,
            last_call_wait=w.last_call_wait,
            soft_timeout=w.soft_timeout,
            atomic_lock=self.atomic_lock,
            main_thread_id=threading.get_ident(),
            rank=state.rank,
        )
        self.monitor_thread = monitor
        monitor.start()
        outcome: tuple[str, Any] | None = None
        while True:
            try:
                if outcome is None:
                    outcome = self._call_function(fn, args, kwargs, inject)
                monitor.leave_function()
                break
            except RankShouldRestart as restart:  # delivered between the function and leave_function
                outcome = ("error", restart)

        kind, payload = outcome
        log.debug("rank %s left the function: %s", state.rank, kind)
        if kind == "error":
            self._caught.append(payload)  # its frames are released after the restart (release.py)
            if isinstance(payload, RankShouldRestart):
                log.info("rank %s leaves iteration %s: %s", state.rank, state.iteration, payload)
                if not monitor.raised_restart:  # raised by the workload itself: a restart of every rank
                    cause = payload.__cause__
                    state.fn_exception = cause if isinstance(cause, Exception) else None
                    store.record_interrupted(
                        [InterruptionRecord(rank, Interruption.EXCEPTION)],
                        reason=f"RankShouldRestart raised on rank {state.initial_rank}: {payload}",
                    )
            elif isinstance(payload, Exception):
                if monitor.interrupted.is_set():
                    log.info("rank %s: %r while a restart was under way", state.rank, payload)
                else:
                    log.warning(
                        "rank %s: %r in iteration %s, restarting",
                        state.rank,
                        payload,
                        state.iteration,
                        exc_info=payload,
                    )
                    state.fn_exception = payload
                    store.record_interrupted(
                        [InterruptionRecord(rank, Interruption.EXCEPTION)],
                        reason=f"{type(payload).__name__} on rank {state.initial_rank}: {payload}",
                    )
            else:
                raise payload
            return False

        if state.mode == Mode.ACTIVE:
            store.record_completed()
        timeout = w.completion_timeout if state.mode == Mode.ACTIVE else None
        try:
            with self.disable_hang_protection():  # the wrapper's own bounded store waits
                completed = store.completion_barrier([state.rank], state.world_size, timeout)
        except store_module.BarrierTimeout as error:
            log.warning("rank %s: %s, restarting", state.rank, error)
            store.record_interrupted([InterruptionRecord(rank, Interruption.EXCEPTION)])
            return False
        if completed:
            self._return_value = payload
            monitor.shutdown(self._thread_budget())
            return True
        return False

    def _call_function(self, fn: Callable, args: tuple, kwargs: dict, inject: list[str]) -> tuple[str, Any]:
        w, state = self.wrapper, self.state
        try:
            frozen = state.freeze()
            if w.initialize is not None:
                w.initialize(frozen)
            _run_health_check(w.health_check, frozen, "health check")
            if state.mode == Mode.INACTIVE:
                return ("ok", None)
            if state.mode != Mode.ACTIVE:
                raise exception.InternalError(f"rank assignment left rank {state.rank} in mode {state.mode}")
            call_args, call_kwargs = param_utils.substitute_param_value(
                fn, args, kwargs, {name: self for name in inject}
            )
            return ("ok", fn(*call_args, **call_kwargs))
        except BaseException as error:  # noqa: BLE001 - sorted out by the caller
            return ("error", error)

    def _thread_budget(self) -> float:
        w = self.wrapper
        return 5 * w.monitor_thread_interval + w.last_call_wait + 5

    def _restart(self) -> None:
        w, state = self.wrapper, self.state
        monitor = self.monitor_thread
        assert monitor is not None
        started = time.monotonic()
        with self.disable_hang_protection():  # a bounded wait of the wrapper's own (last_call_wait, the abort)
            aborted = monitor.wait_aborted(self._thread_budget())
        if not aborted:
            log.warning("rank %s: the monitor thread did not abort in time; aborting here", state.rank)
            if w.abort is not None:
                try:
                    w.abort(state.freeze())
                except Exception:
                    log.warning("abort failed", exc_info=True)
        log.debug("abort done")
        if not monitor.shutdown(self._thread_budget()):
            raise exception.TimeoutError("the monitor thread did not stop")
        assert self.watchdog is not None
        self.watchdog.reset()
        frozen = state.freeze()
        if w.finalize is not None:
            w.finalize(frozen)
        dtensor_caches.forget_dtensor_caches()  # their specs hold the old device meshes (docs/elastic.md §9)
        for hook in list(self.restart_hooks):  # docs/elastic.md section 3: restore the last commit
            hook()
        _run_health_check(w.restart_health_check, frozen, "restart health check")
        store = self.base_store.iteration_store(state.iteration)
        if self.repeats is not None:  # what the count needs of this rank, before the barrier
            self.repeats.record(store, state.fn_exception, state.initial_rank, state.iteration)
        log.debug("restart: entering the iteration barrier")
        with self.disable_hang_protection():  # the wrapper's own bounded store waits
            store.iteration_barrier([state.rank], state.world_size, w.barrier_timeout)
        log.debug("restart: left the iteration barrier")
        terminated = store.get_terminated_ranks()
        terminated_initial = restart_info.initial_ranks(store, terminated)
        reasons = restart_info.order_reasons(store.get_packed(store_module.FAULT_REASONS_KEY, "\n")) or [
            monitor.message
        ]
        fault_time = restart_info.fault_time(store)
        if self.repeats is not None:  # the same decision on every rank: all leave in this iteration, or none
            previous = self.base_store.iteration_store(state.iteration - 1) if state.iteration > 0 else None
            decision = self.repeats.decide(store, previous, reasons, state.iteration)
            if decision is not None and decision.give_up:
                raise self.repeats.give_up(decision)
        self._assign(store_module.PrefixStore("assignment", store), terminated)
        if self.joining is not None:  # the next rendezvous round: survivors and waiting processes, ranks agreed
            with self.disable_hang_protection():
                admission = self.joining.next_round(terminated, state.iteration + 1)
            self._enter_admitted(dataclasses.replace(admission, iteration=state.iteration))
        self.state.advance()
        self._publish()
        self._restarts += 1
        lost = max(0.0, time.time() - fault_time) if fault_time is not None else time.monotonic() - started
        self.last_restart = RestartInfo(
            self.state.iteration, self._restarts, tuple(reasons), tuple(terminated_initial), lost
        )
        log.info(
            "rank %s restarts as rank %s of %s (active %s of %s), iteration %s, terminated initial ranks %s, "
            "after %s; %.3f s lost",
            state.rank,
            self.state.rank,
            self.state.world_size,
            self.state.active_rank,
            self.state.active_world_size,
            self.state.iteration,
            terminated_initial,
            "; ".join(reasons),
            lost,
        )
        restart_info.announce_restart(self.last_restart)
        # What the failed iteration raised is done with: its frames of this package keep none of the call's objects
        # (the user may still hold the exception), and nothing accumulates over a long job's restarts.
        release.release_wrapper_frames(*self._caught)
        self._caught.clear()
        # Free what the failed iteration left in reference cycles. The young generations hold it; a full
        # collection costs ~70 ms in a torch process, on every rank, on the critical path of the restart.
        gc.collect(1)

    def _exit_path(self, error: BaseException) -> None:
        """The rank leaves: make sure nobody waits for it, then run ``terminate``."""
        state = self.state
        log.warning("rank %s leaves the wrapper: %r", state.rank, error)
        if isinstance(error, joining_module.JoinFailed):  # refused (the job completed, or a timeout): no respawn
            launch_events.announce(launch_records.JoinFailed(reason=error.reason))
        elif isinstance(error, exception.RestartAbort):  # an initialize gave up: no restart would heal it either
            launch_events.announce(launch_records.GaveUp(reason=f"{type(error).__name__}: {error}"[:500]))
        monitor = self.monitor_thread
        if monitor is not None:
            monitor.leave_function()
        try:
            # A process the discovery hook removed leaves at a boundary, after the iteration barrier: nobody waits
            # for it in that iteration any more, and the next round goes on without it (docs/elastic.md section 5).
            removed = isinstance(error, joining_module.HostRemoved)
            if self.base_store is not None and state.rank is not None and not removed:
                store = self._fault_connection.iteration_store(state.iteration)
                store.record_terminated_ranks([state.rank])
                store.record_interrupted([InterruptionRecord(state.rank, Interruption.BASE_EXCEPTION)])
                store.iteration_barrier([state.rank], state.world_size, 0)
        except Exception:  # the store may be gone; leaving must not fail because of it
            log.warning("could not register the departure of rank %s", state.rank, exc_info=True)
        if self.joining is not None:
            self.joining.leave()  # no rendezvous round waits for it
        if monitor is not None:
            monitor.shutdown(self._thread_budget())
        if self.wrapper.terminate is not None:
            self.wrapper.terminate(state.freeze())

    # ---- shutdown ---------------------------------------------------------------------------------------------

    def __enter__(self) -> CallWrapper:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        if self.shut_down:
            return
        self.shut_down = True
        fault_source.unregister_active_call(self)
        if self.mesh is not None:
            self.mesh.close()
            self.mesh = None
        if self._previous_unraisablehook is not None and sys.unraisablehook == self._unraisablehook:
            sys.unraisablehook = self._previous_unraisablehook
        w = self.wrapper
        if self.monitor_thread is not None and self.monitor_thread.is_alive():
            self.monitor_thread.leave_function()
        if self._wake_installed:  # after leave_function: the monitor thread sends no wake any more
            self._wake_installed = False
            wake.release()
        joined_later = (
            self.state.initial_rank is not None
            and self.state.initial_world_size is not None
            and self.state.initial_rank >= self.state.initial_world_size
        )
        if self.base_store is not None and self.state.initial_rank is not None and not joined_later:
            # (A process that joined later is not an initial rank: the termination barrier counts initial ranks.)
            critical = self.state.initial_rank in getattr(self.base_store, "critical_ranks", ())
            try:
                # The store host waits (bounded) until every initial rank, or someone on its behalf, is done.
                self.base_store.termination_barrier(
                    [self.state.initial_rank], self.state.initial_world_size, w.barrier_timeout if critical else 0
                )
            except Exception:
                log.warning("termination barrier incomplete on rank %s", self.state.initial_rank, exc_info=True)
        if self.watchdog is not None:
            self.watchdog.shutdown(timeout=5)
        if self.monitor_process is not None:
            self.monitor_process.shutdown()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        # Close the store connections (and, on the host, the server) now rather than at some later garbage
        # collection: the next call of a wrapped function in this process builds a new store on the same port.
        self.monitor_thread = None
        with self.verdicts.lock:
            self.base_store = self._monitor_connection = self._fault_connection = None
            self.store = self._user_connection = self._user = None
            self.joining = None  # its rendezvous holds a store connection of this call
        gc.collect()


def _assigned(value: int | None, what: str) -> int:
    """A rank of ``State`` that is set wherever the wrapper reads it here: every process has its initial rank
    from the start, and a rank from its first rank assignment or admission on (None only for a newcomer still
    waiting). Says so to the type checker, and fails loudly if it is not (as ``rank_assignment._held``)."""
    assert value is not None, f"{what} is not set"
    return value


def _run_health_check(check: Callable[[FrozenState], Any] | None, frozen: FrozenState, what: str) -> None:
    """Run a health check (if any); whatever it raises becomes a ``HealthCheckError`` naming ``what``."""
    if check is None:
        return
    try:
        check(frozen)
    except Exception as error:
        raise exception.HealthCheckError(f"{what} failed: {error!r}") from error
