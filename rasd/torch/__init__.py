"""rasd.torch: the only part of rasd that imports torch.

``rasd.install()`` (or ``torchrun ... -m rasd.run train.py``) hooks ``torch.distributed`` so that every process
group is a registered communicator with counted collectives, and starts the RAS node from the first process
group's store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rasd.core.registry import CommRegistry
from rasd.services import journal

if TYPE_CHECKING:  # importing torch costs seconds: only install() does it
    from .hooks import TorchHooks

# The hooks of this process (one RAS node per process, one set of hooks feeding it).
_hooks: TorchHooks | None = None


def install(start_mesh: bool = True) -> TorchHooks:
    """Hook torch.distributed (idempotent). Call before ``init_process_group``; called after it, the default group
    is adopted (groups created before the call are not counted). ``start_mesh=False`` counts without starting the
    RAS node."""
    global _hooks
    from .hooks import TorchHooks

    if _hooks is None:
        _hooks = TorchHooks(CommRegistry(), start_mesh=start_mesh)
        _hooks.install()
        journal.read_flight_recorder(flight_recorder)
    return _hooks


def uninstall() -> None:
    """Put torch.distributed's own functions back (the RAS node, if started, keeps running)."""
    global _hooks
    if _hooks is not None:
        _hooks.uninstall()
        _hooks = None


def installed() -> TorchHooks | None:
    """The hooks installed in this process (their ``registry`` holds the communicators and counters), or None."""
    return _hooks


def flight_recorder() -> journal.FlightRecorder | None:
    """The Flight Recorder of the hooks installed now, for the verdict journal (``rasd.services.journal``, which
    ``install`` hands this to): its dump and each communicator's group names; None when no hooks are installed or
    the Flight Recorder is off. RAS thread (the records' groups are the RAS thread's)."""
    records = _hooks.records if _hooks is not None else None
    if records is None or not records.flight_recorder:
        return None
    names: dict[int, list[str]] = {}
    for group in list(records.groups.values()):
        names.setdefault(group.comm.comm_hash, []).append(str(group.name))
    return records.dump_every, {comm_hash: tuple(group_names) for comm_hash, group_names in names.items()}


__all__ = ["flight_recorder", "install", "installed", "uninstall"]
