"""rasd: the RAS node that runs inside every process of a torchras job (see rasd.api)."""

from rasd.api import (
    RasHandle,
    enabled,
    node,
    on_event,
    phase,
    record_restart,
    record_waiting,
    start,
    stop,
    subscribe,
    sync_journal,
    work_state,
)
from rasd.core.events import Event, Kind
from torchras_formats.version import __version__


def install(start_mesh: bool = True):
    """Hook torch.distributed: every process group becomes a communicator of the report, every collective is
    counted, and the first ``init_process_group`` starts this process's RAS node. Imports torch."""
    from rasd.torch import install as _install

    return _install(start_mesh=start_mesh)


__all__ = [
    "Event",
    "Kind",
    "RasHandle",
    "enabled",
    "install",
    "node",
    "on_event",
    "phase",
    "record_restart",
    "record_waiting",
    "start",
    "stop",
    "subscribe",
    "sync_journal",
    "work_state",
    "__version__",
]
