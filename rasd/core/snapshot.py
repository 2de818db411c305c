"""The input of a status report: what the root of a gather knows when the gather ends.

``rasd.report`` turns a ``JobSnapshot`` into the report model and renders it; the gather in ``rasd.core`` produces
it. Keeping it a plain value makes the report a pure function, tested without a mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .comms import ProcessData
from .peers import Addr, PeerInfo


@dataclass(frozen=True)
class JobSnapshot:
    #: The whole peer table of the root, sorted by address, dead and departed peers included: one entry per address.
    peers: tuple[PeerInfo, ...]
    #: Peers known dead (permanent) and peers that left cleanly (a finished process is not a fault), by address:
    #: about the entry of ``peers`` at that address, the newest process known there.
    dead: frozenset[Addr] = frozenset()
    left: frozenset[Addr] = frozenset()
    #: Older processes at addresses a newer one holds now (a restarted process that got its predecessor's port
    #: back): each is dead, or departed if it left cleanly. They are not in ``peers`` (docs/architecture.md 2.6).
    former_dead: tuple[PeerInfo, ...] = ()
    former_left: tuple[PeerInfo, ...] = ()
    #: What each responding process contributed, by address. The root itself is always among them.
    responses: dict[Addr, ProcessData] = field(default_factory=dict)
    #: Legs of the gather that went quiet or were cut (NCCL's nLegTimeouts).
    timeouts: int = 0
    #: Seconds from the start of the gather to its end.
    collection_time: float = 0.0
    #: Launch counts that differ only because the leading ranks are inside an operation that started less than
    #: this many seconds ago are operations in flight, not a MISMATCH. 0: any difference is one (NCCL's rule).
    in_flight_grace: float = 0.0
    #: Standing COMM_STUCK verdicts the root holds: communicator hash -> what is stuck and who is to blame.
    stuck: dict[int, str] = field(default_factory=dict)

    def missing(self) -> list[PeerInfo]:
        """Live peers that did not answer (NCCL's missing = peers - dead - responders; departed peers excluded)."""
        return [p for p in self.peers
                if p.addr not in self.dead and p.addr not in self.left and p.addr not in self.responses]
