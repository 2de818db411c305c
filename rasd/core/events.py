"""Events: what a node observes and tells its subscribers (monitor clients, ``inprocess``, logs).

The names and groups of NCCL's events are kept (docs/protocol.md §5, docs/architecture.md §7); ours are added as
new words. Verdicts are the events other code acts on: a dead, hung or departed peer, and the communicator verdicts
of ``rasd.torch``. Each names the peer and its incarnation, so a consumer can tell a stale verdict from a fresh one.
RESTART is not a verdict but what the job did about one: this process's training restarted in place
(``rasd.record_restart``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .comms import RestartRecord
from .frames import Positions
from .peers import Addr, PeerInfo


class Group(enum.IntFlag):
    LIFECYCLE = 0x01
    TRACE = 0x02
    ALL = 0xFF


class Kind(str, enum.Enum):
    # NCCL's lifecycle events
    PEER_NEW = "PEER_NEW"
    PEER_DEAD = "PEER_DEAD"
    # NCCL's trace events
    PEER_CONNECTING = "PEER_CONNECTING"
    PEER_CONNECTED = "PEER_CONNECTED"
    PEER_RECOVERED = "PEER_RECOVERED"
    PEER_UNRESPONSIVE = "PEER_UNRESPONSIVE"
    PEER_KEEPALIVE_TIMEOUT = "PEER_KEEPALIVE_TIMEOUT"
    PEER_INIT_TIMEOUT = "PEER_INIT_TIMEOUT"
    PEER_DISCONNECTED = "PEER_DISCONNECTED"
    PEER_TIMEOUT_DEAD = "PEER_TIMEOUT_DEAD"
    # torchras verdicts (lifecycle group: an NCCL client asking for lifecycle events sees them as new words)
    PEER_LEFT = "PEER_LEFT"
    PEER_HUNG = "PEER_HUNG"
    COMM_STUCK = "COMM_STUCK"
    #: Not a verdict: a communicator held by ranks behind that are working (a checkpoint, an evaluation) or in a
    #: phase their code declared; it becomes COMM_STUCK at the busy limit (or the phase's), RECOVERED when it moves.
    COMM_SLOW = "COMM_SLOW"
    COMM_RECOVERED = "COMM_RECOVERED"
    # torchras: this process's training restarted in place (inprocess.Wrapper -> rasd.record_restart). Not a
    # verdict: what the job did about one. Emitted by each process's own node (every rank restarts).
    RESTART = "RESTART"

    def __str__(self) -> str:
        return self.value


LIFECYCLE_KINDS = frozenset(
    {
        Kind.PEER_NEW,
        Kind.PEER_DEAD,
        Kind.PEER_LEFT,
        Kind.PEER_HUNG,
        Kind.COMM_STUCK,
        Kind.COMM_SLOW,
        Kind.COMM_RECOVERED,
        Kind.RESTART,
    }
)


def group_of(kind: Kind) -> Group:
    return Group.LIFECYCLE if kind in LIFECYCLE_KINDS else Group.TRACE


@dataclass(frozen=True)
class Event:
    """One observation. ``at`` is the node's clock (monotonic seconds); the runtime adds wall time for display."""

    kind: Kind
    at: float
    addr: Addr | None = None
    peer: PeerInfo | None = None
    details: str = ""
    #: Communicator verdicts: the communicator hash, the ranks involved, and the op type and sequence number.
    comm_hash: int | None = None
    ranks: tuple[int, ...] = ()
    #: RESTART: the restart as the process records it (``ranks`` are then the terminated ranks).
    restart: RestartRecord | None = None
    #: Where the processes a verdict is about were in their code (frames.py): COMM_STUCK, each rank behind and its
    #: main thread's innermost frames; PEER_HUNG, the hung process's last position this node saw (rank -1 when
    #: its rank is unknown). Empty when none was seen.
    positions: Positions = ()

    @property
    def group(self) -> Group:
        return group_of(self.kind)

    @property
    def incarnation(self) -> int | None:
        return self.peer.incarnation if self.peer else None
