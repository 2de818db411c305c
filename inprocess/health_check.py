"""Health checks: before every run of the function (failure restarts) and during a restart (failure: the rank leaves).

Nothing is added behind the user's back: on a machine without GPUs no NVML check runs. ``CudaHealthCheck`` is
opt-in and does nothing unless CUDA was initialised.
"""

from __future__ import annotations

import abc
import datetime
import os
import threading
from typing import Optional

from . import exception
from .bounded import run_bounded
from .state import FrozenState


class HealthCheck(abc.ABC):
    """Unhealthy is signalled by raising."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        raise NotImplementedError


class CudaHealthCheck(HealthCheck):
    """Drain the CUDA device (bounded by ``timeout``), then synchronise once more so a broken context raises."""

    def __init__(self, timeout: datetime.timedelta = datetime.timedelta(seconds=30)) -> None:
        self.timeout = timeout

    def __call__(self, state: FrozenState) -> FrozenState:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return state
        device = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
        run_bounded(lambda: torch.cuda.synchronize(device), self.timeout, "CudaHealthCheck",
                    f"CudaHealthCheck: device {device} did not synchronise")
        torch.cuda.synchronize(device)
        return state


class FaultCounterExceeded(exception.RestartError):
    pass


class FaultCounter(HealthCheck):
    """Count the iterations in which the function raised on this rank; leave once there were more than allowed."""

    def __init__(self, max_rank_faults: Optional[int] = None) -> None:
        self.max_rank_faults = max_rank_faults
        self.faults_count = 0
        self._lock = threading.Lock()

    def __call__(self, state: FrozenState) -> FrozenState:
        if state.fn_exception is None:
            return state
        with self._lock:
            self.faults_count += 1
            count = self.faults_count
        if self.max_rank_faults is not None and count > self.max_rank_faults:
            raise FaultCounterExceeded(f"{count=} > {self.max_rank_faults=}")
        return state
