"""The RAS node: the one facade the drivers hold, composing the mesh's rules from their own modules.

Belongs here: the node's inputs (each takes the current time and returns the actions the driver must carry out, in
order), the queries the drivers, the tests and the concepts read (``view.World``), and the routing of effects: one
table, ``ROUTES``, that says which room takes each effect a concept returns (the wiring diagram of the mesh). Every
rule of the mesh lives in its own module with its own small state; a concept reads the world through the node's
queries, takes ``now`` as an argument and returns effects (``effects.py``), and never calls or writes another
concept. The node is the only module of the core that knows more than one concept. The runtime
(``rasd/net/runtime.py``) and the simulator (``rasd/sim/network.py``) only carry bytes and time in and out::

    driver                                   Node
      accepted / connected / received  --->  (state changes)  ---> [Send, Connect, Close, Emit, ...]
      closed / connect_failed / tick   --->
      start_gather / leave / pid_gone  --->

Where each rule lives (docs/architecture.md, "Where each rule lives"):

    connections.py  the connection records and ids          handshake.py  HELLO .. CONNINITACK, as a table
    links.py        contacts, relinking, connecting,        liveness.py   the liveness ladder, as a table
                    keepalives, applying the ladder         ring.py       which peers to link (pure)
    verdicts.py     dead, left, hung; fast death; retiring  floods.py     flood ids, dedup, passing verdicts on
    gossip.py       table merges, hashes, updates           gather.py     status gathers and their snapshot
    reunion.py      a healed partition: the smaller side     suspicion.py  silence deaths decided with a
                    leaves                                                 reachability gather
    sweeper.py      the stuck sweeper, COMM_STUCK verdicts  stuck.py      whether a communicator is stuck (pure)
    work.py         whether this process is working
    actions.py      what the node asks its driver to do     snapshot.py   a gather's result, and its one merge

The order of effects, stated once: an input's effects are carried out in the order its concepts returned them, and
each effect's own consequences (the effects its room returns) are carried out before the next one, depth first. So a
concept's effects happen in the order it wrote them, after it has returned: no room is re-entered while it runs.

A *paused* node (its thread starved, or SIGSTOP) does not blame its peers for its own silence: a long gap between
ticks moves every silence clock forward by the gap (``_forgive_pause``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

from . import effects as fx, wire
from .actions import Action, Close, Connect, Emit, GatherDone, ProbePid, Send
from .comms import ProcessData, RestartRecord, Work, next_restart
from .config import Timers
from .connections import MAX_PENDING_CONNS, Conn, Connections, ConnState
from .effects import REACH_QUERY, SWEEP_QUERY, Effects, Purpose
from .events import Event, Kind
from .floods import Floods
from .frames import Position
from .gather import Gather, Gathering
from .gossip import Gossip
from .handshake import Handshake
from .links import Links
from .liveness import Contact
from .peers import Addr, PeerInfo, PeerKey, PeerTable
from .reunion import Reunion
from .stuck import StuckVerdict
from .suspicion import Suspicion
from .sweeper import Sweeper
from .verdicts import Verdicts
from .witness import Witness
from .work import DeclaredPhase, WorkMeter, WorkSample

#: The drivers import the actions and the connection types from here, with the node (``from rasd.core import node``).
__all__ = [
    "Action",
    "Close",
    "Conn",
    "ConnState",
    "Connect",
    "Emit",
    "GatherDone",
    "MAX_PENDING_CONNS",
    "Node",
    "ProbePid",
    "ROUTES",
    "Send",
]


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
        self.expelled = False
        self.leaving = False
        #: This process's in-process restarts (``restarted``), contributed to every gather.
        self.restart: RestartRecord | None = None
        #: This process waits to be admitted into training (``rasd.record_waiting``): reports mark it WAITING.
        self.waiting = False
        #: What this process answers to a gather of each ask but STATUS (``wire.Ask``): providers its runtime
        #: registers (the configuration for DIAGNOSTICS). An ask without one is answered empty.
        self.answers: dict[wire.Ask, Callable[[], wire.Answer]] = {}
        #: Where this process's main thread is (frames.py), sent with each sweep: set by the runtime, which can read
        #: the interpreter's frames; none in the simulator.
        self.where: Callable[[], Position] = tuple
        #: This process's work counters and the phase its code declared (work.py): set by the runtime, which can
        #: read them; none in the simulator unless a scenario gives its nodes some.
        self.work_sample: Callable[[], WorkSample | None] = lambda: None
        self.declared_phase: Callable[[], DeclaredPhase | None] = lambda: None
        self.work_meter = WorkMeter(
            lambda: self.work_sample(), self.position, lambda: self.declared_phase(), self.timers.keepalive / 2
        )
        # The rooms, each with its own state (the module docstrings say what belongs in each); each reads the
        # world through this node's queries (view.World).
        self.connections = Connections()
        self.gossip = Gossip(self, info)
        self.verdicts = Verdicts(self)
        self.links = Links(self)
        self.handshake = Handshake(self)
        self.floods = Floods(self)
        self.gathering = Gathering(self)
        self.sweeper = Sweeper(self)
        self.reunion = Reunion(self)
        self.suspicion = Suspicion(self)
        self.witness = Witness.for_hang(lambda: self.local_data(), lambda: len(self.live_peers()), timers.hang)
        #: What a tick does, in this order.
        self._tick_steps: tuple[Callable[[float], Effects], ...] = (
            self.handshake.timeouts,
            self.links.climb,
            self.verdicts.expire_hung,
            self.sweeper.tick,
            self.sweeper.expire,
            self.links.connect_due,
            self.links.keepalives,
            self.links.close_idle,
            self.reunion.probe_due,
            self.suspicion.tick,
            self.gathering.tick,
            self.gossip.flush,
            self._measure_work,
        )
        self._last_tick: float | None = None
        self.now = 0.0  # the time of the input being handled, for the effects it leads to
        self._out: list[Action] = []

    # ------------------------------------------------------------------------------------------------------------
    # Inputs

    def start(self, now: float) -> list[Action]:
        self.now = now
        self._emit(Event(kind=Kind.PEER_NEW, at=now, addr=self.me.addr, peer=self.me))
        self._last_tick = now
        self.sweeper.start(now)
        return self._flush()

    def add_peers(self, peers: list[PeerInfo], now: float, introduce: bool = False) -> list[Action]:
        """Peers learnt outside the mesh (the bootstrap store, a communicator's members). ``introduce``: connect to
        them at once whatever the address order (bootstrap seeds do not know this node yet; the connection tells
        them, and gossip tells the rest of the job)."""
        self.now = now
        if not self.expelled:
            self._run(self.gossip.merged(peers, spread=True, except_conn=None, relink=False, now=now))
            self.links.relink(now)
            if introduce:
                self._run(self.links.introduce(peers, now))
            self._run(self.links.connect_due(now))
        return self._flush()

    def adopt_table(self, table: PeerTable, now: float) -> list[Action]:
        """Start from a whole peer table that lists this node, without a PEER_NEW event per peer: the simulator's
        way to start thousands of nodes that have all heard of each other (one sort and hash for all of them)."""
        self.now = now
        if self.me.addr not in table or self.expelled:
            raise ValueError("the adopted table must list this node")
        self.gossip.adopt(table)
        self.links.relink(now)
        self._run(self.links.connect_due(now))
        return self._flush()

    def accepted(self, conn_id: int, now: float) -> list[Action]:
        """A new incoming TCP connection (``conn_id`` chosen by the driver, negative by convention)."""
        self.now = now
        if self.expelled or self.leaving:
            self._out.append(Close(conn_id))
            return self._flush()
        oldest = self.connections.oldest_pending_incoming()
        if oldest is not None:
            self._drop(oldest.id)
        self.connections.open_incoming(conn_id, now)
        return self._flush()

    def connected(self, conn_id: int, now: float) -> list[Action]:
        """An outgoing connection reached the peer: start the handshake."""
        self.now = now
        conn = self.connections.get(conn_id)
        if conn is None:
            self._out.append(Close(conn_id))
        else:
            self.connections.connected(conn, now)
            self._run(self.handshake.connected(conn, now))
        return self._flush()

    def connect_failed(self, conn_id: int, now: float, refused: bool) -> list[Action]:
        self.now = now
        conn = self.connections.pop(conn_id)
        if conn is not None:
            self._forget_conn(conn_id)
            self._run(self.links.connect_failed(conn, refused, now))
        return self._flush()

    def closed(self, conn_id: int, now: float) -> list[Action]:
        """The peer closed the connection (EOF or reset)."""
        self.now = now
        conn = self.connections.pop(conn_id)
        if conn is not None:
            self._forget_conn(conn_id)
            self._run(self.gathering.purge(conn_id, now))
            self._run(self.links.closed(conn, now))
            self._run(self.links.connect_due(now))
        return self._flush()

    def pid_gone(self, addr: Addr, now: float) -> list[Action]:
        """The driver checked a ``ProbePid``: that process no longer exists. The verdict is about the incarnation
        the probe asked about; if a newer one holds the address by now, that one is not touched."""
        self.now = now
        self._run(self.verdicts.pid_gone(addr, now))
        return self._flush()

    def received(self, conn_id: int, data: bytes, now: float) -> list[Action]:
        self.now = now
        conn = self.connections.get(conn_id)
        if conn is None:
            return self._flush()
        if conn.state is ConnState.READY and data:
            # Any bytes are proof of life, a whole frame or not (NCCL's lastRecvTime): a large frame crawling over a
            # slow link comes from a peer that speaks (tests/unit/core/test_frame_arriving.py).
            conn.last_recv = now
            effects = self.links.heard(conn, now)
            if effects:
                self._run(effects)
        try:
            for msg in conn.reader.feed(data):
                if conn_id not in self.connections.by_id:
                    break
                self._on_message(conn, msg, now)
        except wire.ProtocolError:
            self._drop(conn_id)
        return self._flush()

    def tick(self, now: float) -> list[Action]:
        self.now = now
        if self.expelled:
            return self._flush()
        if self._last_tick is not None:
            gap = now - self._last_tick
            if gap > max(3 * self.timers.tick, 2 * self.timers.keepalive):
                self._forgive_pause(gap - self.timers.tick)
        self._last_tick = now
        for step in self._tick_steps:
            effects = step(now)
            if effects:
                self._run(effects)
        return self._flush()

    def start_gather(
        self, query_id: int, now: float, timeout: float | None = None, ask: wire.Ask = wire.Ask.STATUS
    ) -> list[Action]:
        """Start a gather rooted here, of the status (the default) or of another ``ask``. ``timeout``: the
        collective timeout in seconds (None: the default; ``float('inf')``: no collective timeout). Ends with a
        ``GatherDone`` action."""
        self.now = now
        self._run(self.gathering.start(query_id, now, timeout, ask))
        return self._flush()

    def restarted(
        self, iteration: int, cause: str, terminated: tuple[int, ...], seconds_lost: float, now: float
    ) -> list[Action]:
        """A local notification: this process's training restarted in place (``rasd.record_restart``, called by
        inprocess.Wrapper). The node keeps the summary it contributes to gathers and emits RESTART to its own
        subscribers. Nothing goes over the mesh: every rank of the job restarts and its own node tells its own
        clients, and gathers carry the summaries job-wide. A repeat of the last iteration is ignored."""
        self.now = now
        record = next_restart(self.restart, iteration, cause, terminated, seconds_lost)
        if record is not None:
            self.restart = record
            self._emit(
                Event(
                    kind=Kind.RESTART,
                    at=now,
                    addr=self.me.addr,
                    peer=self.me,
                    details=record.describe(),
                    ranks=record.terminated,
                    restart=record,
                )
            )
        return self._flush()

    def set_waiting(self, waiting: bool, now: float) -> list[Action]:
        """A local notification: this process joined a running job and waits for the next rendezvous round (True),
        or was admitted, or gave up (False). Its contribution to gathers says so; nothing else changes."""
        self.now = now
        self.waiting = bool(waiting)
        return self._flush()

    def leave(self, now: float) -> list[Action]:
        """Say goodbye: every peer records this process as LEFT, not dead. Closes every connection."""
        self.now = now
        if not self.expelled and not self.leaving:
            self.leaving = True
            self._run(self.floods.originate(wire.FloodKind.LEFT, self.me.key))
        for cid in list(self.connections.by_id):
            self._drop(cid)
        self.links.clear()
        return self._flush()

    def carry_out(self, effects: Effects, now: float) -> None:
        """Carry out effects a test got from one of this node's concepts by hand (``node.suspicion.tick(now)``):
        their actions are queued, and the next input returns them."""
        self.now = now
        self._run(effects)

    # ------------------------------------------------------------------------------------------------------------
    # Queries (for the drivers and tests, and view.World for the concepts)

    @property
    def table(self) -> PeerTable:
        return self.gossip.table

    @property
    def conns(self) -> dict[int, Conn]:
        return self.connections.by_id

    @property
    def contacts(self) -> dict[Addr, Contact]:
        return self.links.contacts

    @property
    def gathers(self) -> dict[tuple[Addr, int], Gather]:
        return self.gathering.gathers

    @property
    def dead(self) -> set[PeerKey]:
        return self.verdicts.dead

    @property
    def left(self) -> set[PeerKey]:
        return self.verdicts.left

    @property
    def hung(self) -> dict[PeerKey, float]:
        return self.verdicts.hung

    @property
    def stuck(self) -> dict[int, tuple[StuckVerdict, float]]:
        return self.sweeper.stuck

    @property
    def dead_hash(self) -> int:
        return self.verdicts.dead_hash

    def link_peers(self) -> set[Addr]:
        return set(self.links.contacts)

    def live_peers(self) -> list[PeerInfo]:
        """The current entry of every address whose process is neither dead nor departed."""
        table, verdicts = self.table, self.verdicts
        if not verdicts.dead and not verdicts.left:
            return list(table)
        # The gone sets are small and the table is not: leave out the current entries of gone processes, by identity.
        gone = {id(table.get(k.addr)) for s in (verdicts.dead, verdicts.left) for k in s if table.is_current(k)}
        return [p for p in table if id(p) not in gone]

    def is_dead(self, addr: Addr) -> bool:
        """Whether the process that holds ``addr`` now (the newest incarnation known there) is dead."""
        p = self.table.get(addr)
        return p is not None and p.key in self.verdicts.dead

    def has_left(self, addr: Addr) -> bool:
        """Whether the process that holds ``addr`` now left the job cleanly."""
        p = self.table.get(addr)
        return p is not None and p.key in self.verdicts.left

    def left_addresses(self) -> set[Addr]:
        """The addresses whose current process left the job (the job summary leaves them out)."""
        return {k.addr for k in self.verdicts.left if self.table.is_current(k)}

    def silent_positions(self, now: float) -> list[tuple[PeerInfo, Position, float]]:
        """Processes heard from no more, with the last position a sweep of this node saw and its age (the
        sweeper's)."""
        return self.sweeper.silent_positions(now)

    def is_unresponsive(self, addr: Addr) -> bool:
        return self.links.is_delayed(addr)

    # view.World: what the concepts may read of each other, answered by the room that owns it.

    def random_bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def _measure_work(self, now: float) -> Effects:
        self.work_meter.tick(now)
        self.witness.tick(now)
        return []

    def work(self) -> Work | None:
        return self.work_meter.report(self.now)

    def position(self) -> Position:
        try:
            return tuple(self.where())
        except Exception:  # noqa: BLE001 - a position is evidence, never a reason to fail a sweep
            return ()

    def answer(self, ask: wire.Ask) -> wire.Answer:
        """This process's answer to a gather of ``ask``. A provider that fails or answers more than the wire carries
        gives an empty answer: a gather never fails for one process's answer (the providers log their own errors;
        the core has no log)."""
        provider = self.answers.get(ask)
        if provider is None:
            return wire.Answer()
        try:
            answer = provider()
        except Exception:  # noqa: BLE001 - a bad answer must not end the gather, let alone the node
            return wire.Answer()
        valid = (
            isinstance(answer, wire.Answer)
            and isinstance(answer.shared, bytes)
            and isinstance(answer.own, bytes)
            and answer.size <= wire.MAX_ANSWER_BYTES
        )
        return answer if valid else wire.Answer()

    def conn(self, conn_id: int | None) -> Conn | None:
        return self.connections.get(conn_id)

    def conns_list(self) -> list[Conn]:
        """Every connection, as a list (``conns`` is the drivers' dict of them)."""
        return list(self.connections)

    def conn_to(self, addr: Addr, exclude: int | None = None) -> Conn | None:
        return self.connections.to(addr, exclude)

    def ready_conns(self, except_conn: int | None = None) -> list[Conn]:
        return self.connections.ready(except_conn)

    def is_gone(self, key: PeerKey) -> bool:
        return self.verdicts.gone(key)

    def is_hung(self, key: PeerKey) -> bool:
        return key in self.verdicts.hung

    def gone_addresses(self) -> set[Addr]:
        return self.verdicts.gone_addresses()

    def has_link(self, addr: Addr) -> bool:
        return addr in self.links.contacts

    def is_delayed(self, addr: Addr) -> bool:
        return self.links.is_delayed(addr)

    def holds_hung(self, key: PeerKey) -> bool:
        return self.links.holds_hung(key)

    def peer_wants(self, conn_id: int) -> bool:
        return self.links.peer_wants(conn_id)

    def fresher(self, key: PeerKey, stamp: float) -> bool:
        return self.links.fresher(key, stamp)

    def refuted(self, key: PeerKey, stamp: float) -> bool:
        return self.links.refuted(key, stamp)

    def stamp(self, key: PeerKey) -> float:
        return self.links.stamp(key)

    def heard_within(self, key: PeerKey, window: float, now: float) -> bool:
        return self.links.heard_within(key, window, now)

    def training_moved(self, silent_since: float, now: float) -> tuple[int, int | None]:
        return self.witness.moved(silent_since, now)

    def still_silent(self, key: PeerKey, now: float) -> float | None:
        return self.links.still_silent(key, now)

    def standing_stuck(self) -> dict[int, StuckVerdict]:
        return self.sweeper.standing()

    def reach_gathering(self) -> bool:
        return self.suspicion.gathering

    def is_probe(self, conn_id: int) -> bool:
        return self.reunion.is_probe(conn_id)

    # ------------------------------------------------------------------------------------------------------------
    # Messages, and carrying out effects

    def _on_message(self, conn: Conn, msg: wire.Message, now: float) -> None:
        conn.last_recv = now  # the node keeps each connection's traffic times (connections.py's records)
        if conn.state is not ConnState.READY:
            self._run(self.handshake.on_message(conn, msg, now))
            return
        effects = self.links.heard(conn, now)
        if effects:
            self._run(effects)
        handlers = READY.get(type(msg))
        if handlers is None:
            raise wire.ProtocolError(f"unexpected {type(msg).__name__} on a ready connection")
        for handler in handlers:
            effects = handler(self, conn, msg, now)
            if effects:
                self._run(effects)

    def _run(self, effects: Effects) -> None:
        """Carry out ``effects`` in order, each one's consequences before the next (the module's doc)."""
        for effect in effects:
            route = ROUTES.get(type(effect))
            if route is not None:
                more = route(self, effect)
                if more:
                    self._run(more)
            elif isinstance(effect, Action):
                self._out.append(effect)  # the driver carries it out
            else:  # an effect nobody takes: a wiring mistake, never dropped in silence (tests/unit/core/test_routes.py)
                raise TypeError(f"no room takes the effect {type(effect).__name__} (node.ROUTES)")

    def _forgive_pause(self, gap: float) -> None:
        """This node did not run for ``gap`` seconds: its peers' silence over that time is not their fault."""
        self.verdicts.forgive(gap)
        self.suspicion.forgive(gap)
        self.sweeper.forgive(gap)
        self.links.forgive(gap)
        self.connections.forgive(gap)

    def _send(self, conn_id: int, frame: bytes) -> None:
        conn = self.connections.by_id.get(conn_id)
        if conn is not None and conn.last_send < self.now:
            conn.last_send = self.now
        self._out.append(Send(conn_id, frame))

    def _broadcast(self, msg: wire.Message, except_conn: int | None) -> None:
        """Send ``msg`` on every ready connection but ``except_conn``, encoded once."""
        ready = self.connections.ready(except_conn)
        if ready:
            frame = wire.flood_frame(msg) if isinstance(msg, (wire.Flood, wire.CommVerdict)) else wire.encode(msg)
            for c in ready:
                self._send(c.id, frame)

    def _dial(self, addr: Addr, purpose: Purpose) -> None:
        conn = self.connections.open_outgoing(addr, self.now)
        self._out.append(Connect(conn.id, addr))
        if purpose is Purpose.LINK:
            self.links.dialled(addr, conn.id)
        elif purpose is Purpose.PROBE:
            self.reunion.dialled(conn.id)

    def _drop(self, conn_id: int, replaced: bool = False) -> None:
        """Close a connection. ``replaced``: another connection to that peer takes over its contact."""
        conn = self.connections.pop(conn_id)
        if conn is None:
            return
        self._out.append(Close(conn_id))
        self._forget_conn(conn_id)
        self.links.detach(conn, replaced, self.now)
        self._run(self.gathering.purge(conn_id, self.now))

    def _forget_conn(self, conn_id: int) -> None:
        """A connection is gone: the rooms that keep something per connection forget it."""
        self.handshake.forget_conn(conn_id)
        self.gossip.forget_conn(conn_id)
        self.reunion.forget_conn(conn_id)

    def _emit(self, event: Event) -> None:
        self._out.append(Emit(event))

    def _notify(self, n: fx.Notify) -> None:
        about = n.about
        peer = self.table.entry(about) if isinstance(about, PeerKey) else self.table.get(about) if about else None
        # A hung process cannot say where it is: the last position a sweep of ours saw, if any (docs/operations.md).
        seen = self.sweeper.last_position(peer.addr) if peer is not None and n.kind is Kind.PEER_HUNG else ()
        positions = ((peer.rank, seen),) if peer is not None and seen else ()
        self._emit(
            Event(
                kind=n.kind,
                at=self.now,
                addr=peer.addr if peer else None,
                peer=peer,
                details=n.details,
                positions=positions,
            )
        )

    def _expel(self, why: str) -> Effects:
        """The job has declared this process dead. It can never rejoin: stop taking part."""
        if self.expelled:
            return []
        self.expelled = True
        self._emit(Event(kind=Kind.PEER_DEAD, at=self.now, addr=self.me.addr, peer=self.me, details=why))
        for cid in list(self.connections.by_id):
            self._drop(cid)
        self.links.clear()
        return self.gathering.finish_all(self.now)

    def _with_conn(self, conn_id: int, then: Callable[[Conn], Effects]) -> Effects:
        conn = self.connections.get(conn_id)
        return then(conn) if conn is not None else []

    def _gather_finished(self, e: fx.GatherFinished) -> Effects:
        if e.query_id == SWEEP_QUERY:
            return self.sweeper.swept(e.snapshot, self.now)
        if e.query_id == REACH_QUERY:
            return self.suspicion.reached(e.snapshot, self.now)
        return [GatherDone(e.query_id, e.snapshot)]

    def _flush(self) -> list[Action]:
        out, self._out = self._out, []
        return out


Route = Callable[[Node, Any], Effects | None]
E = TypeVar("E")


def _route(effect: type[E], room: Callable[[Node, E], Effects | None]) -> tuple[type, Route]:
    """One line of the wiring diagram: ``room`` takes ``effect``, typed, so that mypy checks what it reads of it."""
    return effect, room


#: The wiring diagram of the mesh: which room takes each effect a concept returns. An effect's consequences are
#: carried out before the next effect (``Node._run``). Actions for the driver (``actions.py``) pass straight through.
ROUTES: dict[type, Route] = dict(
    [  # connections, carried out by the node
        _route(fx.Say, lambda n, e: n._send(e.conn_id, wire.encode(e.msg))),
        _route(fx.SayFrame, lambda n, e: n._send(e.conn_id, e.frame)),
        _route(fx.Broadcast, lambda n, e: n._broadcast(e.msg, e.except_conn)),
        _route(fx.Dial, lambda n, e: n._dial(e.addr, e.purpose)),
        _route(fx.Drop, lambda n, e: n._drop(e.conn_id, e.replaced)),
        _route(fx.Authenticated, lambda n, e: n.connections.authenticated(e.conn_id)),
        _route(fx.Incarnation, lambda n, e: n.connections.reaches(e.conn_id, e.incarnation)),
        _route(fx.Ready, lambda n, e: n.connections.ready_for(e.conn_id, e.peer, e.incarnation)),
        _route(fx.Confirm, lambda n, e: n._with_conn(e.conn_id, lambda c: n.handshake.confirm(c, n.now))),
        # the node itself
        _route(fx.Notify, lambda n, e: n._notify(e)),
        _route(fx.Expel, lambda n, e: n._expel(e.why)),
        # verdicts.py
        _route(fx.Dead, lambda n, e: n.verdicts.declare_dead(e.key, n.now, e.why, e.flood)),
        _route(fx.Left, lambda n, e: n.verdicts.mark_left(e.key, n.now)),
        _route(fx.Retire, lambda n, e: n.verdicts.retire(e.addrs, n.now)),
        _route(fx.Hung, lambda n, e: n.verdicts.hung_verdict(e.key, n.now, e.why)),
        _route(fx.HungEnded, lambda n, e: n.verdicts.hung_ended(e.key)),
        _route(fx.Recovered, lambda n, e: n.verdicts.recovered(e.key, n.now)),
        _route(fx.ProbeLocal, lambda n, e: n.verdicts.probe_if_local(e.addr)),
        _route(fx.Refused, lambda n, e: n.verdicts.refused(e.key, e.lost_connection, n.now)),
        # floods.py
        _route(fx.Originate, lambda n, e: n.floods.originate(e.kind, e.subject, e.stamp)),
        _route(fx.OriginateComm, lambda n, e: n.floods.originate_comm(e.verdict, e.stuck)),
        # gossip.py
        _route(fx.Merge, lambda n, e: n.gossip.merged(e.peers, e.spread, e.except_conn, e.relink, n.now)),
        _route(fx.SendTable, lambda n, e: n.gossip.send_table(e.conn_id)),
        _route(
            fx.Sync, lambda n, e: n._with_conn(e.conn_id, lambda c: n.gossip.sync(c, e.peers_hash, e.dead_hash, n.now))
        ),
        # links.py
        _route(fx.Relink, lambda n, e: n.links.relink(n.now)),
        _route(fx.ClimbOn, lambda n, e: n.links.climb_on(n.now)),
        _route(fx.Forget, lambda n, e: n.links.forget(e.key)),
        _route(fx.Attach, lambda n, e: n._with_conn(e.conn_id, lambda c: n.links.attach(c, n.now))),
        _route(fx.Vouch, lambda n, e: n.links.vouch(e.key, e.stamp, n.now)),
        _route(fx.Answered, lambda n, e: n.links.answered(e.key, n.now)),
        _route(fx.LastCall, lambda n, e: n.links.last_call(e.key, n.now)),
        # gather.py
        _route(fx.StartGather, lambda n, e: n.gathering.start(e.query_id, n.now, e.timeout, e.ask)),
        _route(fx.Purge, lambda n, e: n.gathering.purge(e.conn_id, n.now)),
        _route(fx.GatherFinished, lambda n, e: n._gather_finished(e)),
        # sweeper.py
        _route(fx.HoldStuck, lambda n, e: n.sweeper.hold(e.verdict, n.now)),
        _route(fx.ReleaseStuck, lambda n, e: n.sweeper.release(e.comm_hash, n.now, e.why)),
        # suspicion.py
        _route(fx.Silent, lambda n, e: n.suspicion.silent(e.key, n.now)),
        _route(fx.Suspect, lambda n, e: n.suspicion.on_suspect(e.conn_id, e.msg, e.subject, n.now)),
        _route(fx.Heard, lambda n, e: n.suspicion.refuted(e.subject, n.now)),
        _route(fx.Measure, lambda n, e: n.suspicion.measure(n.now)),
        _route(fx.Decide, lambda n, e: n.suspicion.decide(n.now)),
        # reunion.py
        _route(fx.Measured, lambda n, e: n.reunion.measured(e.side, e.complete, n.now)),
        _route(fx.Judge, lambda n, e: n.reunion.judge(e.conn_id, e.key, e.msg, n.now)),
        _route(fx.SendConnInit, lambda n, e: n.reunion.send_conninit(e.conn_id, n.now)),
        _route(fx.ProbeAnswered, lambda n, e: n.reunion.answered()),
        _route(fx.ProbeMet, lambda n, e: n.reunion.met(e.conn_id)),
        _route(fx.MeasureAgain, lambda n, e: n.reunion.measure(n.now, again=e.addr)),
        _route(fx.Outnumbered, lambda n, e: n.reunion.lost(e.winner, n.now)),
        _route(fx.Outvoted, lambda n, e: n.reunion.outvoted(e.conn_id, e.msg, e.winner, n.now)),
    ]
)

#: What a READY connection may carry, and which rooms take it, in order.
READY: dict[type, tuple[Callable[[Node, Conn, Any, float], Effects], ...]] = {
    wire.Keepalive: (
        lambda n, c, m, t: n.links.on_keepalive(c, m, t),
        lambda n, c, m, t: n.gossip.on_keepalive(c, m, t),
    ),
    wire.PeersUpdate: (lambda n, c, m, t: n.gossip.on_peers_update(c, m, t),),
    wire.Flood: (lambda n, c, m, t: n.floods.on_flood(c, m, t),),
    wire.CollReq: (lambda n, c, m, t: n.gathering.on_collreq(c, m, t),),
    wire.CollResp: (lambda n, c, m, t: n.gathering.on_collresp(c, m, t),),
    wire.CommVerdict: (lambda n, c, m, t: n.floods.on_comm_verdict(c, m, t),),
}
