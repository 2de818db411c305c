"""Effects: what a concept of the mesh asks for, as values. ``Node`` routes each one to the room that owns what it
changes (``node.ROUTES``, the wiring diagram of the mesh).

Belongs here: the effect value types, the values they carry between rooms (``Side``, ``Purpose``) and the query ids
of the node's own gathers, and nothing else. A concept never calls another concept and never writes another's
state: it reads the world through ``view.World`` and returns a list of these (docs/architecture.md section 1, "The
rooms of the core"). The effects a driver carries out (send, connect, close, emit, probe, a finished gather) are the
actions of ``actions.py``; a concept may return those too, and the node hands them to its driver in order.

Names say what happened or what is asked, in the words of the room that takes them: ``Dead`` is a verdict for
``verdicts.py``, ``Broadcast`` a message for every ready connection, ``Relink`` a recomputation for ``links.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

from . import wire
from .actions import Action
from .events import Kind
from .peers import Addr, PeerInfo, PeerKey
from .snapshot import JobSnapshot
from .stuck import StuckVerdict

#: The query id of the stuck sweeper's gathers (client queries have positive ids).
SWEEP_QUERY = -1
#: The query id of reachability gathers (suspicion.py, reunion.py).
REACH_QUERY = -2


class Side(NamedTuple):
    """One side of a partition as one of its members measured it (reunion.py)."""

    live: int  # processes that answered its reachability gather, the member included; 0: not measured
    lowest: Addr  # the lowest address among them

    def beats(self, other: Side) -> bool:
        """More members wins; equal counts: the lower lowest address wins."""
        if self.live != other.live:
            return self.live > other.live
        return self.lowest.sort_key() < other.lowest.sort_key()


class Purpose(enum.Enum):
    """Why a connection is dialled: who is told its id once it is opened."""

    LINK = "link"  # a contact's connection (links.py)
    PROBE = "probe"  # a reunion probe to a process we hold dead (reunion.py)
    INTRODUCE = "introduce"  # a bootstrap seed that does not know us yet: no contact waits on it


# --- connections (node.py carries them out) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Say:
    """Send one message on a connection."""

    conn_id: int
    msg: wire.Message


@dataclass(frozen=True, slots=True)
class SayFrame:
    """Send a frame already encoded on a connection (one frame to many connections is encoded once)."""

    conn_id: int
    frame: bytes


@dataclass(frozen=True, slots=True)
class Broadcast:
    """Send a message on every ready connection but ``except_conn``, as they stand when the node gets to it."""

    msg: wire.Message
    except_conn: int | None


@dataclass(frozen=True, slots=True)
class Dial:
    """Open an outgoing connection to ``addr``; the room of ``purpose`` is told its id."""

    addr: Addr
    purpose: Purpose


@dataclass(frozen=True, slots=True)
class Drop:
    """Close a connection. ``replaced``: another connection to that peer takes over its contact."""

    conn_id: int
    replaced: bool = False


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The connection passed the challenge-response: it may carry whole frames now."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class Incarnation:
    """The connection reaches this incarnation of its peer (a CONNINITACK named it)."""

    conn_id: int
    incarnation: int | None


@dataclass(frozen=True, slots=True)
class Ready:
    """The handshake is over: the connection is a link to ``peer``'s ``incarnation``."""

    conn_id: int
    peer: Addr
    incarnation: int | None


@dataclass(frozen=True, slots=True)
class Confirm:
    """The connector's handshake goes on once the acceptor's entry is merged (handshake.py, ``confirm``)."""

    conn_id: int


# --- the node ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Notify:
    """An event about the process at ``about`` (an address: whoever holds it when the node gets to it; a key: that
    incarnation's entry), built by the node when it gets to it, so that it names the entry a merge just made."""

    kind: Kind
    about: Addr | PeerKey | None
    details: str = ""


@dataclass(frozen=True, slots=True)
class Expel:
    """The job holds this process gone: it stops taking part."""

    why: str = "this process was declared dead by the job"


# --- verdicts.py ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dead:
    """That process is dead (``why``: the event's details; ``flood``: tell the job)."""

    key: PeerKey
    why: str | None = None
    flood: bool = True


@dataclass(frozen=True, slots=True)
class Left:
    """That process left the job cleanly."""

    key: PeerKey


@dataclass(frozen=True, slots=True)
class Retire:
    """Newer incarnations arrived at these addresses: the older ones there are gone."""

    addrs: frozenset[Addr]


@dataclass(frozen=True, slots=True)
class Hung:
    """A HUNG verdict about that process, ours or flooded to us."""

    key: PeerKey
    why: str


@dataclass(frozen=True, slots=True)
class HungEnded:
    """We heard that process ourselves: a HUNG verdict about it ends here (links.py says so, once)."""

    key: PeerKey


@dataclass(frozen=True, slots=True)
class Recovered:
    """A RECOVERED flood about that process."""

    key: PeerKey


@dataclass(frozen=True, slots=True)
class ProbeLocal:
    """Ask the driver whether the process at ``addr`` still exists, if it is on this host."""

    addr: Addr


@dataclass(frozen=True, slots=True)
class Refused:
    """A reconnect to that process was refused (``lost_connection``: after an established connection was lost)."""

    key: PeerKey
    lost_connection: bool


# --- floods.py --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Originate:
    """Flood a new process verdict from this node."""

    kind: wire.FloodKind
    subject: PeerKey
    stamp: float = 0.0


@dataclass(frozen=True, slots=True)
class OriginateComm:
    """Flood a new communicator verdict (or its clear) from this node."""

    verdict: StuckVerdict
    stuck: bool


# --- gossip.py --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Merge:
    """Entries for the table. If any is new: PEER_NEW for each, the incarnations they replace retired, then (``spread``)
    a diff to every ready connection but ``except_conn`` and (``relink``) the links recomputed."""

    peers: tuple[PeerInfo, ...]
    spread: bool = False
    except_conn: int | None = None
    relink: bool = False


@dataclass(frozen=True, slots=True)
class SendTable:
    """Send our whole table and our dead and departed lists on a connection."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class Sync:
    """The peer on that connection holds these hashes: our whole table if they differ from ours."""

    conn_id: int
    peers_hash: int
    dead_hash: int


# --- links.py ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Relink:
    """Recompute the link set from the table and the contacts' health."""


@dataclass(frozen=True, slots=True)
class ClimbOn:
    """Go on with the liveness climb of this tick after the contact it stopped at (links.py, ``climb``)."""


@dataclass(frozen=True, slots=True)
class Forget:
    """No link to that process any more (it is dead or departed)."""

    key: PeerKey


@dataclass(frozen=True, slots=True)
class Attach:
    """The connection became READY: its contact, if any, uses it."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class Vouch:
    """Another node heard that process at ``stamp`` on its own clock."""

    key: PeerKey
    stamp: float


@dataclass(frozen=True, slots=True)
class Answered:
    """That process answered a reachability gather of ours: it is alive now."""

    key: PeerKey


@dataclass(frozen=True, slots=True)
class LastCall:
    """Flood our HUNG verdict about that linked process once more (its silence death waits CONFIRM after it)."""

    key: PeerKey


@dataclass(frozen=True, slots=True)
class Silent:
    """Our ladder's DEAD rung about that linked process: silent past the dead limit, our HUNG unrefuted."""

    key: PeerKey


# --- gather.py --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartGather:
    """A gather rooted here (``timeout``: None for the default, ``inf`` for none), of the status unless it asks
    for something else (``ask``)."""

    query_id: int
    timeout: float | None = None
    ask: wire.Ask = wire.Ask.STATUS


@dataclass(frozen=True, slots=True)
class Purge:
    """That connection went silent: every gather waiting on it counts a leg timeout."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class GatherFinished:
    """A gather rooted here ended: the node hands the snapshot to whoever asked (by ``query_id``)."""

    query_id: int
    snapshot: JobSnapshot


# --- sweeper.py -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HoldStuck:
    """A COMM_STUCK verdict, ours or flooded to us: held, and confirmed now."""

    verdict: StuckVerdict


@dataclass(frozen=True, slots=True)
class ReleaseStuck:
    """The verdict about that communicator ends."""

    comm_hash: int
    why: str


# --- suspicion.py -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Suspect:
    """A SUSPECT flood about ``subject``, as received on a connection."""

    conn_id: int
    msg: wire.Flood
    subject: PeerKey


@dataclass(frozen=True, slots=True)
class Heard:
    """A HEARD flood: somebody heard that process within the dead limit."""

    subject: PeerKey


@dataclass(frozen=True, slots=True)
class Decide:
    """Decide the pending deaths and suspicions again, now that the last death we declared has been carried out."""


@dataclass(frozen=True, slots=True)
class Measure:
    """A reachability gather, to measure our side of a partition."""


# --- reunion.py -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Measured:
    """A reachability gather ended: what it reached is our side (``complete``: no leg timed out)."""

    side: Side
    complete: bool


@dataclass(frozen=True, slots=True)
class Judge:
    """A connection from a process we hold gone (or older than the one at its address): answer it."""

    conn_id: int
    key: PeerKey
    msg: wire.ConnInit


@dataclass(frozen=True, slots=True)
class SendConnInit:
    """Our CONNINIT on that connection (with our measured side on a probe)."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class ProbeAnswered:
    """A probe of ours was answered with a ruling (not MEASURE)."""


@dataclass(frozen=True, slots=True)
class ProbeMet:
    """A probe met a process the job holds alive: an ordinary connection now."""

    conn_id: int


@dataclass(frozen=True, slots=True)
class MeasureAgain:
    """A probe was answered MEASURE: gather, then probe that process again."""

    addr: Addr


@dataclass(frozen=True, slots=True)
class Outnumbered:
    """Our side met a larger one, which holds ``winner`` alive and us dead: tell our side, then leave."""

    winner: PeerKey


@dataclass(frozen=True, slots=True)
class Outvoted:
    """An OUTVOTED flood, as received on a connection."""

    conn_id: int
    msg: wire.Flood
    winner: PeerKey


Effect = (
    Say
    | SayFrame
    | Broadcast
    | Dial
    | Drop
    | Authenticated
    | Incarnation
    | Ready
    | Confirm
    | Notify
    | Expel
    | Dead
    | Left
    | Retire
    | Hung
    | HungEnded
    | Recovered
    | ProbeLocal
    | Refused
    | Originate
    | OriginateComm
    | Merge
    | SendTable
    | Sync
    | Relink
    | ClimbOn
    | Forget
    | Attach
    | Vouch
    | Answered
    | LastCall
    | Silent
    | StartGather
    | Purge
    | GatherFinished
    | HoldStuck
    | ReleaseStuck
    | Suspect
    | Heard
    | Decide
    | Measure
    | Measured
    | Judge
    | SendConnInit
    | ProbeAnswered
    | ProbeMet
    | MeasureAgain
    | Outnumbered
    | Outvoted
)

#: What a concept's input returns: effects for other rooms, and actions for the driver (``actions.py``), in order.
Effects = list[Effect | Action]
