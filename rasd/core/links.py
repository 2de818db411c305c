"""Links: which peers this node keeps connected, their contacts, and climbing the liveness ladder for each.

Belongs here: the contacts (one per linked peer), recomputing them from the ring (``relink``), opening the
connections they want (``connect_due``), hearing from a peer, losing a connection and retrying it, the keepalives
that keep a used connection alive, closing connections no link uses, and applying the rungs of ``liveness.LADDER``.
Which peers are linked is ``ring.links`` (a pure function); the verdicts a rung leads to are in ``verdicts.py``.

The lower address connects first; the higher one waits ``connect_warn`` for it, unless the peer is a fallback or
a bootstrap seed (``introduce``); after a lost connection either side reconnects at once, then every
``connect_retry`` (docs/architecture.md section 2.3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from . import ring, wire
from .connections import Conn, ConnState
from .effects import (
    ClimbOn,
    Dial,
    Drop,
    Effects,
    Hung,
    HungEnded,
    Notify,
    Originate,
    ProbeLocal,
    Purge,
    Purpose,
    Refused,
    Relink,
    SayFrame,
    Silent,
)
from .events import Kind
from .liveness import REFUTE, UNSTAMPED, Contact, Observation, Rung, quiet_limit, step
from .peers import Addr, PeerInfo, PeerKey
from .witness import withheld

if TYPE_CHECKING:
    from .view import World


class Links:
    def __init__(self, world: World) -> None:
        self.world = world
        self.contacts: dict[Addr, Contact] = {}
        #: Each peer's own clock in the last keepalive we had from it (``clocked``).
        self.clocks: dict[PeerKey, float] = {}
        #: The freshest stamp of a RECOVERED flood about each process (``refuted``).
        self.recoveries: dict[PeerKey, float] = {}
        #: When we last had bytes from each address, link or not (never forgiven: ``heard_within``).
        self.heard_at: dict[Addr, float] = {}
        #: Connections whose peer said, in its last keepalive, that it does not use them as a link (by id).
        self._unwanted: set[int] = set()
        #: What we last told each connection's peer about our use of it (by id; absent: nothing yet).
        self._told: dict[int, bool] = {}
        #: The contacts of the climb in progress, and how many of them it has judged (``climb``, ``climb_on``).
        self._climbing: list[Contact] = []
        self._climbed = 0

    # --- which peers -------------------------------------------------------------------------------------------

    def relink(self, now: float) -> None:
        """Recompute the link set from the table and the contacts' health."""
        world = self.world
        if world.expelled or world.leaving:
            return
        table = world.table
        order = table.addresses()
        me_index = table.index_of(world.me.addr)
        assert me_index is not None  # a node's table always lists it
        gone = world.gone_addresses()
        gone_at = sorted(i for i in map(table.index_of, gone) if i is not None)

        def unhealthy(a: Addr) -> bool:
            c = self.contacts.get(a)
            return bool(c and (c.delayed or c.unreached))

        def healthy(a: Addr) -> bool:
            # Known healthy: a link of ours that we have heard and that is not delayed. A peer we hold no link to is
            # not known healthy, so a silent host is skipped whole (sweep seed 5152: a walk across two cut-off hosts
            # one process per connect_warn took 5 s, and the walker was suspected meanwhile).
            c = self.contacts.get(a)
            return bool(c and c.heard_ever and not c.delayed and not c.unreached)

        wanted = ring.links(
            order, me_index, gone.__contains__, unhealthy, lambda a: a.host, world.express_links, healthy, gone_at
        )
        neighbours: tuple[Addr, Addr] | None = None  # our two live ring neighbours, found when first needed
        for a in list(self.contacts):
            if a not in wanted:
                del self.contacts[a]  # its connection, if any, idles out unless the peer still uses it
        # In table order, not set order: the order of the connects must not depend on string hashing (PYTHONHASHSEED),
        # or a simulation would not be reproducible from its seed.
        for a in sorted(wanted, key=Addr.sort_key):
            if a in self.contacts:
                continue
            current = world.table.get(a)
            assert current is not None  # ring.links walks the table
            contact = Contact(addr=a, last_heard=now, wanted_since=now, incarnation=current.incarnation)
            existing = world.conn_to(a)
            if existing is not None:
                contact.conn = existing.id
                if existing.state is ConnState.READY:
                    contact.heard_ever = True
            else:
                contact.disconnected_since = now
                lower = world.me.addr.sort_key() < a.sort_key()
                if not lower and neighbours is None:
                    neighbours = _live_neighbours(order, me_index, gone)
                # Not one of our two ring neighbours: a fallback, asked for because another peer is silent.
                fallback = not lower and neighbours is not None and a not in neighbours
                contact.next_connect = now if lower or fallback else now + world.timers.connect_warn
            self.contacts[a] = contact

    def is_delayed(self, addr: Addr) -> bool:
        c = self.contacts.get(addr)
        return bool(c and c.delayed)

    def holds_hung(self, key: PeerKey) -> bool:
        """Whether our own ladder holds that linked process hung (the verdict stands while we hear nothing)."""
        c = self.contacts.get(key.addr)
        return c is not None and c.hung and c.incarnation == key.incarnation

    def forget(self, key: PeerKey) -> None:
        """That process is dead or departed: no link to it."""
        contact = self.contacts.get(key.addr)
        if contact is not None and contact.incarnation == key.incarnation:
            del self.contacts[key.addr]

    def clear(self) -> None:
        """This node leaves the job, or was expelled: no links at all."""
        self.contacts.clear()

    # --- connecting --------------------------------------------------------------------------------------------

    def introduce(self, peers: Iterable[PeerInfo], now: float) -> Effects:
        """Connect to these peers at once whatever the address order (bootstrap seeds that do not know us yet)."""
        world = self.world
        out: Effects = []
        dialled: set[Addr] = set()
        for p in peers:
            if p.addr == world.me.addr or p.addr in dialled or world.conn_to(p.addr) is not None:
                continue
            contact = self.contacts.get(p.addr)
            if contact is not None:
                contact.next_connect = now
            else:
                dialled.add(p.addr)
                out.append(Dial(p.addr, Purpose.INTRODUCE))
        return out

    def connect_due(self, now: float) -> Effects:
        out: Effects = []
        for contact in self.contacts.values():
            if contact.conn is None and now >= contact.next_connect:
                out.append(Dial(contact.addr, Purpose.LINK))
                contact.next_connect = now + self.world.timers.connect_retry
        return out

    def dialled(self, addr: Addr, conn_id: int) -> None:
        """The connection a ``Dial(LINK)`` of ours asked for is open: the contact waits on it."""
        contact = self.contacts.get(addr)
        if contact is not None and contact.conn is None:
            contact.conn = conn_id

    def _retry(self, conn: Conn, now: float) -> Contact | None:
        """``conn`` ended before it was ready: its contact, if it was waiting on it, retries after
        ``connect_retry``. Returns that contact."""
        contact = self.contacts.get(conn.peer) if conn.peer is not None else None
        if contact is None or contact.conn != conn.id:
            return None
        contact.retry_later(now, self.world.timers.connect_retry)
        return contact

    def connect_failed(self, conn: Conn, refused: bool, now: float) -> Effects:
        """Our connect on ``conn`` failed (``refused``: nobody listens there)."""
        self._forget_conn(conn.id)
        contact = self._retry(conn, now)
        if contact is not None and refused:
            return [Refused(contact.key, contact.lost_connection)]
        return []

    def closed(self, conn: Conn, now: float) -> Effects:
        """The peer closed ``conn`` (it is gone from the connection table)."""
        self._forget_conn(conn.id)
        if conn.peer is not None and conn.state is ConnState.READY:
            return self._lost(conn, now, "peer closed connection during receive operation")
        if conn.peer is not None:
            # Closed by the acceptor before it was ready (its handshake timer, its pending limit): retry as after
            # a failed connect, or the contact would wait on a connection that no longer exists until the dead
            # limit declares a live peer dead.
            contact = self._retry(conn, now)
            if contact is not None:
                contact.lost_connection = True  # a refused reconnect now means the peer is gone
                return [ProbeLocal(conn.peer)]
        return []

    def attach(self, conn: Conn, now: float) -> Effects:
        """A connection to ``conn.peer`` became ready."""
        contact = self.contacts.get(conn.peer) if conn.peer is not None else None
        if contact is None:
            return []
        contact.conn = conn.id
        contact.disconnected_since = None
        contact.lost_connection = False
        contact.heard_ever = True
        return self.heard(conn, now)

    def detach(self, conn: Conn, replaced: bool, now: float) -> None:
        """``conn`` was dropped by this node (it is gone from the connection table): its contact moves to another
        connection to the peer (``replaced``), or has none."""
        self._forget_conn(conn.id)
        contact = self.contacts.get(conn.peer) if conn.peer is not None else None
        if contact is None or contact.conn != conn.id:
            return
        contact.conn = None
        if replaced and conn.peer is not None:
            other = self.world.conn_to(conn.peer)
            contact.conn = other.id if other is not None else None
        if contact.conn is None and contact.disconnected_since is None:
            contact.disconnected_since = now

    def _forget_conn(self, conn_id: int) -> None:
        self._unwanted.discard(conn_id)
        self._told.pop(conn_id, None)

    def _lost(self, conn: Conn, now: float, why: str) -> Effects:
        """An established connection to a peer ended."""
        assert conn.peer is not None
        contact = self.contacts.get(conn.peer)
        if contact is None or contact.conn != conn.id or self.world.is_gone(contact.key):
            return []
        contact.lost(now)
        return [Notify(Kind.PEER_DISCONNECTED, conn.peer, why), ProbeLocal(conn.peer)]

    # --- hearing and silence -----------------------------------------------------------------------------------

    def heard(self, conn: Conn, now: float) -> Effects:
        if conn.peer is None:
            return []
        self.heard_at[conn.peer] = now
        contact = self.contacts.get(conn.peer)
        if contact is None:
            return []
        contact.last_heard = now
        was_delayed = contact.delayed and contact.conn == conn.id
        # Under a HUNG verdict, ours or another node's: hearing the peer ends it, here and (by flood) everywhere.
        was_hung = self.world.is_hung(contact.key) or contact.hung
        if not (was_delayed or was_hung or contact.unreached):
            return []
        out: Effects = []
        if was_hung:
            out.append(HungEnded(contact.key))
        contact.hung = False
        if was_delayed:
            contact.delayed = False
        if was_delayed or was_hung:
            out.append(Notify(Kind.PEER_RECOVERED, contact.key, "peer responding again"))
        if was_hung:
            out.append(Originate(wire.FloodKind.RECOVERED, contact.key, self.stamp(contact.key)))
        if was_delayed or contact.unreached:
            contact.unreached = False
            out.append(Relink())
        return out

    def on_keepalive(self, conn: Conn, msg: wire.Keepalive, now: float) -> Effects:
        """A keepalive: whether the peer uses this connection as a link, and its clock, the freshest proof of life
        we hold."""
        if msg.wanted:
            self._unwanted.discard(conn.id)
        else:
            self._unwanted.add(conn.id)
        if conn.peer is not None and conn.incarnation is not None:
            key = PeerKey(conn.peer, conn.incarnation)
            self.clocks[key] = max(msg.clock, self.clocks.get(key, msg.clock))
        return []

    def peer_wants(self, conn_id: int) -> bool:
        """Whether the peer uses that connection as a link (what its last keepalive said; yes until it says)."""
        return conn_id not in self._unwanted

    def fresher(self, key: PeerKey, stamp: float) -> bool:
        """Whether we heard that process well after ``stamp`` on its own clock: more than REFUTE hang limits later.
        Delivery time proves nothing (bytes held in a partition or read after our own pause arrive late); the
        peer's own clock in its keepalives does."""
        if stamp == UNSTAMPED:
            return False  # the origin never had a keepalive from it: no claim about its clock to refute
        return self.clocks.get(key, float("-inf")) - stamp > REFUTE * self.world.timers.hang

    def heard_within(self, key: PeerKey, window: float, now: float) -> bool:
        """Whether we had bytes from that process within ``window`` (its address, while it is the current process
        there). Read late (a partition's held bytes, our own pause) this errs towards yes: it only refutes."""
        at = self.heard_at.get(key.addr)
        return at is not None and self.world.table.is_current(key) and now - at <= window

    def refuted(self, key: PeerKey, stamp: float) -> bool:
        """Whether a RECOVERED flood already proved that process alive well after ``stamp``: a HUNG verdict so stamped
        is old news that a faster path overtook (it is dropped, not applied)."""
        if stamp == UNSTAMPED:
            return False
        return self.recoveries.get(key, float("-inf")) - stamp > REFUTE * self.world.timers.hang

    def stamp(self, key: PeerKey) -> float:
        """The peer's clock in the last keepalive we had from it (UNSTAMPED if none)."""
        return self.clocks.get(key, UNSTAMPED)

    def vouch(self, key: PeerKey, stamp: float, now: float) -> None:
        """Another node heard that process (its RECOVERED flood, stamped with the process's clock): if that is well
        after we last heard it, our silence clock for it starts again (liveness.py, *unvouched*)."""
        if stamp == UNSTAMPED:
            return  # no proof: the sender had no keepalive from it
        self.recoveries[key] = max(stamp, self.recoveries.get(key, stamp))
        contact = self.contacts.get(key.addr)
        if contact is None or contact.key != key:
            return  # not a link of ours
        if key not in self.clocks or stamp - self.clocks[key] > REFUTE * self.world.timers.hang:
            contact.vouch(now)

    def answered(self, key: PeerKey, now: float) -> None:
        """That process answered a gather of ours: it is alive now, our silence clock for it starts again."""
        contact = self.contacts.get(key.addr)
        if contact is not None and contact.key == key:
            contact.vouch(now)

    def climb(self, now: float) -> Effects:
        """Apply the liveness ladder to every contact (``liveness.step``), one contact at a time: when a contact's
        rungs ask for something of another room, the climb stops there and asks to go on (``ClimbOn``) once that is
        carried out, so the next contact is judged in the world the last one's verdicts made (a contact a relink
        dropped meanwhile is skipped)."""
        self._climbing = list(self.contacts.values())
        self._climbed = 0
        return self.climb_on(now)

    def climb_on(self, now: float) -> Effects:
        """Go on with the climb ``climb`` began, after the contact it stopped at."""
        world = self.world
        quiet = quiet_limit(world.timers)
        climbing = self._climbing
        while self._climbed < len(climbing):
            contact = climbing[self._climbed]
            self._climbed += 1
            conn = world.conn(contact.conn)
            ready = conn is not None and conn.state is ConnState.READY
            if ready and now - contact.last_heard <= quiet:
                continue  # most links, most ticks: checked first, as it skips the contact whatever else holds
            if world.is_gone(contact.key) or self.contacts.get(contact.addr) is not contact:
                continue
            observation = Observation.of(contact, ready, now)
            out: Effects = []
            for rung in step(observation, world.timers):
                out += _APPLY[rung](self, contact, observation, now)
            if out:
                if self._climbed < len(climbing):
                    out.append(ClimbOn())
                return out
        self._climbing = []
        return []

    def _unresponsive(self, contact: Contact, seen: Observation, now: float) -> Effects:
        return self._flag_delayed(contact, now, f"peer not responding for {int(seen.silence)}s (keepalive warning)")

    def _connect_timeout(self, contact: Contact, seen: Observation, now: float) -> Effects:
        assert seen.disconnected is not None
        return self._flag_delayed(contact, now, f"peer not responding for {int(seen.disconnected)}s (connect timeout)")

    def _unreached(self, contact: Contact, seen: Observation, now: float) -> Effects:
        # A link that never connected (its peer cut off before we linked to it, or not started yet): no fault we
        # know of, so no event, but bridged by a fallback link as a delayed one is. Otherwise a node whose ring
        # neighbours went silent stops its fallback walk at the first peer it never reached, and it can be left
        # linked only into a region that is cut off from the job: alive, heard by a leftover connection, and
        # outside every gather (sweep seed 121, docs/reliability.md 2.3).
        contact.unreached = True
        self.relink(now)
        return []

    def _hung(self, contact: Contact, seen: Observation, now: float) -> Effects:
        if not contact.hung:
            # The job's own collectives may prove it alive though its RAS thread is silent (witness.py): then the
            # silence counts again from now, and no verdict.
            moved, comm = self.world.training_moved(max(contact.last_heard, contact.vouched), now)
            if moved:
                contact.vouch(now)
                return [Notify(Kind.PEER_UNRESPONSIVE, contact.key, withheld(seen.silence, moved, comm))]
            contact.hung_since = now
        contact.hung = True
        contact.hung_refreshed = now
        return [
            Hung(contact.key, f"peer silent for {int(seen.silence)}s"),
            Originate(wire.FloodKind.HUNG, contact.key, self.stamp(contact.key)),
        ]

    def _dead(self, contact: Contact, seen: Observation, now: float) -> Effects:
        # Silent past the dead limit and our HUNG verdict unrefuted: the verdict is decided with the job's view of
        # who can reach whom (suspicion.py), not here. Our HUNG flood goes out once more first, its last call: the
        # earlier ones may have gone out while we were cut off, where nobody who hears the peer could refute them
        # (sweep seed 3432, docs/reliability.md 2.3); the death waits CONFIRM after this one.
        return [Silent(contact.key)]

    def last_call(self, key: PeerKey, now: float) -> Effects:
        """Flood our HUNG verdict about that linked process once more: its silence death waits CONFIRM after this
        (suspicion.py asks again when a heal put this node on the larger side after the first call went out)."""
        contact = self.contacts.get(key.addr)
        if contact is None or contact.key != key:
            return []
        contact.hung_refreshed = now
        return [Originate(wire.FloodKind.HUNG, key, self.stamp(key))]

    def still_silent(self, key: PeerKey, now: float) -> float | None:
        """How long that linked process has been silent to us (heard or vouched for), or None if it is no longer a
        contact of ours or has been heard within the dead limit."""
        contact = self.contacts.get(key.addr)
        if contact is None or contact.key != key:
            return None
        silence = now - max(contact.last_heard, contact.vouched)
        return silence if silence > self.world.timers.dead else None

    def _reset(self, contact: Contact, seen: Observation, now: float) -> Effects:
        assert contact.conn is not None
        out: Effects = [
            Notify(
                Kind.PEER_KEEPALIVE_TIMEOUT,
                contact.addr,
                f"keepalive timeout after {int(seen.silence)}s, terminating connection",
            ),
            Drop(contact.conn),
        ]
        contact.reset(now)
        return out

    def _flag_delayed(self, contact: Contact, now: float, why: str) -> Effects:
        contact.delayed = True
        out: Effects = [Notify(Kind.PEER_UNRESPONSIVE, contact.addr, why)]
        if contact.conn is not None:
            out.append(Purge(contact.conn))
        out.append(Relink())
        return out

    # --- keeping connections alive, and closing unused ones ----------------------------------------------------

    def keepalives(self, now: float) -> Effects:
        world = self.world
        out: Effects = []
        for conn in world.ready_conns():
            mine = conn.peer in self.contacts
            # Keepalives flow on a connection either side uses; and whenever our use of it changes we say so at
            # once, so that the peer neither monitors nor routes gathers over a connection we have stopped using.
            idle = now - conn.last_send >= world.timers.keepalive
            told = self._told.get(conn.id)
            if ((mine or conn.id not in self._unwanted) and idle) or told is not mine:
                self._told[conn.id] = mine
                # The clock rounded down to the keepalive interval (well inside REFUTE's margin): the frames of one
                # interval are alike, which keeps the encoders' and the decoders' caches warm.
                clock = now - now % world.timers.keepalive
                frame = wire.keepalive_frame(world.table.hash, world.dead_hash, mine, clock)
                out.append(SayFrame(conn.id, frame))
        return out

    def close_idle(self, now: float) -> Effects:
        out: Effects = []
        for conn in self.world.ready_conns():
            unused = conn.peer not in self.contacts and conn.id in self._unwanted
            if unused and now - max(conn.last_recv, conn.last_send) > self.world.timers.idle:
                out.append(Drop(conn.id))
        return out

    def forgive(self, gap: float) -> None:
        for contact in self.contacts.values():
            contact.forgive(gap)


def _live_neighbours(order: Sequence[Addr], me: int, gone: set[Addr]) -> tuple[Addr, Addr]:
    """The next and the previous address in table order (wrapping) whose process is not dead or departed; our own
    address when there is none."""
    n = len(order)
    after = next((order[(me + k) % n] for k in range(1, n) if order[(me + k) % n] not in gone), order[me])
    before = next((order[(me - k) % n] for k in range(1, n) if order[(me - k) % n] not in gone), order[me])
    return after, before


#: What the node does at each rung of the ladder (liveness.LADDER says when).
_APPLY: dict[Rung, Callable[[Links, Contact, Observation, float], Effects]] = {
    Rung.UNRESPONSIVE: Links._unresponsive,
    Rung.CONNECT_TIMEOUT: Links._connect_timeout,
    Rung.UNREACHED: Links._unreached,
    Rung.HUNG: Links._hung,
    Rung.DEAD: Links._dead,
    Rung.RESET: Links._reset,
}
