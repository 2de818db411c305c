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

from . import caches, discovery, disk, joining, rendezvous, sharded, snapshot, state, sync  # noqa: F401 - public
from .joining import HostRemoved, JoinFailed, Joining
from .sharded import ShardedState, ShardedSyncOutcome
from .state import Commit, ObjectState, State, SyncOutcome, TorchState

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
