"""In-process restart for distributed PyTorch, API-compatible with nvidia-resiliency-ext's ``inprocess``.

Switch by changing an import::

    import inprocess                      # instead of: from nvidia_resiliency_ext import inprocess

    @inprocess.Wrapper(store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 1})
    def train(call_wrapper: inprocess.CallWrapper): ...
"""

from . import (  # noqa: F401 - the submodules are part of the public surface, as in the reference
    abort,
    attribution,
    completion,
    compose,
    exception,
    fault_source,
    finalize,
    health_check,
    initialize,
    logs,
    monitor_process,
    monitor_thread,
    nested_restarter,
    param_utils,
    progress_watchdog,
    rank_assignment,
    sibling_monitor,
    state,
    store,
    terminate,
    utils,
    wrap,
)
from .compose import Compose
from .state import FrozenState, Mode, State
from .wrap import CallWrapper, Wrapper

__all__ = ["CallWrapper", "Compose", "FrozenState", "Mode", "State", "Wrapper"]

logs.adopt_existing()  # loggers made before (inprocess.monitor_process): their records too hold no exception
