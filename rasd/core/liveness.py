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
    HUNG              silent > hang, heard before (re-flagged every      PEER_HUNG verdict, flooded
                      HUNG_REFRESH hang limits while it lasts)
    DEAD              silent > dead                                      PEER_TIMEOUT_DEAD, PEER_DEAD, flooded; stop
    RESET             ready link silent > reset                          PEER_KEEPALIVE_TIMEOUT; socket reset, retried

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
    lost_connection: bool = False  # the peer closed our connection; a refused reconnect now means it is gone
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

    def forgive(self, gap: float) -> None:
        self.last_heard += gap
        self.hung_refreshed += gap
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
        )


class Rung(enum.Enum):
    UNRESPONSIVE = "unresponsive"
    CONNECT_TIMEOUT = "connect timeout"
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
        Rung.HUNG,
        lambda o, t: (
            o.silence > t.hang and o.heard_ever and (not o.hung or o.since_hung_refresh >= HUNG_REFRESH * t.hang)
        ),
    ),
    (Rung.DEAD, lambda o, t: o.silence > t.dead),
    (Rung.RESET, lambda o, t: o.ready and o.silence > t.reset),
)
FINAL = frozenset({Rung.DEAD})


@functools.lru_cache(maxsize=16)
def quiet_limit(timers: Timers) -> float:
    """A READY link heard within this long reaches no rung (every rung but CONNECT_TIMEOUT needs a longer silence,
    and that one needs the link down): the ladder skips it without observing it. Each tick checks every contact, so
    this keeps a healthy mesh cheap."""
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
