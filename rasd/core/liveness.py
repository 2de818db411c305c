"""The liveness ladder: how long a linked peer may stay silent before each verdict, as one table.

Belongs here: the ``Contact`` (what a node knows of a peer it keeps a link to: when it last heard it, its
connection, whether it is delayed or hung), the ladder (``LADDER``) and ``step``, the pure function that says which
rungs a contact has reached. ``links.py`` applies the rungs (events, floods, resets); the timers themselves are in
``config.Timers`` (docs/architecture.md section 2.5).

Theory of operation: silence is measured from the last bytes heard from the peer, on any connection to it, a
whole message or part of one (NCCL's ``lastRecvTime``; ``Node.received``). A keepalive goes out on every used
connection idle for a keepalive interval, so a live peer is never silent for long. Each tick the node observes
every contact once and climbs the ladder::

    rung              reached when                                       what the node does (links.py)
    UNRESPONSIVE      ready link silent > unresponsive, not yet delayed  PEER_UNRESPONSIVE; fallback links around it
    CONNECT_TIMEOUT   no connection for > connect_warn, heard before     PEER_UNRESPONSIVE (connect timeout); same
    UNREACHED         no connection for > connect_warn, never heard      no event (not a fault we know of); fallback
                                                                         links around it, as for the two above
    HUNG              unvouched > hang, heard before (or unvouched       PEER_HUNG verdict, flooded
                      > dead); re-flagged every HUNG_REFRESH hang limits
    DEAD              unvouched > dead, and our HUNG verdict has stood   pending: our HUNG flooded once more (its last
                      unrefuted for CONFIRM unresponsive limits          call) and a gather; suspicion.py declares it
                                                                         (PEER_TIMEOUT_DEAD, PEER_DEAD, flooded); stop
    RESET             ready link silent > reset                          PEER_KEEPALIVE_TIMEOUT; socket reset, retried

*Unvouched* is the silence the verdicts read: since we last heard the peer, or since another node vouched for it
(a RECOVERED flood: somebody heard it). A silence verdict is one node's view; before it is final the job gets a
say. The HUNG flood reaches every node carrying the peer's own clock in the last keepalive the origin had from it;
a node that has a keepalive stamped well after that (REFUTE hang limits) refutes it with a RECOVERED flood
(``floods.py``), which vouches for the peer at the origin: the silence that counts starts again, and DEAD is never
reached while anybody hears the peer. Stamps, not arrival times: bytes held in a partition, or read after the
reader's own pause, arrive late but carry their old stamp. So a node cut off from a peer that the rest of the job
hears (its own host partitioned, one broken link) does not declare it dead (docs/architecture.md 2.7; the sweep
seeds 6631 and 6669 of docs/reliability.md 2.3). The DEAD rung makes the verdict pending; ``suspicion.py`` decides
it with a reachability gather.

The fast-death rule (a refused reconnect after a lost connection, a vanished pid on this host) is not a rung: it is
an answer from the driver, applied in ``verdicts.py``.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from .config import Timers
from .peers import Addr, PeerKey

#: While a hang lasts, the peers that flagged it re-flood the verdict every HUNG_REFRESH hang limits; a verdict
#: nobody confirms for HUNG_EXPIRY hang limits expires (a node that missed the RECOVERED flood does not keep it).
HUNG_REFRESH = 2.0
HUNG_EXPIRY = 5.0
#: A silence verdict is final (DEAD) only after our HUNG verdict about the peer stood unrefuted this many
#: unresponsive limits: time for the flood to reach a node that hears the peer and for its RECOVERED to come back.
CONFIRM = 1.0
#: A refutation of a HUNG verdict, or a vouch for a silent peer, needs a keepalive from the peer stamped (on the
#: peer's own clock) more than this many hang limits after the last one the verdict's origin had.
REFUTE = 0.5
#: The stamp of a verdict whose sender never had a keepalive from the subject: a HUNG so stamped makes no claim about
#: the subject's clock and cannot be refuted by one, a RECOVERED so stamped proves nothing (monotonic clocks are > 0).
UNSTAMPED = 0.0


@dataclass
class Contact:
    """A peer this node keeps a link to: the current incarnation at ``addr`` when the link was made. A newer
    incarnation at that address gets a new contact (``verdicts.Verdicts.retire``)."""

    addr: Addr
    last_heard: float
    wanted_since: float
    incarnation: int = 0
    conn: int | None = None
    next_connect: float = 0.0
    disconnected_since: float | None = None
    delayed: bool = False
    hung: bool = False  # we flagged it HUNG and keep refreshing that verdict while the silence lasts
    hung_refreshed: float = 0.0
    heard_ever: bool = False
    hung_since: float = 0.0  # when our standing HUNG verdict was first flagged
    vouched: float = float("-inf")  # when another node last vouched for the peer (a RECOVERED flood)
    lost_connection: bool = False  # the peer closed our connection; a refused reconnect now means it is gone
    unreached: bool = False  # never heard, and no connection for connect_warn: bridged by fallback links, silently
    key: PeerKey = field(init=False)  # (addr, incarnation), kept: the liveness checks read it every tick

    def __post_init__(self) -> None:
        self.key = PeerKey(self.addr, self.incarnation)

    def retry_later(self, now: float, retry: float) -> None:
        """The connection attempt failed before it was ready: try again after ``retry``."""
        self.conn = None
        if self.disconnected_since is None:
            self.disconnected_since = now
        self.next_connect = now + retry

    def lost(self, now: float) -> None:
        """The peer closed an established connection: either side reconnects at once."""
        self.conn = None
        self.lost_connection = True  # a refused reconnect now means the peer is gone
        self.disconnected_since = now
        self.next_connect = now

    def reset(self, now: float) -> None:
        """We reset a silent connection: reconnect at once; the peer has been disconnected since it went quiet."""
        self.conn = None
        self.disconnected_since = self.last_heard
        self.next_connect = now

    def vouch(self, now: float) -> None:
        """Another node heard the peer: the silence verdicts count from now, and our HUNG verdict is refuted."""
        self.vouched = now
        self.hung = False

    def forgive(self, gap: float) -> None:
        self.last_heard += gap
        self.vouched += gap
        self.hung_refreshed += gap
        self.hung_since += gap
        if self.disconnected_since is not None:
            self.disconnected_since += gap


class Observation(NamedTuple):
    """One contact as the ladder sees it at one tick."""

    silence: float  # since the peer was last heard
    disconnected: float | None  # how long it has had no connection, None while it has one
    ready: bool  # its connection is READY
    delayed: bool
    hung: bool
    since_hung_refresh: float
    heard_ever: bool
    unvouched: float  # since the peer was last heard here or vouched for by another node
    hung_for: float  # how long our HUNG verdict has stood (0 if we hold none)
    unreached: bool = False

    @classmethod
    def of(cls, contact: Contact, ready: bool, now: float) -> Observation:
        disconnected = None if contact.disconnected_since is None else now - contact.disconnected_since
        return cls(
            now - contact.last_heard,
            disconnected,
            ready,
            contact.delayed,
            contact.hung,
            now - contact.hung_refreshed,
            contact.heard_ever,
            now - max(contact.last_heard, contact.vouched),
            now - contact.hung_since if contact.hung else 0.0,
            contact.unreached,
        )


class Rung(enum.Enum):
    UNRESPONSIVE = "unresponsive"
    CONNECT_TIMEOUT = "connect timeout"
    UNREACHED = "unreached"
    HUNG = "hung"
    DEAD = "dead"
    RESET = "reset"


Reached = Callable[[Observation, Timers], bool]

#: The ladder, in the order the rungs are applied within one tick. DEAD ends the climb: the contact is gone.
LADDER: tuple[tuple[Rung, Reached], ...] = (
    (Rung.UNRESPONSIVE, lambda o, t: not o.delayed and o.ready and o.silence > t.unresponsive),
    (
        Rung.CONNECT_TIMEOUT,
        lambda o, t: (
            not o.delayed
            and not o.ready
            and o.disconnected is not None
            and o.disconnected > t.connect_warn
            and o.heard_ever
        ),
    ),
    (
        Rung.UNREACHED,
        lambda o, t: (
            not o.unreached
            and not o.ready
            and o.disconnected is not None
            and o.disconnected > t.connect_warn
            and not o.heard_ever
        ),
    ),
    (
        Rung.HUNG,
        lambda o, t: (
            o.unvouched > t.hang
            and (o.heard_ever or o.unvouched > t.dead)
            and (not o.hung or o.since_hung_refresh >= HUNG_REFRESH * t.hang)
        ),
    ),
    (Rung.DEAD, lambda o, t: o.unvouched > t.dead and o.hung and o.hung_for >= CONFIRM * t.unresponsive),
    (Rung.RESET, lambda o, t: o.ready and o.silence > t.reset),
)
FINAL = frozenset({Rung.DEAD})


@functools.lru_cache(maxsize=16)
def quiet_limit(timers: Timers) -> float:
    """A READY link heard within this long reaches no rung (every rung but CONNECT_TIMEOUT and UNREACHED needs a
    longer silence, and those two need the link down): the ladder skips it without observing it. Each tick checks
    every contact, so this keeps a healthy mesh cheap."""
    return min(timers.unresponsive, timers.hang, timers.dead, timers.reset)


def step(observation: Observation, timers: Timers) -> list[Rung]:
    """The rungs this contact reaches now, in order (each applied once per tick)."""
    reached: list[Rung] = []
    for rung, test in LADDER:
        if test(observation, timers):
            reached.append(rung)
            if rung in FINAL:
                break
    return reached
