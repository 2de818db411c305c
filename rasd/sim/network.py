"""A deterministic simulator: many ``rasd.core.Node``s on a virtual network and a virtual clock.

It drives exactly the state machine the asyncio runtime drives, with the network modelled as TCP behaves:

* a connection delivers bytes in order, after a latency drawn from a range;
* *loss* is what TCP makes of it: a lost segment is retransmitted, so the message arrives late (and everything
  behind it on that connection waits), never out of order or not at all;
* a *partition* holds every byte between the two sides until it heals; connects across it time out;
* a *killed* node's sockets are closed by its kernel: peers see EOF, connects are refused;
* a *paused* node (SIGSTOP) keeps its sockets: the kernel accepts connections and buffers data, and the node
  handles all of it, in order, when it resumes;
* a *restarted* node is a new process (new pid, newer incarnation) listening on a dead node's address, as a process
  restarted on its predecessor's port is.

Everything random comes from one ``random.Random(seed)``, so a run is reproducible from its seed. Each hop may be
charged a processing time (``hop_cost``), and with it a time per byte received (``byte_cost``: what copying a large
gather reply costs, as a STACKS gather's kilobytes per process), so that gather latencies can be estimated at scales
no machine could run for real.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from rasd.core import node as core, wire
from rasd.core.comms import ProcessData
from rasd.core.config import Timers
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo, PeerKey, PeerTable, new_incarnation

from .store import StoreModel

SECRET = b"simulated job secret"
#: The wall clock at virtual time 0, for incarnations (which order the processes at one address by start time).
EPOCH = 1_800_000_000.0


@dataclass
class SimNode:
    index: int
    node: core.Node
    alive: bool = True
    paused: bool = False
    backlog: list[Callable[[], None]] = field(default_factory=list)
    events: list[tuple[float, Event]] = field(default_factory=list)
    busy_until: float = 0.0  # with a hop cost: when this node's (single) thread is free again


@dataclass
class _Pipe:
    """One direction of a connection."""

    src: int
    src_conn: int
    dst: int
    dst_conn: int
    ready_at: float = 0.0  # in-order delivery: nothing on this pipe arrives before this time
    open: bool = True
    held: list[bytes] = field(default_factory=list)  # bytes stopped by a partition
    bytes_sent: int = 0


class Simulation:
    def __init__(
        self,
        n: int,
        seed: int = 0,
        timers: Timers = Timers(),
        procs_per_host: int = 8,
        latency: tuple[float, float] = (0.0001, 0.0005),
        loss: float = 0.0,
        retransmit: float = 0.2,
        hop_cost: float = 0.0,
        byte_cost: float = 0.0,
        local_data: Callable[[int], ProcessData] | None = None,
        express_links: bool = True,
        record: frozenset[Kind] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        # The nodes share this process, and with it the wire's caches of decoded entries: room for a whole table.
        wire.PEER_CACHE_MAX = max(wire.PEER_CACHE_MAX, 1 << 18)
        self.record = record  # the event kinds to keep (None: all); thousands of nodes emit N² PEER_NEW
        self.now = 0.0
        self.timers = timers
        self.latency = latency
        self.loss = loss
        self.retransmit = retransmit
        self.hop_cost = hop_cost
        # Seconds per byte a node receives, added to ``hop_cost`` for that input (only where ``hop_cost`` is set).
        self.byte_cost = byte_cost
        self._charge = 0.0  # the processing time of the input being handled: its sends leave after it
        # (when, sequence, function, arguments): the sequence number keeps events of one instant in the order they
        # were scheduled, and the function is called with the arguments (no closure per message: the simulator
        # handles millions of them, docs/architecture.md §9).
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self.partitions: list[tuple[frozenset[int], frozenset[int]]] = []
        self._pipes: dict[tuple[int, int], _Pipe] = {}  # (node, conn id) -> the pipe *from* that end
        self._next_accept_id = -1
        self.messages_sent = 0
        self.bytes_sent = 0
        self.gathers_done: dict[tuple[int, int], tuple[float, core.GatherDone]] = {}
        self.nodes: list[SimNode] = []
        self.addr_index: dict[Addr, int] = {}  # the node that listens on an address now
        self._local_data = local_data
        self._express_links = express_links
        for i in range(n):
            host = f"10.{(i // procs_per_host) // 256 % 256}.{(i // procs_per_host) % 256}.1"
            info = PeerInfo(
                addr=Addr(host, 20000 + i % procs_per_host),
                pid=1000 + i,
                hostname=f"host{i // procs_per_host}",
                incarnation=new_incarnation(EPOCH, self.rng),
                rank=i,
            )
            self._add_node(info)

    def _add_node(self, info: PeerInfo) -> SimNode:
        i = len(self.nodes)
        data = (lambda i=i: self._local_data(i)) if self._local_data else ProcessData
        node = core.Node(
            info,
            SECRET,
            self.timers,
            rng=random.Random(self.rng.getrandbits(64)),
            local_data=data,
            express_links=self._express_links,
        )
        s = SimNode(i, node)
        self.nodes.append(s)
        self.addr_index[info.addr] = i
        return s

    # ------------------------------------------------------------------------------------------------------------
    # Set-up and faults

    def start(self, bootstrap: str = "full") -> None:
        """Start every node. ``full``: each learns the whole table at once (as from a communicator's all-gather);
        ``quiet``: the same, adopting one shared table without a PEER_NEW event per peer (for thousands of nodes);
        ``seed``: each learns only one earlier node (as from the bootstrap store) and gossip does the rest."""
        infos = [s.node.me for s in self.nodes]
        shared = PeerTable()
        if bootstrap == "quiet":
            shared.merge(infos)
        for s in self.nodes:
            phase = self.rng.uniform(0, self.timers.tick)
            self._start_node(s, bootstrap, infos, shared)
            self._at(self.now + phase, self._tick, s)

    def _start_node(self, s: SimNode, bootstrap: str, infos: list[PeerInfo], shared: PeerTable) -> None:
        """One node of ``start``: its inputs read the clock when they run (a paused node runs them later)."""
        self._run(s, lambda: s.node.start(self.now))
        if bootstrap == "quiet":
            self._run(s, lambda: s.node.adopt_table(shared.copy(), self.now))
        else:
            peers = infos if bootstrap == "full" else [infos[(s.index + 1) // 2 - 1]] if s.index else []
            self._run(s, lambda: s.node.add_peers(peers, self.now, introduce=bootstrap == "seed"))

    def start_through(self, store: StoreModel, window: float = 0.0) -> None:
        """Start every node as a real job does, through the bootstrap store (``store.py``): each process starts at a
        moment drawn in ``[0, window)`` (0: all at once), its node ticks and accepts connections from then on, and
        its six store operations queue at the one server, one after the other as ``rasd/net/bootstrap.py`` sends
        them; once both seed records are read, the node connects to them (``introduce``) and gossip brings it the
        rest of the table."""
        members: dict[int, SimNode] = {}  # join index -> node

        def call(then: Callable[[], None]) -> float:
            """One operation sent now: ``then`` runs when its answer is back; returns when the server handled it."""
            done = store.serve(self.now)
            self._at(done + store.rtt / 2, then)
            return done

        def secret(s: SimNode) -> None:
            call(lambda: join(s))  # compare_set(secret): every process gets the first offer back

        def join(s: SimNode) -> None:
            store.joined += 1  # add(joined): the server answers in the order it serves
            index = store.joined
            members[index] = s
            call(lambda: publish(s, index))

        def publish(s: SimNode, index: int) -> None:
            stored = call(lambda: wait(s, index))  # set(peer/index)
            self._at(stored, store.record_set, index, stored)

        def wait(s: SimNode, index: int) -> None:
            seeds = sorted({index // 2, index - 1} - {0, index})
            registered = store.serve(self.now)  # wait(peer/seeds): answered once both are set
            missing = {i for i in seeds if i not in store.set_at}

            def answered(at: float) -> None:
                self._at(max(at, registered) + store.rtt / 2, read, s, seeds, 0)

            if not missing:
                answered(registered)
                return
            for i in missing:

                def woken(at: float, i: int = i) -> None:
                    missing.discard(i)
                    if not missing:
                        answered(at)

                store.waiting.setdefault(i, []).append(woken)

        def read(s: SimNode, seeds: list[int], done: int) -> None:
            if done < len(seeds):
                call(lambda: read(s, seeds, done + 1))  # get(peer/seed)
                return
            infos = [members[i].node.me for i in seeds]
            self._run(s, lambda: s.node.add_peers(infos, self.now, introduce=True))

        for s in self.nodes:
            self._at(self.now + (self.rng.uniform(0, window) if window else 0.0), self._start_joining, s, secret)

    def _start_joining(self, s: SimNode, then: Callable[[SimNode], None]) -> None:
        """A process of ``start_through`` starts: its node runs and ticks, then it turns to the store."""
        self._run(s, lambda: s.node.start(self.now))
        self._at(self.now + self.rng.uniform(0, self.timers.tick), self._tick, s)
        then(s)

    def kill(self, i: int) -> None:
        s = self.nodes[i]
        s.alive = False
        s.backlog.clear()
        for (n, _), pipe in list(self._pipes.items()):
            if n == i and pipe.open:
                self._close_pipe(pipe)

    def restart(self, i: int, seed: int | None = None) -> int:
        """Start a new process on node ``i``'s address, as a process restarted on its dead predecessor's port: a
        new pid, the same rank, a newer incarnation. Node ``i`` must be dead (killed or left). The newcomer joins as
        from the bootstrap store: it knows node ``seed`` (default: the first live node) and introduces itself.
        Returns the new node's index."""
        old = self.nodes[i]
        if old.alive:
            raise ValueError(f"node {i} still holds its address")
        me = old.node.me
        known = seed if seed is not None else next(s.index for s in self.nodes if s.alive)
        info = PeerInfo(
            addr=me.addr,
            pid=me.pid + 100_000,
            hostname=me.hostname,
            devices=me.devices,
            rank=me.rank,
            incarnation=new_incarnation(EPOCH + self.now, self.rng),
        )
        s = self._add_node(info)
        seeds = [self.nodes[known].node.me]
        self._run(s, lambda: s.node.start(self.now))
        self._run(s, lambda: s.node.add_peers(seeds, self.now, introduce=True))
        self._at(self.now + self.rng.uniform(0, self.timers.tick), lambda: self._tick(s))
        return s.index

    def pause(self, i: int) -> None:
        self.nodes[i].paused = True

    def resume(self, i: int) -> None:
        s = self.nodes[i]
        s.paused = False
        backlog, s.backlog = s.backlog, []
        for fn in backlog:
            if s.alive:
                fn()

    def leave(self, i: int) -> None:
        s = self.nodes[i]
        self._run(s, lambda: s.node.leave(self.now))
        s.alive = False

    def partition(self, a: set[int], b: set[int]) -> tuple[frozenset[int], frozenset[int]]:
        p = (frozenset(a), frozenset(b))
        self.partitions.append(p)
        return p

    def heal(self, p: tuple[frozenset[int], frozenset[int]]) -> None:
        self.partitions.remove(p)
        for pipe in self._pipes.values():
            if pipe.held and not self._cut(pipe.src, pipe.dst):
                held, pipe.held = pipe.held, []
                for data in held:
                    self._deliver(pipe, data)

    def gather(self, i: int, query_id: int, timeout: float | None = None, ask: wire.Ask = wire.Ask.STATUS) -> None:
        """Start a gather of ``ask`` at node ``i``; it ends in ``gathers_done[(i, query_id)]``. The answers to an
        ask other than STATUS come from the providers in each node's ``node.answers`` (none by default: empty)."""
        s = self.nodes[i]
        self._run(s, lambda: s.node.start_gather(query_id, self.now, timeout, ask))

    # ------------------------------------------------------------------------------------------------------------
    # Running

    def run_until(self, t: float) -> None:
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= t:
            when, _, fn, args = pop(heap)
            self.now = when
            fn(*args)
        self.now = t

    def run_while(self, condition: Callable[[], bool], limit: float, step: float = 0.05) -> bool:
        """Run until ``condition()`` is false or ``limit`` virtual seconds pass; return whether it became false."""
        end = self.now + limit
        while self.now < end:
            if not condition():
                return True
            self.run_until(min(end, self.now + step))
        return not condition()

    # ------------------------------------------------------------------------------------------------------------
    # Queries

    def events(self, kind: Kind) -> list[tuple[int, float, Event]]:
        return [(s.index, t, e) for s in self.nodes for t, e in s.events if e.kind is kind]

    def live(self) -> list[SimNode]:
        return [s for s in self.nodes if s.alive]

    def addr(self, i: int) -> Addr:
        return self.nodes[i].node.me.addr

    def key(self, i: int) -> PeerKey:
        """Node ``i``'s process: its address and incarnation (what dead and departed lists hold)."""
        return self.nodes[i].node.me.key

    # ------------------------------------------------------------------------------------------------------------
    # Internals

    def _at(self, when: float, fn: Callable[..., None], *args: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, fn, args))

    def _tick(self, s: SimNode) -> None:
        """``_run`` of a tick, with the common case (a running node) taken without a closure, as in ``_receive``."""
        if not s.alive:
            return
        if s.paused or self.hop_cost:
            self._run(s, lambda: s.node.tick(self.now))
        else:
            for a in s.node.tick(self.now):
                self._act(s, a)
        self._at(self.now + self.timers.tick, self._tick, s)

    def _run(self, s: SimNode, step: Callable[[], list[core.Action]], cost: float | None = None) -> None:
        """Feed one input to a node (queued while it is paused) and carry out its actions. ``cost``: the input's
        processing time (default ``hop_cost``)."""
        if not s.alive:
            return
        if s.paused:
            s.backlog.append(lambda: self._run(s, step, cost))
            return
        if self.hop_cost and s.busy_until > self.now:
            self._at(s.busy_until, lambda: self._run(s, step, cost))
            return
        actions = step()
        charge = self._charge = self.hop_cost if cost is None else cost
        if charge:
            s.busy_until = self.now + charge
        for a in actions:
            self._act(s, a)

    def _receive(self, s: SimNode, conn_id: int, data: bytes) -> None:
        """Bytes arrive at node ``s``: ``_run`` with the common case (a running node) taken without a closure."""
        if not s.alive:
            return
        if s.paused or self.hop_cost:
            cost = self.hop_cost + self.byte_cost * len(data) if self.hop_cost else None
            self._run(s, lambda: s.node.received(conn_id, data, self.now), cost)
            return
        for a in s.node.received(conn_id, data, self.now):
            self._act(s, a)

    def _act(self, s: SimNode, a: core.Action) -> None:
        # The action types are disjoint: tested in the order of their frequency (sends, then events).
        if isinstance(a, core.Send):
            pipe = self._pipes.get((s.index, a.conn_id))
            if pipe is not None and pipe.open:
                self.messages_sent += 1
                self.bytes_sent += len(a.data)
                pipe.bytes_sent += len(a.data)
                if self.partitions and self._cut(pipe.src, pipe.dst):
                    pipe.held.append(a.data)
                else:
                    self._deliver(pipe, a.data, self._charge)
        elif isinstance(a, core.Emit):
            if self.record is None or a.event.kind in self.record:
                s.events.append((self.now, a.event))
        elif isinstance(a, core.Connect):
            self._connect(s, a)
        elif isinstance(a, core.Close):
            pipe = self._pipes.get((s.index, a.conn_id))
            if pipe is not None:
                self._close_pipe(pipe)
        elif isinstance(a, core.ProbePid):
            j = self.addr_index.get(a.addr)
            if j is not None and (not self.nodes[j].alive or self.nodes[j].node.me.pid != a.pid):
                self._at(self.now, lambda: self._run(s, lambda: s.node.pid_gone(a.addr, self.now)))
        elif isinstance(a, core.GatherDone):
            self.gathers_done[(s.index, a.query_id)] = (self.now, a)
        else:  # an action this driver does not know: a wiring mistake, never dropped in silence
            raise TypeError(f"the driver has no handler for the action {type(a).__name__}")

    def _cut(self, a: int, b: int) -> bool:
        return any((a in x and b in y) or (a in y and b in x) for x, y in self.partitions)

    def _lat(self) -> float:
        rng = self.rng
        low, high = self.latency
        lat = low + (high - low) * rng.random()  # what ``rng.uniform(low, high)`` computes, from the same draw
        if self.loss:
            while rng.random() < self.loss:
                lat += self.retransmit
        return lat

    def _deliver(self, pipe: _Pipe, data: bytes, extra: float = 0.0) -> None:
        when = max(self.now + extra + self._lat(), pipe.ready_at)
        pipe.ready_at = when
        dst = self.nodes[pipe.dst]
        # Bytes already sent arrive even if the sender closed since (TCP delivers data before the FIN); a node
        # ignores bytes for a connection it closed itself.
        self._at(when, self._receive, dst, pipe.dst_conn, data)

    def _connect(self, s: SimNode, a: core.Connect) -> None:
        j = self.addr_index.get(a.addr)
        lat = self._lat()
        if j is None or not self.nodes[j].alive:
            self._at(self.now + lat, lambda: self._run(s, lambda: s.node.connect_failed(a.conn_id, self.now, True)))
            return
        if self._cut(s.index, j):
            # The SYN goes nowhere; the runtime gives up on a connect after the handshake time.
            self._at(
                self.now + self.timers.handshake,
                lambda: self._run(s, lambda: s.node.connect_failed(a.conn_id, self.now, False)),
            )
            return
        remote_id = self._next_accept_id
        self._next_accept_id -= 1
        out = _Pipe(s.index, a.conn_id, j, remote_id, ready_at=self.now + lat)
        back = _Pipe(j, remote_id, s.index, a.conn_id, ready_at=self.now + lat)
        self._pipes[(s.index, a.conn_id)] = out
        self._pipes[(j, remote_id)] = back
        dst = self.nodes[j]
        # The kernel completes the TCP handshake even for a paused process; the node sees the accept later.
        self._at(self.now + lat, lambda: self._run(dst, lambda: dst.node.accepted(remote_id, self.now)))
        self._at(self.now + lat, lambda: self._run(s, lambda: s.node.connected(a.conn_id, self.now)))

    def _close_pipe(self, pipe: _Pipe) -> None:
        """Close both directions; the other end sees EOF after what was already in flight."""
        if not pipe.open:
            return
        pipe.open = False
        back = self._pipes.pop((pipe.dst, pipe.dst_conn), None)
        self._pipes.pop((pipe.src, pipe.src_conn), None)
        dst = self.nodes[pipe.dst]
        when = max(self.now + self._lat(), pipe.ready_at)
        if back is not None:
            back.open = False
        if self._cut(pipe.src, pipe.dst):
            return  # the FIN is lost in the partition; the other end finds out by its own timers
        self._at(when, lambda: self._run(dst, lambda: dst.node.closed(pipe.dst_conn, self.now)))
