"""Elastic training on the in-process Wrapper: Horovod-style in-memory state, torch-elastic rendezvous rules.

    state = inprocess.elastic.TorchState(model, optimizer, step=0)   # outside the wrapped function

    @inprocess.Wrapper(...)
    def train(call_wrapper: inprocess.CallWrapper):
        torch.distributed.init_process_group(...)
        state.sync()                     # after a restart: the last commit, equal on every rank
        for state.step in range(state.step, steps):
            ...
            state.commit()               # in memory, no collective

FSDP2, tensor parallelism, DTensor: ``ShardedState(build, step=0)`` (``sharded``) rebuilds the model and optimizer
each iteration and keeps the state sharded in memory with redundancy, resharded at every restore.

With ``inprocess.Wrapper(joining=Joining(...))``, processes started later with ``INPROCESS_JOIN=1`` join the running
job at the next rendezvous round (``joining``, ``discovery``). See docs/elastic.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import caches, discovery, joining, rendezvous, snapshot, state, sync  # noqa: F401 - public
from .joining import HostRemoved, JoinFailed, Joining
from .state import Commit, ObjectState, State, SyncOutcome, TorchState

if TYPE_CHECKING:
    from . import disk, sharded  # noqa: F401 - public
    from .sharded import ShardedState, ShardedSyncOutcome

#: Imported on first use: ``torch.distributed.checkpoint`` brings DTensor and sympy with it, about a second of CPU
#: in every process that imports ``inprocess`` (each rank, at each start), which only a job with sharded state uses.
_LAZY = {"sharded": "sharded", "disk": "disk", "ShardedState": "sharded", "ShardedSyncOutcome": "sharded"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f"{__name__}.{module}")
    return loaded if name == module else getattr(loaded, name)


__all__ = [
    "Commit",
    "HostRemoved",
    "JoinFailed",
    "Joining",
    "ObjectState",
    "State",
    "ShardedState",
    "ShardedSyncOutcome",
    "SyncOutcome",
    "TorchState",
    "rendezvous",
]
