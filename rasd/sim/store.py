"""The bootstrap store, modelled: one key-value server that every process of a simulated job joins through.

``rasd/net/bootstrap.py`` does six store operations per process (the secret's ``compare_set``, ``add(joined)`` for
a join index i, ``set(peer/i)``, one ``wait`` for the records of processes ``i // 2`` and ``i - 1``, and a ``get`` of
each). A real store (a TCPStore, etcd) serves its clients' operations one at a time, so a job whose processes all
start at once queues at the store. The model is that server: each operation reaches it half a round trip after it
is sent, waits for the server to be free, holds it for ``service`` seconds, and its answer comes back half a round
trip later; a ``wait`` is answered once both records are set. ``service`` and ``rtt`` come from a real store
measured by ``bench/store_rate.py``. Nothing here is random but the round trips, drawn from the simulation's
generator like every other latency.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: The bootstrap's operations per process, in order (``rasd/net/bootstrap.py``): what ``StoreModel.ops`` counts.
OPS_PER_PROCESS = 6


@dataclass
class StoreModel:
    """The store's timing and what it served: ``service`` seconds per operation, ``rtt`` for each round trip."""

    service: float
    rtt: float
    ops: int = 0  # operations served
    free_at: float = 0.0  # when the server is free for the next operation
    joined: int = 0  # the ``joined`` counter
    set_at: dict[int, float] = field(default_factory=dict)  # join index -> when its record was set
    waiting: dict[int, list[Callable[[float], None]]] = field(default_factory=dict)  # index -> blocked waits

    def serve(self, sent: float) -> float:
        """An operation sent at ``sent``: when the server has handled it (its answer leaves then)."""
        start = max(sent + self.rtt / 2, self.free_at)
        self.free_at = start + self.service
        self.ops += 1
        return self.free_at

    def record_set(self, index: int, at: float) -> None:
        self.set_at[index] = at
        for wake in self.waiting.pop(index, []):
            wake(at)
