"""The RAS node: every rule of the mesh, as a state machine with no I/O.

Everything that changes what a node believes lives in this file; the runtime (``rasd.net``) and the simulator
(``rasd.sim``) only carry bytes and time in and out. Each input method takes the current time and returns the
actions the driver must carry out, in order::

    driver                                   Node
      accepted / connected / received  --->  (state changes)  ---> [Send, Connect, Close, Emit, ...]
      closed / connect_failed / tick   --->
      start_gather / leave / pid_gone  --->

Theory of operation
-------------------
* **Connections** authenticate (``auth``), then the connector sends CONNINIT with its own peer entry and table
  hashes; the acceptor answers CONNINITACK (or a NACK: the connector is dead, a duplicate, or we are leaving).
* **Links.** ``ring.links`` says which peers to keep connected (ring neighbours, fallbacks over silent ones, skip
  links). A *contact* tracks each such peer: when we last heard from it, its connection, whether it is delayed.
  The lower address connects first; the higher one waits ``connect_warn`` for it; after a lost connection either
  side reconnects at once.
* **Liveness** (the ladder in ``config.Timers``): a keepalive goes out on every used connection idle for a
  keepalive interval; the silence of a contact makes it UNRESPONSIVE, then HUNG, then its socket is reset, then it
  is DEAD. A contact whose connection closed and whose reconnect is refused (or whose pid is gone on this host) is
  DEAD at once.
* **Verdicts travel as floods** (DEAD, LEFT, HUNG, RECOVERED): every node passes a flood on once to all its
  healthy connections. The dead and departed lists are also hashed into every keepalive, as a backstop.
* **Processes, not addresses.** Verdicts are about a ``PeerKey`` (address, incarnation). Connections and links are
  about addresses: they reach whoever listens there now, the newest incarnation the table knows there (its
  *current* entry). An older incarnation at an address is gone and recorded dead unless it left, so a process
  that gets a dead predecessor's port back is a new, live peer, and the predecessor never comes back.
* **The peer table** is gossiped: hash mismatches trade whole tables, new entries are passed on as diffs.
* **Gathers** (status queries) flood a request and fold the replies back up the tree the flood made.
* **A paused node** (its thread starved, or SIGSTOP) does not blame its peers for its own silence: a long gap
  between ticks moves every silence clock forward by the gap.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
from dataclasses import dataclass, field
from typing import Callable, Union

from . import auth, ring, wire
from .comms import ProcessData, RestartRecord, next_restart
from .config import Timers
from .events import Event, Kind
from .peers import Addr, PeerInfo, PeerKey, PeerTable, key_set_hash
from .snapshot import JobSnapshot
from .stuck import StuckDetector, StuckVerdict

# ----------------------------------------------------------------------------------------------------------------
# Actions: what the driver must do


@dataclass(frozen=True)
class Connect:
    conn_id: int
    addr: Addr


@dataclass(frozen=True)
class Send:
    conn_id: int
    data: bytes


@dataclass(frozen=True)
class Close:
    conn_id: int


@dataclass(frozen=True)
class Emit:
    event: Event


@dataclass(frozen=True)
class ProbePid:
    """Ask whether ``pid`` still exists on this host; answer with ``Node.pid_gone`` if it does not."""

    addr: Addr
    pid: int


@dataclass(frozen=True)
class GatherDone:
    query_id: int
    snapshot: JobSnapshot


Action = Union[Connect, Send, Close, Emit, ProbePid, GatherDone]

#: At most this many connections may be unauthenticated at once; the oldest is dropped to make room.
MAX_PENDING_CONNS = 64
#: Remembered flood ids and finished gathers (for de-duplication).
HISTORY = 4096
#: While a hang lasts, the peers that flagged it re-flood the verdict every HUNG_REFRESH hang limits; a verdict
#: nobody confirms for HUNG_EXPIRY hang limits expires (a node that missed the RECOVERED flood does not keep it).
HUNG_REFRESH = 2.0
HUNG_EXPIRY = 5.0
#: The query id of the sweeper's own gathers (client queries have positive ids).
SWEEP_QUERY = -1


class ConnState(enum.Enum):
    CONNECTING = "connecting"  # outgoing, TCP not yet up
    AUTH = "auth"  # challenge-response in progress
    INIT = "init"  # authenticated, waiting for CONNINIT (incoming) or CONNINITACK (outgoing)
    READY = "ready"


@dataclass
class Conn:
    id: int
    outgoing: bool
    opened_at: float
    peer: Addr | None = None
    incarnation: int | None = None  # the peer process's, once its CONNINIT or CONNINITACK named it
    state: ConnState = ConnState.AUTH
    reader: wire.FrameReader = field(default_factory=wire.FrameReader)
    last_recv: float = 0.0
    last_send: float = 0.0
    my_nonce: bytes = b""
    their_nonce: bytes = b""
    peer_wants: bool = True
    wanted_sent: bool | None = None  # what we last told the peer about our use of this connection
    full_sent_for: tuple[int, int] | None = None


@dataclass
class Contact:
    """A peer this node keeps a link to: the current incarnation at ``addr`` when the link was made. A newer
    incarnation at that address gets a new contact (``Node._retire``)."""

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


@dataclass
class Gather:
    root: Addr
    coll_id: int
    from_conn: int | None  # None at the root
    query_id: int
    started: float
    timeout: float | None
    pending: set[int]
    entries: list[tuple[Addr, ProcessData]]
    leg_timeouts: int = 0


class Node:
    def __init__(
        self,
        info: PeerInfo,
        secret: bytes,
        timers: Timers = Timers(),
        rng: random.Random | None = None,
        local_data: Callable[[], ProcessData] = ProcessData,
        express_links: bool = True,
    ) -> None:
        self.me = info
        self.secret = secret
        self.timers = timers
        self.rng = rng or random.SystemRandom()
        self.local_data = local_data
        self.express_links = express_links
        self.table = PeerTable()
        self.table.merge([info])
        # Dead and departed processes, by (address, incarnation): a newer process at one of their addresses is not.
        self.dead: set[PeerKey] = set()
        self.left: set[PeerKey] = set()
        # Peers under a HUNG verdict (ours or flooded to us), with when it was last confirmed. The peers that flag
        # a hang re-flood it every HUNG_REFRESH hang limits while it lasts; a verdict nobody confirms expires, so a
        # node that missed the RECOVERED flood (cut off, paused) does not keep a stale verdict.
        self.hung: dict[PeerKey, float] = {}
        # The process each outstanding ProbePid asked about, by address (the answer names only the address).
        self._probes: dict[Addr, PeerKey] = {}
        self.conns: dict[int, Conn] = {}
        self.contacts: dict[Addr, Contact] = {}
        self.gathers: dict[tuple[Addr, int], Gather] = {}
        # Communicator verdicts: the sweeper's detector, and every verdict this node holds with when it was last
        # confirmed (the sweeper re-floods standing verdicts each sweep; unconfirmed ones expire).
        self.stuck_detector = StuckDetector(timers.stuck)
        self.stuck: dict[int, tuple[StuckVerdict, float]] = {}
        self._next_sweep = 0.0
        self._sweeping = False
        self.expelled = False
        self.leaving = False
        self._next_conn_id = 1
        self._next_flood_id = 1
        self._next_coll_id = 1
        self._seen_floods: collections.OrderedDict[tuple[Addr, int], None] = collections.OrderedDict()
        self._done_gathers: collections.OrderedDict[tuple[Addr, int], None] = collections.OrderedDict()
        self._dead_hash = self._gone_hash()
        self._last_tick: float | None = None
        self._now = 0.0  # the time of the input being handled, for helpers that send or close
        self._out: list[Action] = []
        #: This process's in-process restarts (``restarted``), contributed to every gather.
        self.restart: RestartRecord | None = None

    # ------------------------------------------------------------------------------------------------------------
    # Inputs

    def start(self, now: float) -> list[Action]:
        self._now = now
        self._emit(Kind.PEER_NEW, now, self.me)
        self._last_tick = now
        self._next_sweep = now + self.timers.sweep
        return self._flush()

    def add_peers(self, peers: list[PeerInfo], now: float, introduce: bool = False) -> list[Action]:
        """Peers learnt outside the mesh (the bootstrap store, a communicator's members). ``introduce``: connect to
        them at once whatever the address order (bootstrap seeds do not know this node yet; the connection tells
        them, and gossip tells the rest of the job)."""
        self._now = now
        if not self.expelled:
            new = self._merge_peers(peers, now)
            if new:
                self._pass_on(wire.PeersUpdate(tuple(new), (), (), full=False), except_conn=None)
            self._relink(now)
            for p in peers if introduce else ():
                contact = self.contacts.get(p.addr)
                if p.addr == self.me.addr or self._conn_to(p.addr) is not None:
                    continue
                if contact is not None:
                    contact.next_connect = now
                else:
                    cid = self._next_conn_id
                    self._next_conn_id += 1
                    self.conns[cid] = Conn(id=cid, outgoing=True, opened_at=now, peer=p.addr,
                                           state=ConnState.CONNECTING, last_recv=now, last_send=now)
                    self._out.append(Connect(cid, p.addr))
            self._connect_due(now)
        return self._flush()

    def adopt_table(self, table: PeerTable, now: float) -> list[Action]:
        """Start from a whole peer table that lists this node, without a PEER_NEW event per peer: the simulator's
        way to start thousands of nodes that have all heard of each other (one sort and hash for all of them)."""
        self._now = now
        if self.me.addr not in table or self.expelled:
            raise ValueError("the adopted table must list this node")
        self.table = table
        self._relink(now)
        self._connect_due(now)
        return self._flush()

    def accepted(self, conn_id: int, now: float) -> list[Action]:
        """A new incoming TCP connection (``conn_id`` chosen by the driver, negative by convention)."""
        self._now = now
        if self.expelled or self.leaving:
            self._out.append(Close(conn_id))
            return self._flush()
        pending = sorted((c for c in self.conns.values() if c.state in (ConnState.AUTH, ConnState.INIT)
                          and not c.outgoing), key=lambda c: c.opened_at)
        if len(pending) >= MAX_PENDING_CONNS:
            self._drop_conn(pending[0].id)
        self.conns[conn_id] = Conn(id=conn_id, outgoing=False, opened_at=now, last_recv=now, last_send=now)
        return self._flush()

    def connected(self, conn_id: int, now: float) -> list[Action]:
        """An outgoing connection reached the peer: start the handshake."""
        self._now = now
        conn = self.conns.get(conn_id)
        if conn is None:
            self._out.append(Close(conn_id))
            return self._flush()
        conn.state = ConnState.AUTH
        conn.my_nonce = self.rng.randbytes(wire.NONCE_LEN)
        conn.last_recv = now
        self._send(conn, wire.Hello(conn.my_nonce), now)
        return self._flush()

    def connect_failed(self, conn_id: int, now: float, refused: bool) -> list[Action]:
        self._now = now
        conn = self.conns.pop(conn_id, None)
        if conn is not None and conn.peer is not None:
            contact = self.contacts.get(conn.peer)
            if contact is not None and contact.conn == conn_id:
                contact.conn = None
                if contact.disconnected_since is None:
                    contact.disconnected_since = now
                contact.next_connect = now + self.timers.connect_retry
                if refused and self.timers.fast_death and contact.lost_connection:
                    self._declare_dead(contact.key, now, "connection closed and reconnect refused")
                elif refused:
                    self._probe_if_local(conn.peer)  # nobody listens there: if its process is gone, it is dead
        return self._flush()

    def closed(self, conn_id: int, now: float) -> list[Action]:
        """The peer closed the connection (EOF or reset)."""
        self._now = now
        conn = self.conns.pop(conn_id, None)
        if conn is not None:
            self._purge_gathers(conn_id, now)
            if conn.peer is not None and conn.state is ConnState.READY:
                self._lost(conn, now, "peer closed connection during receive operation")
            elif conn.peer is not None:
                # Closed by the acceptor before it was ready (its handshake timer, its pending limit): retry as after
                # a failed connect, or the contact would wait on a connection that no longer exists until the dead
                # limit declares a live peer dead.
                contact = self.contacts.get(conn.peer)
                if contact is not None and contact.conn == conn_id:
                    contact.conn = None
                    contact.lost_connection = True  # a refused reconnect now means the peer is gone
                    if contact.disconnected_since is None:
                        contact.disconnected_since = now
                    contact.next_connect = now + self.timers.connect_retry
                    self._probe_if_local(conn.peer)
            self._connect_due(now)
        return self._flush()

    def pid_gone(self, addr: Addr, now: float) -> list[Action]:
        """The driver checked a ``ProbePid``: that process no longer exists. The verdict is about the incarnation
        the probe asked about; if a newer one holds the address by now, that one is not touched."""
        self._now = now
        current = self.table.get(addr)
        key = self._probes.pop(addr, None) or (current.key if current is not None else None)
        if self.timers.fast_death and key is not None and self.table.is_current(key) and not self._gone(key):
            self._declare_dead(key, now, "process no longer exists")
        return self._flush()

    def received(self, conn_id: int, data: bytes, now: float) -> list[Action]:
        self._now = now
        conn = self.conns.get(conn_id)
        if conn is None:
            return self._flush()
        try:
            for msg in conn.reader.feed(data):
                if conn_id not in self.conns:
                    break
                self._on_message(conn, msg, now)
        except wire.ProtocolError:
            self._drop_conn(conn_id)
        return self._flush()

    def tick(self, now: float) -> list[Action]:
        self._now = now
        if self.expelled:
            return self._flush()
        if self._last_tick is not None:
            gap = now - self._last_tick
            if gap > max(3 * self.timers.tick, 2 * self.timers.keepalive):
                self._forgive_pause(gap - self.timers.tick)
        self._last_tick = now
        self._handshake_timeouts(now)
        self._liveness(now)
        self._expire_hung(now)
        self._sweep(now)
        self._expire_stuck(now)
        self._connect_due(now)
        self._keepalives(now)
        self._close_idle(now)
        self._gather_timeouts(now)
        return self._flush()

    def start_gather(self, query_id: int, now: float, timeout: float | None = None) -> list[Action]:
        """Start a status gather rooted here. ``timeout``: the collective timeout in seconds (None: the default;
        ``float('inf')``: no collective timeout). Ends with a ``GatherDone`` action."""
        self._now = now
        self._start_gather(query_id, now, timeout)
        return self._flush()

    def _start_gather(self, query_id: int, now: float, timeout: float | None) -> None:
        if timeout is None:
            timeout = self.timers.leg_timeout
        coll_id = self._next_coll_id
        self._next_coll_id += 1
        g = Gather(root=self.me.addr, coll_id=coll_id, from_conn=None, query_id=query_id, started=now,
                   timeout=None if timeout == float("inf") else timeout, pending=set(),
                   entries=[(self.me.addr, self._contribution())])
        self.gathers[(g.root, g.coll_id)] = g
        # The wire carries a u32 of milliseconds (49.7 days): a longer client TIMEOUT is clamped, never raised.
        timeout_ms = 0 if g.timeout is None else max(1, min(int(g.timeout * 1000), 0xFFFFFFFF))
        req = wire.CollReq(g.root, g.coll_id, timeout_ms)
        for c in self._gather_conns(now, except_conn=None):
            self._send(c, req, now)
            g.pending.add(c.id)
        self._maybe_finish(g, now)

    def restarted(self, iteration: int, cause: str, terminated: tuple[int, ...], seconds_lost: float,
                  now: float) -> list[Action]:
        """A local notification: this process's training restarted in place (``rasd.record_restart``, called by
        inprocess.Wrapper). The node keeps the summary it contributes to gathers and emits RESTART to its own
        subscribers. Nothing goes over the mesh: every rank of the job restarts and its own node tells its own
        clients, and gathers carry the summaries job-wide. A repeat of the last iteration is ignored."""
        self._now = now
        record = next_restart(self.restart, iteration, cause, terminated, seconds_lost)
        if record is not None:
            self.restart = record
            self._out.append(Emit(Event(kind=Kind.RESTART, at=now, addr=self.me.addr, peer=self.me,
                                        details=record.describe(), ranks=record.terminated, restart=record)))
        return self._flush()

    def leave(self, now: float) -> list[Action]:
        """Say goodbye: every peer records this process as LEFT, not dead. Closes every connection."""
        self._now = now
        if not self.expelled and not self.leaving:
            self.leaving = True
            flood = self._new_flood(wire.FloodKind.LEFT, self.me.addr, self.me.incarnation)
            for c in list(self.conns.values()):
                if c.state is ConnState.READY:
                    self._send(c, flood, now)
        for cid in list(self.conns):
            self._drop_conn(cid)
        self.contacts.clear()
        return self._flush()

    # ------------------------------------------------------------------------------------------------------------
    # Queries (for the runtime and tests)

    def _contribution(self) -> ProcessData:
        """What this process adds to a gather: its communicators and, once it has restarted, its restarts."""
        data = self.local_data()
        if self.restart is not None and data.restart is None:
            data = dataclasses.replace(data, restart=self.restart)
        return data

    @property
    def dead_hash(self) -> int:
        return self._dead_hash

    def link_peers(self) -> set[Addr]:
        return set(self.contacts)

    def live_peers(self) -> list[PeerInfo]:
        """The current entry of every address whose process is neither dead nor departed."""
        return [p for p in self.table if not self._gone(p.key)]

    def is_dead(self, addr: Addr) -> bool:
        """Whether the process that holds ``addr`` now (the newest incarnation known there) is dead."""
        p = self.table.get(addr)
        return p is not None and p.key in self.dead

    def has_left(self, addr: Addr) -> bool:
        """Whether the process that holds ``addr`` now left the job cleanly."""
        p = self.table.get(addr)
        return p is not None and p.key in self.left

    def left_addresses(self) -> set[Addr]:
        """The addresses whose current process left the job (the job summary leaves them out)."""
        return {k.addr for k in self.left if self.table.is_current(k)}

    def is_unresponsive(self, addr: Addr) -> bool:
        c = self.contacts.get(addr)
        return bool(c and c.delayed)

    # ------------------------------------------------------------------------------------------------------------
    # Messages

    def _on_message(self, conn: Conn, msg: wire.Message, now: float) -> None:
        conn.last_recv = now
        if conn.state is ConnState.AUTH:
            self._on_auth(conn, msg, now)
        elif conn.state is ConnState.INIT:
            if conn.outgoing and isinstance(msg, wire.ConnInitAck):
                self._on_ack(conn, msg, now)
            elif not conn.outgoing and isinstance(msg, wire.ConnInit):
                self._on_conninit(conn, msg, now)
            else:
                raise wire.ProtocolError(f"unexpected {type(msg).__name__} before CONNINIT")
        else:
            self._heard(conn, now)
            if isinstance(msg, wire.Keepalive):
                conn.peer_wants = msg.wanted
                self._sync_tables(conn, msg.peers_hash, msg.dead_hash, now)
            elif isinstance(msg, wire.PeersUpdate):
                self._on_peers_update(conn, msg, now)
            elif isinstance(msg, wire.Flood):
                self._on_flood(conn, msg, now)
            elif isinstance(msg, wire.CollReq):
                self._on_collreq(conn, msg, now)
            elif isinstance(msg, wire.CollResp):
                self._on_collresp(conn, msg, now)
            elif isinstance(msg, wire.CommVerdict):
                self._on_comm_verdict(conn, msg, now)
            else:
                raise wire.ProtocolError(f"unexpected {type(msg).__name__} on a ready connection")

    def _on_auth(self, conn: Conn, msg: wire.Message, now: float) -> None:
        if not conn.outgoing and isinstance(msg, wire.Hello) and not conn.their_nonce:
            conn.their_nonce = msg.nonce
            conn.my_nonce = self.rng.randbytes(wire.NONCE_LEN)
            mac = auth.acceptor_mac(self.secret, conn.their_nonce, conn.my_nonce)
            self._send(conn, wire.Challenge(conn.my_nonce, mac), now)
        elif not conn.outgoing and isinstance(msg, wire.Proof) and conn.their_nonce:
            expected = auth.connector_mac(self.secret, conn.their_nonce, conn.my_nonce)
            if not auth.verify(expected, msg.mac):
                raise wire.ProtocolError("bad proof: wrong job secret")
            conn.state = ConnState.INIT
            conn.reader.max_frame = wire.MAX_FRAME
        elif conn.outgoing and isinstance(msg, wire.Challenge):
            expected = auth.acceptor_mac(self.secret, conn.my_nonce, msg.nonce)
            if not auth.verify(expected, msg.mac):
                raise wire.ProtocolError("bad challenge: wrong job secret")
            self._send(conn, wire.Proof(auth.connector_mac(self.secret, conn.my_nonce, msg.nonce)), now)
            self._send(conn, wire.ConnInit(self.me, self.table.hash, self._dead_hash), now)
            conn.state = ConnState.INIT
            conn.reader.max_frame = wire.MAX_FRAME
        else:
            raise wire.ProtocolError(f"unexpected {type(msg).__name__} during authentication")

    def _on_conninit(self, conn: Conn, msg: wire.ConnInit, now: float) -> None:
        addr = msg.info.addr
        key = msg.info.key
        if self._gone(key) or self.table.is_outdated(key):
            # Dead, departed, or older than the process that holds its address now (so gone): never rejoins.
            self._send(conn, wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD), now)
            self._drop_conn(conn.id)
            return
        if addr == self.me.addr:
            raise wire.ProtocolError("connection from our own address")
        existing = self._conn_to(addr, exclude=conn.id)
        if existing is not None and existing.incarnation not in (None, key.incarnation):
            existing = None  # a connection to an older process at that address: the merge below retires it
        if existing is not None:
            # Simultaneous connects (reference 3.3): the connection the lower address opened survives, on both
            # sides, whatever the timing. A ready connection gone silent is no reason to refuse a fresh one.
            stale = existing.state is ConnState.READY and now - existing.last_recv > self.timers.unresponsive
            if self.me.addr.sort_key() < addr.sort_key() and not stale:
                self._send(conn, wire.ConnInitAck(wire.Nack.DUPLICATE), now)
                self._drop_conn(conn.id)
                return
            self._drop_conn(existing.id, replaced=True)
        conn.peer = addr
        conn.incarnation = key.incarnation
        conn.state = ConnState.READY
        conn.peer_wants = True
        if self._merge_peers([msg.info], now):
            self._pass_on(wire.PeersUpdate((msg.info,), (), (), full=False), except_conn=conn.id)
            self._relink(now)
        self._emit(Kind.PEER_CONNECTING, now, self.table.get(addr))
        self._send(conn, wire.ConnInitAck(wire.Nack.OK, self.me), now)
        self._attach(conn, now)
        self._sync_tables(conn, msg.peers_hash, msg.dead_hash, now)

    def _on_ack(self, conn: Conn, msg: wire.ConnInitAck, now: float) -> None:
        assert conn.peer is not None
        if msg.nack is wire.Nack.YOU_ARE_DEAD:
            self._expel(now)
            return
        if msg.nack is wire.Nack.DUPLICATE:
            self._drop_conn(conn.id, replaced=True)
            return
        if msg.nack is wire.Nack.LEAVING:
            self._drop_conn(conn.id)
            acceptor = self.table.get(conn.peer)
            if acceptor is not None:
                self._mark_left(acceptor.key, now, flood=False)
            return
        if msg.info is not None and msg.info.addr != conn.peer:
            raise wire.ProtocolError("the peer answered with another address")
        if msg.info is not None and (self._gone(msg.info.key) or self.table.is_outdated(msg.info.key)):
            self._drop_conn(conn.id)  # a process the job holds gone answered: no business with it
            return
        current = self.table.get(conn.peer)
        conn.incarnation = msg.info.incarnation if msg.info is not None else current.incarnation if current else None
        # A newer process at that address retires the older one first (dropping its connections, not this one).
        if msg.info is not None and self._merge_peers([msg.info], now):
            self._relink(now)
        existing = self._conn_to(conn.peer, exclude=conn.id)
        if existing is not None and existing.state is ConnState.READY:
            # The peer accepted our connection and dropped its own: keep this one.
            self._drop_conn(existing.id, replaced=True)
        conn.state = ConnState.READY
        self._emit(Kind.PEER_CONNECTED, now, self.table.get(conn.peer), "connection established successfully")
        self._attach(conn, now)

    def _on_peers_update(self, conn: Conn, msg: wire.PeersUpdate, now: float) -> None:
        if self.me.key in msg.dead or self.me.key in msg.left:
            self._expel(now)
            return
        # The lists first, then the rule that retires replaced incarnations: a replaced process that this update
        # lists as departed is recorded LEFT, not dead.
        new = self._merge_peers(msg.peers, now, retire=False)
        changed = bool(new)
        for k in msg.left:
            if k not in self.left and k not in self.dead and self.table.knows(k):
                self._mark_left(k, now, flood=False)
                changed = True
        for k in msg.dead:
            if k not in self.dead and self.table.knows(k):
                self._declare_dead(k, now, None, flood=False)
                changed = True
        self._retire({p.addr for p in new}, now)
        if self.expelled:
            return
        if new:
            self._pass_on(wire.PeersUpdate(tuple(new), (), (), full=False), except_conn=conn.id)
        if changed:
            self._relink(now)

    def _on_flood(self, conn: Conn, msg: wire.Flood, now: float) -> None:
        key = (msg.origin, msg.flood_id)
        if key in self._seen_floods:
            return
        self._remember(self._seen_floods, key)
        subject = PeerKey(msg.subject, msg.incarnation)
        if subject == self.me.key:
            if msg.kind is wire.FloodKind.DEAD:
                self._expel(now)
            return
        if not self.table.is_current(subject) or self._gone(subject):
            return  # unknown, already gone, or an older incarnation of that address (gone by rule): stale
        if msg.kind is wire.FloodKind.DEAD:
            self._declare_dead(subject, now, None, flood=False)
        elif msg.kind is wire.FloodKind.LEFT:
            self._mark_left(subject, now, flood=False)
        elif msg.kind is wire.FloodKind.HUNG:
            self._hung_verdict(subject, now, "peer silent beyond the hang limit")
        elif msg.kind is wire.FloodKind.RECOVERED:
            if self.hung.pop(subject, None) is not None:
                self._emit(Kind.PEER_RECOVERED, now, self.table.entry(subject), "peer responding again")
        self._pass_on(msg, except_conn=conn.id)

    def _on_comm_verdict(self, conn: Conn, msg: wire.CommVerdict, now: float) -> None:
        key = (msg.origin, msg.flood_id)
        if key in self._seen_floods:
            return
        self._remember(self._seen_floods, key)
        verdict = StuckVerdict(msg.comm_hash, msg.op, msg.seq, msg.behind, msg.inside, msg.global_behind,
                               msg.global_inside)
        if msg.stuck:
            self._hold_stuck(verdict, now)
        else:
            self._release_stuck(verdict.comm_hash, now, "counters moving again")
        self._pass_on(msg, except_conn=conn.id)

    # ------------------------------------------------------------------------------------------------------------
    # Stuck communicators

    def _is_sweeper(self) -> bool:
        """The lowest-address live peer that this node does not know to be silent sweeps the job."""
        for p in self.table:
            a = p.addr
            if a == self.me.addr:
                return True
            if self._gone(p.key) or p.key in self.hung or self.is_unresponsive(a):
                continue
            return False
        return False

    def _sweep(self, now: float) -> None:
        if self._sweeping or now < self._next_sweep or not self._is_sweeper():
            return
        self._next_sweep = now + self.timers.sweep
        if not self.local_data().comms:
            return  # a sweeper that holds no communicator has none to watch (every rank holds the world group)
        self._sweeping = True
        self._start_gather(SWEEP_QUERY, now, None)

    def _on_sweep(self, snap: JobSnapshot, now: float) -> None:
        new, cleared = self.stuck_detector.observe(snap, now)
        for v in cleared:
            self._release_stuck(v.comm_hash, now, "counters moving again")
            self._flood_comm_verdict(v, stuck=False)
        for v in self.stuck_detector.active():  # new ones, and a refresh of those that stand
            self._hold_stuck(v, now)
            self._flood_comm_verdict(v, stuck=True)

    def _flood_comm_verdict(self, v: StuckVerdict, stuck: bool) -> None:
        msg = wire.CommVerdict(self.me.addr, self._next_flood_id, stuck, v.comm_hash, v.op, v.seq, v.behind,
                               v.inside, v.global_behind, v.global_inside)
        self._next_flood_id += 1
        self._remember(self._seen_floods, (msg.origin, msg.flood_id))
        self._pass_on(msg, except_conn=None)

    def _hold_stuck(self, v: StuckVerdict, now: float) -> None:
        if v.comm_hash not in self.stuck:
            self._out.append(Emit(Event(kind=Kind.COMM_STUCK, at=now, details=v.describe(), comm_hash=v.comm_hash,
                                        ranks=v.global_ranks)))
        self.stuck[v.comm_hash] = (v, now)

    def _release_stuck(self, comm_hash: int, now: float, why: str) -> None:
        held = self.stuck.pop(comm_hash, None)
        if held is not None:
            self._out.append(Emit(Event(kind=Kind.COMM_RECOVERED, at=now, details=why, comm_hash=comm_hash,
                                        ranks=held[0].global_ranks)))

    def _expire_stuck(self, now: float) -> None:
        for comm_hash, (_, confirmed) in list(self.stuck.items()):
            if now - confirmed > 3 * self.timers.sweep + self.timers.leg_timeout + self.timers.gather_extra:
                self._release_stuck(comm_hash, now, "verdict no longer confirmed")

    # ------------------------------------------------------------------------------------------------------------
    # Gathers

    def _gather_conns(self, now: float, except_conn: int | None) -> list[Conn]:
        """Connections a gather may use: ready, in use by a link, and not silent."""
        out = []
        for c in self.conns.values():
            if c.id == except_conn or c.state is not ConnState.READY or c.peer is None:
                continue
            in_use = c.peer in self.contacts or c.peer_wants
            contact = self.contacts.get(c.peer)
            if in_use and now - c.last_recv <= self.timers.unresponsive and not (contact and contact.delayed):
                out.append(c)
        return out

    def _on_collreq(self, conn: Conn, msg: wire.CollReq, now: float) -> None:
        key = (msg.root, msg.coll_id)
        if key in self.gathers or key in self._done_gathers:
            self._send(conn, wire.CollResp(msg.root, msg.coll_id, 0, ()), now)
            return
        g = Gather(root=msg.root, coll_id=msg.coll_id, from_conn=conn.id, query_id=0, started=now,
                   timeout=None if msg.timeout_ms == 0 else msg.timeout_ms / 1000, pending=set(),
                   entries=[(self.me.addr, self._contribution())])
        self.gathers[key] = g
        for c in self._gather_conns(now, except_conn=conn.id):
            self._send(c, msg, now)
            g.pending.add(c.id)
        self._maybe_finish(g, now)

    def _on_collresp(self, conn: Conn, msg: wire.CollResp, now: float) -> None:
        g = self.gathers.get((msg.root, msg.coll_id))
        if g is None or conn.id not in g.pending:
            return
        g.pending.discard(conn.id)
        g.leg_timeouts += msg.leg_timeouts
        g.entries.extend(msg.entries)
        self._maybe_finish(g, now)

    def _maybe_finish(self, g: Gather, now: float, force: bool = False) -> None:
        if g.pending and not force:
            return
        g.leg_timeouts += len(g.pending)
        g.pending.clear()
        key = (g.root, g.coll_id)
        self.gathers.pop(key, None)
        self._remember(self._done_gathers, key)
        if g.from_conn is None:
            responses: dict[Addr, ProcessData] = {}
            for addr, data in g.entries:
                responses.setdefault(addr, data)
            current_dead = frozenset(k.addr for k in self.dead if self.table.is_current(k))
            current_left = frozenset(k.addr for k in self.left if self.table.is_current(k))
            former = self.table.former()
            snap = JobSnapshot(peers=tuple(self.table), dead=current_dead, left=current_left,
                               former_dead=tuple(p for p in former if p.key in self.dead),
                               former_left=tuple(p for p in former if p.key in self.left and p.key not in self.dead),
                               responses=responses, timeouts=g.leg_timeouts, collection_time=now - g.started,
                               stuck={h: v.describe() for h, (v, _) in self.stuck.items()},
                               in_flight_grace=self.timers.in_flight)
            if g.query_id == SWEEP_QUERY:
                self._sweeping = False
                if not self.expelled:
                    self._on_sweep(snap, now)
            else:
                self._out.append(GatherDone(g.query_id, snap))
        else:
            back = self.conns.get(g.from_conn)
            if back is not None and back.state is ConnState.READY:
                self._send(back, wire.CollResp(g.root, g.coll_id, g.leg_timeouts, tuple(g.entries)), now)

    def _purge_gathers(self, conn_id: int, now: float) -> None:
        """A connection went silent or away: count it as a leg timeout wherever a gather waits on it."""
        for key, g in list(self.gathers.items()):
            if g.from_conn == conn_id:
                del self.gathers[key]  # nobody left to answer to
                self._remember(self._done_gathers, key)
            elif conn_id in g.pending:
                g.pending.discard(conn_id)
                g.leg_timeouts += 1
                self._maybe_finish(g, now)

    def _gather_timeouts(self, now: float) -> None:
        for g in list(self.gathers.values()):
            # A leg whose connection has gone silent is answered by nobody: count it now (NCCL purges a delayed
            # connection from its collectives), whether or not the connection is one of our links.
            for cid in list(g.pending):
                c = self.conns.get(cid)
                if c is not None and c.state is ConnState.READY and now - c.last_recv > self.timers.unresponsive:
                    self._purge_gathers(cid, now)
            if g.timeout is None or (g.root, g.coll_id) not in self.gathers:
                continue
            if now >= g.started + g.timeout + self.timers.gather_extra:
                self._maybe_finish(g, now, force=True)
            elif now >= g.started + g.timeout:
                for cid in list(g.pending):
                    c = self.conns.get(cid)
                    contact = self.contacts.get(c.peer) if c is not None and c.peer is not None else None
                    if c is None or c.state is not ConnState.READY or (contact is not None and contact.delayed):
                        g.pending.discard(cid)
                        g.leg_timeouts += 1
                self._maybe_finish(g, now)

    # ------------------------------------------------------------------------------------------------------------
    # Links and liveness

    def _relink(self, now: float) -> None:
        """Recompute the link set from the table and the contacts' health."""
        if self.expelled or self.leaving:
            return
        order = [p.addr for p in self.table]
        me_index = order.index(self.me.addr)
        gone = {k.addr for k in self.dead | self.left if self.table.is_current(k)}

        def unhealthy(a: Addr) -> bool:
            c = self.contacts.get(a)
            return bool(c and c.delayed)

        wanted = ring.links(order, me_index, gone.__contains__, unhealthy, lambda a: a.host, self.express_links)
        for a in list(self.contacts):
            if a not in wanted:
                del self.contacts[a]  # its connection, if any, idles out unless the peer still uses it
        # In table order, not set order: the order of the connects must not depend on string hashing (PYTHONHASHSEED),
        # or a simulation would not be reproducible from its seed.
        for a in sorted(wanted, key=Addr.sort_key):
            if a in self.contacts:
                continue
            contact = Contact(addr=a, last_heard=now, wanted_since=now, incarnation=self.table.get(a).incarnation)
            existing = self._conn_to(a)
            if existing is not None:
                contact.conn = existing.id
                if existing.state is ConnState.READY:
                    contact.heard_ever = True
            else:
                contact.disconnected_since = now
                lower = self.me.addr.sort_key() < a.sort_key()
                contact.next_connect = now if lower or self._is_fallback(a) else now + self.timers.connect_warn
            self.contacts[a] = contact

    def _is_fallback(self, a: Addr) -> bool:
        """Not one of our two ring neighbours: we asked for it because another peer is silent."""
        live = [p.addr for p in self.live_peers()]
        i = live.index(self.me.addr)
        return a not in (live[(i + 1) % len(live)], live[(i - 1) % len(live)])

    def _attach(self, conn: Conn, now: float) -> None:
        """A connection to ``conn.peer`` became ready."""
        contact = self.contacts.get(conn.peer)  # type: ignore[arg-type]
        if contact is None:
            return
        contact.conn = conn.id
        contact.disconnected_since = None
        contact.lost_connection = False
        contact.heard_ever = True
        self._heard(conn, now)

    def _heard(self, conn: Conn, now: float) -> None:
        contact = self.contacts.get(conn.peer) if conn.peer is not None else None
        if contact is None:
            return
        contact.last_heard = now
        was_delayed = contact.delayed and contact.conn == conn.id
        # Under a HUNG verdict, ours or another node's: hearing the peer ends it, here and (by flood) everywhere.
        was_hung = self.hung.pop(contact.key, None) is not None or contact.hung
        contact.hung = False
        if was_delayed:
            contact.delayed = False
        if was_delayed or was_hung:
            self._emit(Kind.PEER_RECOVERED, now, self.table.entry(contact.key), "peer responding again")
        if was_hung:
            self._pass_on(self._new_flood(wire.FloodKind.RECOVERED, contact.addr, contact.incarnation),
                          except_conn=None)
        if was_delayed:
            self._relink(now)

    def _lost(self, conn: Conn, now: float, why: str) -> None:
        """An established connection to a peer ended."""
        assert conn.peer is not None
        peer = self.table.get(conn.peer)
        contact = self.contacts.get(conn.peer)
        if contact is None or contact.conn != conn.id or self._gone(contact.key):
            return
        contact.conn = None
        contact.lost_connection = True
        contact.disconnected_since = now
        contact.next_connect = now  # either side reconnects at once after a loss
        self._emit(Kind.PEER_DISCONNECTED, now, peer, why)
        self._probe_if_local(conn.peer)

    def _probe_if_local(self, addr: Addr) -> None:
        """Ask the driver whether a peer on this host still has a process (same IP and host name)."""
        peer = self.table.get(addr)
        same_host = peer is not None and peer.host == self.me.host and peer.hostname == self.me.hostname
        if same_host and self.timers.fast_death and peer is not None:
            self._probes[addr] = peer.key
            self._out.append(ProbePid(peer.addr, peer.pid))

    def _liveness(self, now: float) -> None:
        t = self.timers
        for contact in list(self.contacts.values()):
            a = contact.addr
            if contact.key in self.dead or contact.key in self.left or self.contacts.get(a) is not contact:
                continue
            silence = now - contact.last_heard
            conn = self.conns.get(contact.conn) if contact.conn is not None else None
            ready = conn is not None and conn.state is ConnState.READY
            if not contact.delayed:
                if ready and silence > t.unresponsive:
                    self._flag_delayed(contact, now, f"peer not responding for {int(silence)}s (keepalive warning)")
                elif (not ready and contact.disconnected_since is not None
                      and now - contact.disconnected_since > t.connect_warn and contact.heard_ever):
                    self._flag_delayed(contact, now,
                                       f"peer not responding for {int(now - contact.disconnected_since)}s "
                                       "(connect timeout)")
            if silence > t.hang and contact.heard_ever and (
                    not contact.hung or now - contact.hung_refreshed >= HUNG_REFRESH * t.hang):
                contact.hung = True
                contact.hung_refreshed = now
                self._hung_verdict(contact.key, now, f"peer silent for {int(silence)}s")
                self._pass_on(self._new_flood(wire.FloodKind.HUNG, a, contact.incarnation), except_conn=None)
            if silence > t.dead:
                self._emit(Kind.PEER_TIMEOUT_DEAD, now, self.table.get(a),
                           f"peer failed to respond for {int(silence)}s, declaring dead")
                self._declare_dead(contact.key, now, None)
                continue
            if ready and silence > t.reset:
                assert conn is not None
                self._emit(Kind.PEER_KEEPALIVE_TIMEOUT, now, self.table.get(a),
                           f"keepalive timeout after {int(silence)}s, terminating connection")
                self._drop_conn(conn.id)
                contact.conn = None
                contact.disconnected_since = contact.last_heard
                contact.next_connect = now

    def _hung_verdict(self, key: PeerKey, now: float, why: str) -> None:
        if key not in self.hung:
            self._emit(Kind.PEER_HUNG, now, self.table.entry(key), why)
        self.hung[key] = now

    def _expire_hung(self, now: float) -> None:
        for key, confirmed in list(self.hung.items()):
            contact = self.contacts.get(key.addr)
            if contact is not None and contact.hung and contact.incarnation == key.incarnation:
                continue  # our own verdict: it stands while we hear nothing
            if now - confirmed > HUNG_EXPIRY * self.timers.hang:
                del self.hung[key]
                self._emit(Kind.PEER_RECOVERED, now, self.table.entry(key), "hang verdict no longer confirmed")

    def _flag_delayed(self, contact: Contact, now: float, why: str) -> None:
        contact.delayed = True
        self._emit(Kind.PEER_UNRESPONSIVE, now, self.table.get(contact.addr), why)
        if contact.conn is not None:
            self._purge_gathers(contact.conn, now)
        self._relink(now)

    def _connect_due(self, now: float) -> None:
        for contact in self.contacts.values():
            if contact.conn is None and now >= contact.next_connect:
                cid = self._next_conn_id
                self._next_conn_id += 1
                self.conns[cid] = Conn(id=cid, outgoing=True, opened_at=now, peer=contact.addr,
                                       state=ConnState.CONNECTING, last_recv=now, last_send=now)
                contact.conn = cid
                contact.next_connect = now + self.timers.connect_retry
                self._out.append(Connect(cid, contact.addr))

    def _keepalives(self, now: float) -> None:
        for conn in self.conns.values():
            if conn.state is not ConnState.READY:
                continue
            mine = conn.peer in self.contacts
            # Keepalives flow on a connection either side uses; and whenever our use of it changes we say so at
            # once, so that the peer neither monitors nor routes gathers over a connection we have stopped using.
            idle = now - conn.last_send >= self.timers.keepalive
            if ((mine or conn.peer_wants) and idle) or conn.wanted_sent is not mine:
                conn.wanted_sent = mine
                self._send(conn, wire.Keepalive(self.table.hash, self._dead_hash, mine), now)

    def _close_idle(self, now: float) -> None:
        for conn in list(self.conns.values()):
            if conn.state is ConnState.READY and conn.peer not in self.contacts and not conn.peer_wants:
                if now - max(conn.last_recv, conn.last_send) > self.timers.idle:
                    self._drop_conn(conn.id)

    def _handshake_timeouts(self, now: float) -> None:
        for conn in list(self.conns.values()):
            if conn.state is not ConnState.READY and now - conn.opened_at > self.timers.handshake:
                if conn.peer is not None:
                    direction = "outgoing" if conn.outgoing else "incoming"
                    self._emit(Kind.PEER_INIT_TIMEOUT, now, self.table.get(conn.peer),
                               f"handshake completion timed out after {int(now - conn.opened_at)}s "
                               f"({direction} connection)")
                contact = self.contacts.get(conn.peer) if conn.peer is not None else None
                self._drop_conn(conn.id)
                if contact is not None and contact.conn == conn.id:
                    contact.conn = None
                    if contact.disconnected_since is None:
                        contact.disconnected_since = now
                    contact.next_connect = now + self.timers.connect_retry

    def _forgive_pause(self, gap: float) -> None:
        """This node did not run for ``gap`` seconds: its peers' silence over that time is not their fault."""
        for a in self.hung:
            self.hung[a] += gap
        for h, (v, confirmed) in list(self.stuck.items()):
            self.stuck[h] = (v, confirmed + gap)
        for contact in self.contacts.values():
            contact.last_heard += gap
            contact.hung_refreshed += gap
            if contact.disconnected_since is not None:
                contact.disconnected_since += gap
        for conn in self.conns.values():
            conn.last_recv += gap
            conn.opened_at += gap

    # ------------------------------------------------------------------------------------------------------------
    # Verdicts

    def _declare_dead(self, key: PeerKey, now: float, why: str | None, flood: bool = True) -> None:
        if key in self.dead or key == self.me.key:
            return
        peer = self.table.entry(key)
        self.dead.add(key)
        self.left.discard(key)
        self.hung.pop(key, None)
        self._dead_hash = self._gone_hash()
        self._disconnect(key, now)
        self._emit(Kind.PEER_DEAD, now, peer, why or "")
        if flood and peer is not None:
            self._pass_on(self._new_flood(wire.FloodKind.DEAD, key.addr, key.incarnation), except_conn=None)
        self._relink(now)

    def _mark_left(self, key: PeerKey, now: float, flood: bool) -> None:
        if key in self.left or key in self.dead or key == self.me.key:
            return
        self.left.add(key)
        self.hung.pop(key, None)
        self._dead_hash = self._gone_hash()
        self._disconnect(key, now)
        self._emit(Kind.PEER_LEFT, now, self.table.entry(key), "process left the job")
        self._relink(now)

    def _gone(self, key: PeerKey) -> bool:
        return key in self.dead or key in self.left

    def _retire(self, addrs: set[Addr], now: float) -> None:
        """Newer incarnations arrived at ``addrs``: every older one there that is not yet known gone is dead (its
        port was free for the newer process to bind). If a newer incarnation holds this node's own address, the job
        counts this node gone: it stops taking part."""
        for addr in sorted(addrs, key=Addr.sort_key):
            for p in self.table.former(addr):
                if not self._gone(p.key):
                    self._declare_dead(p.key, now, "a newer process holds its address", flood=False)
        if self.me.addr in addrs and not self.table.is_current(self.me.key):
            self._expel(now)

    def _expel(self, now: float) -> None:
        """The job has declared this process dead. It can never rejoin: stop taking part."""
        if self.expelled:
            return
        self.expelled = True
        self._emit(Kind.PEER_DEAD, now, self.me, "this process was declared dead by the job")
        for cid in list(self.conns):
            self._drop_conn(cid)
        self.contacts.clear()
        for key in list(self.gathers):
            g = self.gathers[key]
            if g.from_conn is None:
                self._maybe_finish(g, now, force=True)
        self.gathers.clear()

    def _disconnect(self, key: PeerKey, now: float) -> None:
        """Forget the link to that process and close its connections. Connections to the same address that belong
        to a newer incarnation stay; ones still in their handshake (incarnation unknown) go only if ``key`` is the
        current entry, as they would reach that process."""
        contact = self.contacts.get(key.addr)
        if contact is not None and contact.incarnation == key.incarnation:
            del self.contacts[key.addr]
        current = self.table.is_current(key)
        for c in list(self.conns.values()):
            if c.peer == key.addr and (c.incarnation == key.incarnation or (c.incarnation is None and current)):
                self._drop_conn(c.id)

    def _gone_hash(self) -> int:
        return key_set_hash(self.dead) ^ (key_set_hash(self.left) * 3 & 0xFFFFFFFFFFFFFFFF)

    # ------------------------------------------------------------------------------------------------------------
    # Tables

    def _merge_peers(self, peers, now: float, retire: bool = True) -> list[PeerInfo]:
        """Add entries to the table (PEER_NEW for each new one) and, unless the caller does it after applying
        dead and departed lists, retire the older incarnations at the addresses that got a new one."""
        new = self.table.merge(peers)
        for p in new:
            self._emit(Kind.PEER_NEW, now, p)
        if retire and new:
            self._retire({p.addr for p in new}, now)
        return new

    def _sync_tables(self, conn: Conn, peers_hash: int, dead_hash: int, now: float) -> None:
        mine = (self.table.hash, self._dead_hash)
        if (peers_hash, dead_hash) != mine and conn.full_sent_for != mine:
            conn.full_sent_for = mine
            self._send(conn, wire.PeersUpdate(tuple(self.table.all_entries()),
                                              tuple(sorted(self.dead, key=PeerKey.sort_key)),
                                              tuple(sorted(self.left, key=PeerKey.sort_key)), full=True), now)

    # ------------------------------------------------------------------------------------------------------------
    # Plumbing

    def _new_flood(self, kind: wire.FloodKind, subject: Addr, incarnation: int) -> wire.Flood:
        msg = wire.Flood(self.me.addr, self._next_flood_id, kind, subject, incarnation)
        self._next_flood_id += 1
        self._remember(self._seen_floods, (msg.origin, msg.flood_id))
        return msg

    def _pass_on(self, msg: wire.Message, except_conn: int | None) -> None:
        for c in list(self.conns.values()):
            if c.id != except_conn and c.state is ConnState.READY:
                self._send(c, msg, self._now)

    def _conn_to(self, addr: Addr, exclude: int | None = None) -> Conn | None:
        for c in self.conns.values():
            if c.peer == addr and c.id != exclude:
                return c
        return None

    def _send(self, conn: Conn, msg: wire.Message, now: float) -> None:
        conn.last_send = max(conn.last_send, now)
        self._out.append(Send(conn.id, wire.encode(msg)))

    def _drop_conn(self, conn_id: int, replaced: bool = False) -> None:
        conn = self.conns.pop(conn_id, None)
        if conn is None:
            return
        self._out.append(Close(conn_id))
        if conn.peer is not None:
            contact = self.contacts.get(conn.peer)
            if contact is not None and contact.conn == conn_id:
                contact.conn = None
                if replaced:
                    other = self._conn_to(conn.peer)
                    contact.conn = other.id if other is not None else None
                if contact.conn is None and contact.disconnected_since is None:
                    contact.disconnected_since = self._now
        self._purge_gathers(conn_id, self._now)

    def _emit(self, kind: Kind, now: float, peer: PeerInfo | None, details: str = "") -> None:
        self._out.append(Emit(Event(kind=kind, at=now, addr=peer.addr if peer else None, peer=peer,
                                    details=details)))

    @staticmethod
    def _remember(history: collections.OrderedDict, key) -> None:
        history[key] = None
        if len(history) > HISTORY:
            history.popitem(last=False)

    def _flush(self) -> list[Action]:
        out, self._out = self._out, []
        return out
