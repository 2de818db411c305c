"""The Wrapper's settings, checked as nvidia-resiliency-ext checks them (types, the timeout ladder, absolute paths),
converted (timeouts to seconds) and set on the ``Wrapper``. Bad settings raise ``TypeError``/``ValueError`` with the
reference's messages (``Condition "soft_timeout < hard_timeout < barrier_timeout" failed. Variables: ...``)."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed

from . import param_utils, repeated_faults as repeated_faults_module, store as store_module
from .abort import Abort
from .completion import Completion
from .elastic import joining as joining_module
from .finalize import Finalize
from .health_check import HealthCheck
from .initialize import Initialize
from .rank_assignment import RankAssignment
from .terminate import Terminate

#: The timeout ladder's other conditions, (shorter, longer), after ``soft < hard < barrier``: the reference's.
_TIMEOUT_LADDER = (
    ("monitor_process_interval", "barrier_timeout"),
    ("heartbeat_timeout", "barrier_timeout"),
    ("heartbeat_interval", "heartbeat_timeout"),
    ("monitor_process_interval", "heartbeat_timeout"),
    ("monitor_process_interval", "soft_timeout"),
    ("monitor_thread_interval", "soft_timeout"),
    ("progress_watchdog_interval", "soft_timeout"),
)

_NAMES = (
    "store_factory",
    "store_kwargs",
    "initialize",
    "abort",
    "finalize",
    "health_check",
    "rank_assignment",
    "monitor_thread_interval",
    "monitor_process_interval",
    "heartbeat_interval",
    "progress_watchdog_interval",
    "soft_timeout",
    "hard_timeout",
    "heartbeat_timeout",
    "barrier_timeout",
    "completion_timeout",
    "last_call_wait",
    "termination_grace_time",
    "monitor_process_logfile",
    "monitor_process_pidfile",
    "enabled",
    "completion",
    "terminate",
    "joining",
    "repeated_faults",
)


class Settings:
    """What ``apply`` sets: the ``Wrapper``'s settings as its attributes (timeouts and intervals in seconds)."""

    store_factory: type
    store_kwargs: dict[str, Any]
    initialize: Initialize | None
    abort: Abort | None
    finalize: Finalize | None
    health_check: HealthCheck | None
    rank_assignment: RankAssignment
    monitor_thread_interval: float
    monitor_process_interval: float
    heartbeat_interval: float
    progress_watchdog_interval: float
    soft_timeout: float
    hard_timeout: float
    heartbeat_timeout: float
    barrier_timeout: float
    completion_timeout: float
    last_call_wait: float
    termination_grace_time: float
    monitor_process_logfile: str | None
    monitor_process_pidfile: str | None
    enabled: bool
    completion: Completion | None
    terminate: Terminate | None
    joining: joining_module.Joining | None
    repeated_faults: repeated_faults_module.RepeatedFaults | None


def apply(wrapper: Settings, given: dict[str, Any]) -> None:
    """Check ``given`` (the ``Wrapper``'s keyword arguments) and set them on ``wrapper``."""
    (
        store_factory,
        store_kwargs,
        initialize,
        abort,
        finalize,
        health_check,
        rank_assignment,
        monitor_thread_interval,
        monitor_process_interval,
        heartbeat_interval,
        progress_watchdog_interval,
        soft_timeout,
        hard_timeout,
        heartbeat_timeout,
        barrier_timeout,
        completion_timeout,
        last_call_wait,
        termination_grace_time,
        monitor_process_logfile,
        monitor_process_pidfile,
        enabled,
        completion,
        terminate,
        joining,
        repeated_faults,
    ) = (given[name] for name in _NAMES)
    param_utils.enforce_subclass("store_factory", store_factory, store_module.StoreMixin)
    param_utils.enforce_type("store_kwargs", store_kwargs, (dict, type(None)))
    for name, value, kind in (
        ("initialize", initialize, Initialize),
        ("abort", abort, Abort),
        ("finalize", finalize, Finalize),
        ("health_check", health_check, HealthCheck),
        ("completion", completion, Completion),
        ("terminate", terminate, Terminate),
    ):
        param_utils.enforce_type(name, value, (kind, type(None)))
    param_utils.enforce_type("rank_assignment", rank_assignment, (RankAssignment,))
    param_utils.enforce_type("joining", joining, (joining_module.Joining, type(None)))
    param_utils.enforce_type("enabled", enabled, (bool,))
    seconds = param_utils.as_seconds
    wrapper.monitor_thread_interval = seconds("monitor_thread_interval", monitor_thread_interval)
    wrapper.monitor_process_interval = seconds("monitor_process_interval", monitor_process_interval)
    wrapper.heartbeat_interval = seconds("heartbeat_interval", heartbeat_interval)
    wrapper.progress_watchdog_interval = seconds("progress_watchdog_interval", progress_watchdog_interval)
    wrapper.soft_timeout = seconds("soft_timeout", soft_timeout)
    wrapper.hard_timeout = seconds("hard_timeout", hard_timeout)
    wrapper.heartbeat_timeout = seconds("heartbeat_timeout", heartbeat_timeout)
    wrapper.barrier_timeout = seconds("barrier_timeout", barrier_timeout)
    wrapper.completion_timeout = seconds("completion_timeout", completion_timeout)
    wrapper.last_call_wait = seconds("last_call_wait", last_call_wait)
    wrapper.termination_grace_time = seconds("termination_grace_time", termination_grace_time)

    check = param_utils.check_condition
    soft, hard, barrier = wrapper.soft_timeout, wrapper.hard_timeout, wrapper.barrier_timeout
    check(
        soft < hard < barrier,
        "soft_timeout < hard_timeout < barrier_timeout",
        soft_timeout=soft_timeout,
        hard_timeout=hard_timeout,
        barrier_timeout=barrier_timeout,
    )
    for shorter, longer in _TIMEOUT_LADDER:
        check(
            getattr(wrapper, shorter) < getattr(wrapper, longer),
            f"{shorter} < {longer}",
            **{shorter: given[shorter], longer: given[longer]},
        )
    for name, duration in (
        ("last_call_wait", wrapper.last_call_wait),
        ("termination_grace_time", wrapper.termination_grace_time),
        ("completion_timeout", wrapper.completion_timeout),
    ):
        check(duration >= 0, f"{name} >= 0", **{name: duration})
    for name, path in (
        ("monitor_process_logfile", monitor_process_logfile),
        ("monitor_process_pidfile", monitor_process_pidfile),
    ):
        param_utils.enforce_type(name, path, (str, type(None)))
        check(path is None or os.path.isabs(path), f"{name} is None or os.path.isabs({name})", **{name: path})
    check(torch.distributed.is_available(), "torch.distributed.is_available()")

    wrapper.store_factory = store_factory
    wrapper.store_kwargs = dict(store_kwargs or {})
    wrapper.initialize = initialize
    wrapper.abort = abort
    wrapper.finalize = finalize
    wrapper.health_check = health_check
    wrapper.rank_assignment = rank_assignment
    wrapper.monitor_process_logfile = monitor_process_logfile
    wrapper.monitor_process_pidfile = monitor_process_pidfile
    wrapper.enabled = enabled
    wrapper.completion = completion
    wrapper.terminate = terminate
    #: Processes may join the running job (docs/elastic.md section 5); None: the world only shrinks. Without
    #: ``joining=``, a launcher that respawns dead workers (``rasd launch``) turns it on (``INPROCESS_JOINING``).
    wrapper.joining = joining if joining is not None else joining_module.Joining.from_environment()
    #: Give up on a fault that every restart meets again (inprocess.repeated_faults); None: restart for ever.
    wrapper.repeated_faults = repeated_faults_module.resolve(repeated_faults)
