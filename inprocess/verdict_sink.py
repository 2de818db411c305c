"""Where external verdicts land in one call of the wrapped function: the rasd mesh's (``inprocess.mesh_source``)
and the user's own (``inprocess.fault_source.report_fault``).

Belongs here: turning a verdict about initial ranks (or the ranks of an iteration) into the records the Wrapper's
restart reads, in the iteration it is about: the terminated ranks, an ``EXTERNAL`` interruption with the verdict's
reason (once per verdict, whoever reports it first), and, for a verdict that terminates ranks, the iteration and
termination barriers registered on their behalf (a dead process registers nothing itself). A verdict for an
iteration that is over, or has not started here, is ignored with a line that says so; a refreshed verdict about
ranks already terminated changes nothing. A dead process also leaves the joining rendezvous
(``leave_rendezvous``). The call owns the connection the sink writes on; ``lock`` keeps the call from closing it
while a verdict is being applied (``CallWrapper.shutdown``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from . import fault_source, logs
from .attribution import Interruption, InterruptionRecord
from .elastic import joining as joining_module
from .state import State

log = logs.get_logger(__name__)


class Call(Protocol):
    """What the sink reads of the call it serves (``CallWrapper``)."""

    state: State
    joining: joining_module.JoinDriver | None
    shut_down: bool

    @property
    def fault_connection(self) -> Any: ...


class VerdictSink:
    def __init__(self, call: Call) -> None:
        self.call = call
        #: Held while a verdict is applied, and by the call while it closes its connections.
        self.lock = threading.Lock()

    def report_fault(self, verdict: fault_source.ExternalVerdict) -> bool:
        """Apply an external verdict to this job (see ``inprocess.fault_source``); False if it was ignored."""
        with self.lock:
            connection = self.call.fault_connection
            if self.call.shut_down or connection is None:
                return False
            state = self.call.state
            current = state.iteration
            kind = fault_source.VerdictKind(verdict.kind)
            if verdict.iteration == fault_source.LATEST_ITERATION:
                target = self._newest_iteration_of(connection, verdict.ranks, current)
                if target is None:
                    log.info("ignoring a verdict about ranks outside the current iteration: %s", verdict)
                    return False
            elif verdict.iteration < current:
                log.info("ignoring a stale verdict for iteration %s (now %s): %s", verdict.iteration, current, verdict)
                return False
            elif verdict.iteration > current:
                log.warning(
                    "ignoring a verdict for iteration %s, which has not started here (now %s): %s",
                    verdict.iteration,
                    current,
                    verdict,
                )
                return False
            else:
                target = verdict.iteration
            store = connection.iteration_store(target)
            ranks = self._translate(store, verdict, target, state)
            if not ranks:
                return False
            if (
                kind.terminates
                and verdict.iteration == fault_source.LATEST_ITERATION
                and set(ranks.values()) <= store.get_terminated_ranks()
            ):
                log.debug("verdict about ranks already terminated in iteration %s: %s", target, verdict)
                return False  # a refreshed verdict (HUNG) or another survivor's report: done already
            world = store.get_packed("world_size", ",")
            world_size = int(world[-1]) if world else state.world_size
            if kind.terminates:
                store.record_terminated_ranks(sorted(ranks.values()))
            first_report = int(store.add(f"external_verdict:{kind.value}:{sorted(ranks)}", 1)) == 1
            records = [InterruptionRecord(rank, Interruption.EXTERNAL) for rank in sorted(ranks.values())]
            reason = (verdict.reason or f"{kind.value} of ranks {sorted(ranks)}") if first_report else None
            store.record_interrupted(records if first_report else (), reason=reason)
            if kind.terminates:
                store.iteration_barrier(sorted(ranks.values()), world_size, 0)
                initial_world_size = int(state.initial_world_size or 0)
                initial = [rank for rank in sorted(ranks) if rank < initial_world_size]  # not the ranks that joined
                connection.termination_barrier(initial, initial_world_size, 0)
            log.warning(
                "external verdict %s %s applied to iteration %s: %s", kind.value, sorted(ranks), target, verdict.reason
            )
            return True

    def leave_rendezvous(self, initial_rank: int, store: Any) -> None:
        """A mesh PEER_DEAD verdict: the dead process leaves the rendezvous (``store``: the caller's connection)."""
        joining = self.call.joining
        if joining is None:
            return
        rendezvous_store = joining_module.StoreRendezvous(store, joining.rendezvous.settings)
        rendezvous_store.apply(joining_module.rendezvous.Leave(joining_module.node_id(initial_rank), time.time()))

    @staticmethod
    def _newest_iteration_of(connection: Any, initial_ranks: frozenset[int], current: int) -> int | None:
        """The newest iteration (the current one or the next, which faster ranks may have entered) in which one
        of ``initial_ranks`` has published its rank."""
        for iteration in (current + 1, current):
            store = connection.iteration_store(iteration)
            if any(store.get_rank_of_initial(rank, timeout=0) is not None for rank in initial_ranks):
                return iteration
        return None

    @staticmethod
    def _translate(store: Any, verdict: fault_source.ExternalVerdict, iteration: int, state: State) -> dict[int, int]:
        """Initial rank -> rank in ``iteration`` for every rank the verdict names (initial or iteration ranks)."""
        ranks: dict[int, int] = {}
        for initial_rank in sorted(verdict.ranks):
            rank = store.get_rank_of_initial(initial_rank, timeout=0)
            if rank is None:
                log.warning("verdict %s: initial rank %s is not part of iteration %s", verdict, initial_rank, iteration)
                continue
            ranks[initial_rank] = rank
        for rank in sorted(verdict.iteration_ranks):
            key = f"initial_rank_{rank}"
            if store.check([key]):
                ranks[int(store.get(key))] = rank
        if not ranks and not fault_source.VerdictKind(verdict.kind).terminates and not verdict.ranks:
            # A communicator verdict naming nobody: the reporter (unless it is a newcomer without a rank yet).
            reporter, reporter_initial = state.rank, state.initial_rank
            if reporter is not None and reporter_initial is not None:
                ranks[reporter_initial] = reporter
        return ranks
