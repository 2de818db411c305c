"""Health checks: before every run of the function (failure restarts) and during a restart (failure: the rank leaves).

As in the reference, the restart health check is the user's check plus, when ``LOCAL_RANK`` is set, the GPU,
NVLink and NIC checks (``restart_health_check``). They pass harmlessly where there is nothing to check: no NVML
(``pynvml`` not installed, or no driver), no GPU at that index, no InfiniBand device; so a CPU machine restarts
exactly as without them (the reference turns every restart there into ``HealthCheckError``).
``CudaHealthCheck`` is opt-in and does nothing unless CUDA was initialised.
"""

from __future__ import annotations

import abc
import datetime
import glob
import os
import threading
from typing import Any

from . import exception, logs
from .bounded import run_bounded
from .compose import Compose
from .state import FrozenState

log = logs.get_logger(__name__)


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
        run_bounded(
            lambda: torch.cuda.synchronize(device),
            self.timeout,
            "CudaHealthCheck",
            f"CudaHealthCheck: device {device} did not synchronise",
        )
        torch.cuda.synchronize(device)
        return state


class FaultCounterExceeded(exception.RestartError):
    pass


class FaultCounter(HealthCheck):
    """Count the iterations in which the function raised on this rank; leave once there were more than allowed."""

    def __init__(self, max_rank_faults: int | None = None) -> None:
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


# ---- NVML and NIC checks, chained into the restart health check when LOCAL_RANK is set ------------------------


def _nvml() -> Any | None:
    """``pynvml``, initialised; None where NVML cannot be used (not installed, no driver): nothing to check."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception as error:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, ...: no NVML here
        log.debug("NVML is not available (%r); GPU and NVLink health checks pass", error)
        return None


def _device_handle(nvml: Any, device_index: int | None) -> Any | None:
    try:
        index = device_index if device_index is not None else 0
        if index >= nvml.nvmlDeviceGetCount():
            return None
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # NVMLError of any kind: no device to check
        log.debug("no NVML device %s", device_index, exc_info=True)
        return None


class ChainedGPUHealthCheck(HealthCheck):
    """The GPU at ``device_index`` asks for no recovery action (NVML's GPU recovery action field).

    A GPU that needs a reset, a reboot or a drain raises ``HealthCheckError``; no NVML or no such GPU passes.
    """

    def __init__(self, device_index: int | None = None) -> None:
        self.device_index = device_index

    def __call__(self, state: FrozenState) -> FrozenState:
        nvml = _nvml()
        if nvml is None:
            return state
        try:
            handle = _device_handle(nvml, self.device_index)
            field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
            if handle is None or field is None:
                return state
            (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field])
            if getattr(value, "nvmlReturn", 0) != 0:
                return state  # the driver does not know the field: nothing to check
            action = int(value.value.uiVal)
        finally:
            nvml.nvmlShutdown()
        if action != 0:  # NVML_GPU_RECOVERY_ACTION_NONE
            raise exception.HealthCheckError(f"GPU {self.device_index} health check failed: recovery action {action}")
        return state


class ChainedNVLHealthCheck(HealthCheck):
    """Logs NVLink links of the GPU at ``device_index`` that are down; like the reference, never fails a rank."""

    def __init__(self, device_index: int | None = None) -> None:
        self.device_index = device_index

    def __call__(self, state: FrozenState) -> FrozenState:
        nvml = _nvml()
        if nvml is None:
            return state
        try:
            handle = _device_handle(nvml, self.device_index)
            links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 0)
            down = []
            for link in range(links if handle is not None else 0):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                        down.append(link)
                except Exception:  # noqa: BLE001 - a link that does not exist on this GPU
                    continue
            if down:
                log.warning("GPU %s: NVLink links down: %s (ignored, as in the reference)", self.device_index, down)
        finally:
            nvml.nvmlShutdown()
        return state


_INFINIBAND = "/sys/class/infiniband"


def _link_downed_counters(device_index: int | None) -> dict[str, int]:
    """``link_downed`` counter of every port of the InfiniBand device for ``device_index`` (all if None)."""
    devices = sorted(glob.glob(os.path.join(_INFINIBAND, "*")))
    if device_index is not None and device_index < len(devices):
        devices = [devices[device_index]]
    counters = {}
    for device in devices:
        for path in glob.glob(os.path.join(device, "ports", "*", "counters", "link_downed")):
            try:
                with open(path) as counter:
                    counters[path] = int(counter.read().strip() or 0)
            except (OSError, ValueError):
                continue
    return counters


class ChainedNicHealthCheck(HealthCheck):
    """The InfiniBand NIC of ``device_index`` lost no link since this check was built (sysfs ``link_downed``).

    A counter that grew raises ``HealthCheckError``; a machine without InfiniBand has nothing to check.
    """

    def __init__(self, device_index: int | None = None) -> None:
        self.device_index = device_index
        self.baseline = _link_downed_counters(device_index)

    def __call__(self, state: FrozenState) -> FrozenState:
        current = _link_downed_counters(self.device_index)
        grown = sorted(path for path, value in current.items() if value > self.baseline.get(path, value))
        self.baseline.update(current)
        if grown:
            raise exception.HealthCheckError(f"NIC health check failed - link down detected: {grown}")
        return state


def restart_health_check(
    health_check: HealthCheck | None,
    gpu_check: type = ChainedGPUHealthCheck,
    nvl_check: type = ChainedNVLHealthCheck,
    nic_check: type = ChainedNicHealthCheck,
) -> Compose | None:
    """The check run during a restart, composed as the reference does.

    The user's check (the members of a ``Compose``, flattened) and, when ``LOCAL_RANK`` is an integer, the GPU,
    NVLink and NIC checks of that device, in one ``Compose`` (so they run NIC, NVLink, GPU, then the user's
    checks last to first); None when there is nothing to run. ``Wrapper`` passes the three check classes from its
    own module's namespace, where the reference's tests patch them (``inprocess.wrap.ChainedGPUHealthCheck``).
    """
    checks: list[Any] = []
    if health_check is not None:
        checks.extend(getattr(health_check, "instances", [health_check]))
    try:
        local_rank: int | None = int(os.environ["LOCAL_RANK"])
    except (KeyError, ValueError):
        local_rank = None
    if local_rank is not None:
        checks += [
            gpu_check(device_index=local_rank),
            nvl_check(device_index=local_rank),
            nic_check(device_index=local_rank),
        ]
    return Compose(*checks) if checks else None
