"""A fake ``view.World`` for testing one concept of the core at a time: plain fields that a test sets, no Node.

Every query of ``rasd.core.view.World`` is answered from a field here, in the simplest way that keeps the protocol's
meaning, so a test states the world its concept sees (who is dead, which connections exist, what clocks it holds)
and nothing else runs. The concept under test is built on it (``Verdicts(world)``), its inputs are called with an
explicit ``now``, and the test checks the effects it returns and its own state. Nothing here routes effects: that is
``node.ROUTES``, which these tests leave out on purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rasd.core.comms import ProcessData, RestartRecord, Work
from rasd.core.config import Timers
from rasd.core.connections import Conn, ConnState
from rasd.core.frames import Position
from rasd.core.liveness import REFUTE, UNSTAMPED
from rasd.core.peers import Addr, PeerInfo, PeerKey, PeerTable
from rasd.core.snapshot import JobSnapshot
from rasd.core.stuck import StuckVerdict
from rasd.core.wire import Answer, Ask

SECRET = b"concept test job secret"


def peer(i: int, host: str = "10.0.0.1", incarnation: int | None = None, hostname: str | None = None) -> PeerInfo:
    """Process ``i``: port 30000 + i on ``host``; table order is (host, port), so order follows ``i`` on one host."""
    return PeerInfo(
        addr=Addr(host, 30000 + i),
        pid=100 + i,
        hostname=hostname or f"h-{host}",
        incarnation=7000 + i if incarnation is None else incarnation,
        rank=i,
    )


def snapshot(*answered: PeerInfo | Addr, timeouts: int = 0) -> JobSnapshot:
    """A gather's result in which exactly these processes answered (all a reachability rule reads)."""
    addrs = [p.addr if isinstance(p, PeerInfo) else p for p in answered]
    return JobSnapshot(peers=(), responses={a: ProcessData() for a in addrs}, timeouts=timeouts)


class FakeWorld:
    """``view.World`` from plain fields. The defaults: a table of ``me`` and ``peers``, no connections, nobody dead,
    left, hung or delayed, no links, no clocks."""

    def __init__(self, me: PeerInfo, peers: Iterable[PeerInfo] = (), timers: Timers = Timers()) -> None:
        # --- the node itself
        self.me = me
        self.secret = SECRET
        self.timers = timers
        self.express_links = True
        self.expelled = False
        self.leaving = False
        self.restart: RestartRecord | None = None
        self.waiting = False
        self.local_data: Callable[[], ProcessData] = ProcessData
        #: What ``work`` gives: this process's work as a sweep carries it (work.py).
        self.work_now: Work | None = None
        #: What ``answer`` gives for each ask (a gather other than STATUS).
        self.answers: dict[Ask, Answer] = {}
        #: What ``position`` gives: where this process's main thread is, sent with a sweep.
        self.where: Position = ()
        self.draws = 0  # random_bytes calls so far (each returns a distinct, predictable nonce)
        # --- connections.py
        self.conns: dict[int, Conn] = {}
        # --- gossip.py
        self.table = PeerTable()
        self.table.merge([me, *peers])
        # --- verdicts.py
        self.dead: set[PeerKey] = set()
        self.left: set[PeerKey] = set()
        self.dead_hash = 0
        self.hung: set[PeerKey] = set()
        # --- links.py
        self.links: set[Addr] = set()  # has_link
        self.delayed: set[Addr] = set()  # is_delayed
        self.held_hung: set[PeerKey] = set()  # holds_hung: our own ladder holds it hung
        self.unwanted: set[int] = set()  # peer_wants is False for these connections
        self.clocks: dict[PeerKey, float] = {}  # each process's clock in its last keepalive (stamp, fresher)
        self.recoveries: dict[PeerKey, float] = {}  # the freshest RECOVERED stamp about each process (refuted)
        self.heard_at: dict[Addr, float] = {}  # when we last had bytes from each address (heard_within)
        self.silent_since: dict[PeerKey, float] = {}  # linked processes -> last heard or vouched (still_silent)
        self.moved: tuple[int, int | None] = (0, None)  # training_moved: what a test says the job's collectives show
        # --- sweeper.py, suspicion.py, reunion.py
        self.stuck: dict[int, StuckVerdict] = {}
        self.gathering = False
        self.probes: set[int] = set()

    # --- building the world -------------------------------------------------------------------------------------

    def add_conn(
        self,
        conn_id: int,
        peer: PeerInfo | Addr | None,
        state: ConnState = ConnState.READY,
        incarnation: int | None = -1,
        outgoing: bool = True,
        at: float = 0.0,
    ) -> Conn:
        """A connection to ``peer`` (its incarnation, unless given; None: still in its handshake), opened, last heard
        from and last sent on at ``at``."""
        addr = peer.addr if isinstance(peer, PeerInfo) else peer
        if incarnation == -1:
            incarnation = peer.incarnation if isinstance(peer, PeerInfo) else None
        conn = Conn(
            id=conn_id,
            outgoing=outgoing,
            opened_at=at,
            peer=addr,
            incarnation=incarnation,
            state=state,
            last_recv=at,
            last_send=at,
        )
        self.conns[conn_id] = conn
        return conn

    def merge(self, *peers: PeerInfo) -> None:
        self.table.merge(peers)

    # --- the node itself ----------------------------------------------------------------------------------------

    def random_bytes(self, n: int) -> bytes:
        self.draws += 1
        return bytes([self.draws % 256]) * n

    def answer(self, ask: Ask) -> Answer:
        return self.answers.get(ask, Answer())

    def position(self) -> Position:
        return self.where

    def work(self) -> Work | None:
        return self.work_now

    # --- connections.py -----------------------------------------------------------------------------------------

    def conns_list(self) -> list[Conn]:
        return list(self.conns.values())

    def conn(self, conn_id: int | None) -> Conn | None:
        return self.conns.get(conn_id) if conn_id is not None else None

    def conn_to(self, addr: Addr, exclude: int | None = None) -> Conn | None:
        return next((c for c in self.conns.values() if c.peer == addr and c.id != exclude), None)

    def ready_conns(self, except_conn: int | None = None) -> list[Conn]:
        return [c for c in self.conns.values() if c.id != except_conn and c.state is ConnState.READY]

    # --- gossip.py ----------------------------------------------------------------------------------------------

    def live_peers(self) -> list[PeerInfo]:
        return [p for p in self.table if not self.is_gone(p.key)]

    # --- verdicts.py --------------------------------------------------------------------------------------------

    def is_gone(self, key: PeerKey) -> bool:
        return key in self.dead or key in self.left

    def is_dead(self, addr: Addr) -> bool:
        p = self.table.get(addr)
        return p is not None and p.key in self.dead

    def is_hung(self, key: PeerKey) -> bool:
        return key in self.hung

    def gone_addresses(self) -> set[Addr]:
        return {k.addr for k in self.dead | self.left if self.table.is_current(k)}

    # --- links.py -----------------------------------------------------------------------------------------------

    def has_link(self, addr: Addr) -> bool:
        return addr in self.links

    def is_delayed(self, addr: Addr) -> bool:
        return addr in self.delayed

    def holds_hung(self, key: PeerKey) -> bool:
        return key in self.held_hung

    def peer_wants(self, conn_id: int) -> bool:
        return conn_id not in self.unwanted

    def fresher(self, key: PeerKey, stamp: float) -> bool:
        """links.py's rule: we hold a keepalive from it stamped more than REFUTE hang limits after ``stamp``."""
        if stamp == UNSTAMPED:
            return False
        return self.clocks.get(key, float("-inf")) - stamp > REFUTE * self.timers.hang

    def refuted(self, key: PeerKey, stamp: float) -> bool:
        """links.py's rule: a RECOVERED stamped more than REFUTE hang limits after ``stamp`` came in first."""
        if stamp == UNSTAMPED:
            return False
        return self.recoveries.get(key, float("-inf")) - stamp > REFUTE * self.timers.hang

    def stamp(self, key: PeerKey) -> float:
        return self.clocks.get(key, UNSTAMPED)

    def heard_within(self, key: PeerKey, window: float, now: float) -> bool:
        at = self.heard_at.get(key.addr)
        return at is not None and self.table.is_current(key) and now - at <= window

    def training_moved(self, silent_since: float, now: float) -> tuple[int, int | None]:
        """witness.py's rule, as a test sets it: (collectives completed since, their communicator)."""
        return self.moved

    def still_silent(self, key: PeerKey, now: float) -> float | None:
        """links.py's rule: how long a linked process has been silent, if past the dead limit."""
        since = self.silent_since.get(key)
        if since is None or now - since <= self.timers.dead:
            return None
        return now - since

    # --- sweeper.py, suspicion.py, reunion.py --------------------------------------------------------------------

    def standing_stuck(self) -> dict[int, StuckVerdict]:
        return dict(self.stuck)

    def reach_gathering(self) -> bool:
        return self.gathering

    def is_probe(self, conn_id: int) -> bool:
        return conn_id in self.probes
