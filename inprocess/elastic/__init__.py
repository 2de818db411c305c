"""Elastic training on the in-process Wrapper: Horovod-style in-memory state, torch-elastic rendezvous rules.

    state = inprocess.elastic.TorchState(model, optimizer, step=0)   # outside the wrapped function

    @inprocess.Wrapper(...)
    def train(call_wrapper: inprocess.CallWrapper):
        torch.distributed.init_process_group(...)
        state.sync()                     # after a restart: the last commit, equal on every rank
        for state.step in range(state.step, steps):
            ...
            state.commit()               # in memory, no collective

With ``inprocess.Wrapper(joining=Joining(...))``, processes started later with ``INPROCESS_JOIN=1`` join the running
job at the next rendezvous round (``joining``, ``discovery``). See docs/elastic.md.
"""

from . import discovery, joining, rendezvous, snapshot, state, sync  # noqa: F401 - part of the public surface
from .joining import HostRemoved, JoinFailed, Joining
from .state import Commit, ObjectState, State, SyncOutcome, TorchState

__all__ = [
    "Commit",
    "HostRemoved",
    "JoinFailed",
    "Joining",
    "ObjectState",
    "State",
    "SyncOutcome",
    "TorchState",
    "rendezvous",
]
