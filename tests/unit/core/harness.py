"""A tiny in-test driver for a few ``rasd.core.node.Node``s: no sockets, no threads, no sleeps.

Every action a node returns is carried out by hand: a ``Send`` becomes a ``received`` on the other end of that
connection, a ``Connect`` an ``accepted`` on the target and a ``connected`` on the connector, a ``Close`` a
``closed`` on the other end. Inputs wait in one queue per connection end (so each connection stays in order, as
TCP keeps it) and ``run`` delivers them until nothing is left, all at the current (fake) time. With an ``rng`` the
next end to serve is drawn at random, which interleaves connections in every order a real network could.

A node can be *killed* (its kernel closes its sockets: the other ends see EOF, connects to it are refused) or
*paused* (SIGSTOP: its inputs pile up and are handled, in order, when it resumes).
"""

from __future__ import annotations

import collections
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from rasd.core import node as core, wire
from rasd.core.config import Timers
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo

SECRET = b"unit test job secret"


def peer(i: int, host: str = "10.0.0.1", hostname: str | None = None) -> PeerInfo:
    return PeerInfo(
        addr=Addr(host, 30000 + i), pid=100 + i, hostname=hostname or f"h-{host}", incarnation=7000 + i, rank=i
    )


@dataclass
class Member:
    name: str
    node: core.Node
    events: list[Event] = field(default_factory=list)
    sent: list[tuple[int, wire.Message]] = field(default_factory=list)  # every message it sent, decoded
    actions: list[core.Action] = field(default_factory=list)
    killed: bool = False
    paused: bool = False
    backlog: list[Callable[[], list[core.Action]]] = field(default_factory=list)

    def kinds(self, *kinds: Kind) -> list[Event]:
        return [e for e in self.events if not kinds or e.kind in kinds]

    def ready_conns(self, to: Addr) -> list[core.Conn]:
        return [c for c in self.node.conns.values() if c.peer == to and c.state is core.ConnState.READY]


class Harness:
    def __init__(self, rng: random.Random | None = None) -> None:
        self.now = 0.0
        self.rng = rng
        self.members: dict[str, Member] = {}
        self.by_addr: dict[Addr, str] = {}
        self.ends: dict[tuple[str, int], tuple[str, int]] = {}  # connection end -> the other end
        self.queues: collections.OrderedDict[tuple[str, int], collections.deque] = collections.OrderedDict()
        self._next_accept = -1

    # ------------------------------------------------------------------------------------------------------------

    def add(self, name: str, info: PeerInfo, timers: Timers = Timers(), secret: bytes = SECRET, **kw) -> Member:
        n = core.Node(info, secret, timers, rng=random.Random(zlib.crc32(name.encode())), **kw)
        m = Member(name, n)
        self.members[name] = m
        self.by_addr[info.addr] = name
        self._act(m, n.start(self.now))
        return m

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def call(self, name: str, fn: Callable[[], list[core.Action]]) -> None:
        """Feed one input to a node now (or queue it while the node is paused) and carry out its actions."""
        m = self.members[name]
        if m.killed:
            return
        if m.paused:
            m.backlog.append(fn)
            return
        self._act(m, fn())

    def introduce(self, names: list[str] | None = None, peers: list[PeerInfo] | None = None) -> None:
        """Every member learns the whole list (as from a communicator's all-gather)."""
        names = names or list(self.members)
        infos = peers or [self.members[n].node.me for n in names]
        for n in names:
            self.call(n, lambda n=n: self.members[n].node.add_peers(infos, self.now))
        self.run()

    def tick(self, t: float, names: list[str] | None = None) -> None:
        self.now = t
        for n in names or list(self.members):
            m = self.members[n]
            if not m.killed and not m.paused:
                self.call(n, lambda m=m: m.node.tick(self.now))
        self.run()

    def advance(self, until: float, step: float, names: list[str] | None = None) -> None:
        """Tick every ``step`` seconds up to and including ``until``."""
        t = self.now
        while t + step < until - 1e-12:
            t += step
            self.tick(t, names)
        self.tick(until, names)

    def kill(self, name: str) -> None:
        m = self.members[name]
        m.killed = True
        m.backlog.clear()
        for owner, cid in list(self.ends):
            if owner == name:
                self._close_end((owner, cid))

    def pause(self, name: str) -> None:
        self.members[name].paused = True

    def resume(self, name: str) -> None:
        """SIGCONT: the node's timer fires first (it notices the gap), then it reads what piled up."""
        m = self.members[name]
        m.paused = False
        self.call(name, lambda: m.node.tick(self.now))
        backlog, m.backlog = m.backlog, []
        for fn in backlog:
            self.call(name, fn)
        self.run()

    def cut(self, a: str, b: str) -> None:
        """The network resets every connection between ``a`` and ``b``: both ends see the close at once."""
        for (owner, cid), (other, ocid) in list(self.ends.items()):
            if owner == a and other == b:
                del self.ends[(owner, cid)]
                del self.ends[(other, ocid)]
                self._queue((a, cid), lambda a=a, cid=cid: self.members[a].node.closed(cid, self.now))
                self._queue((b, ocid), lambda b=b, ocid=ocid: self.members[b].node.closed(ocid, self.now))

    def run(self, limit: int = 100_000) -> None:
        for _ in range(limit):
            ready = [k for k, q in self.queues.items() if q]
            if not ready:
                return
            key = self.rng.choice(ready) if self.rng else ready[0]
            fn = self.queues[key].popleft()
            self.call(key[0], fn)
        raise AssertionError("the nodes kept talking for 100,000 steps at one instant")

    # ------------------------------------------------------------------------------------------------------------

    def _queue(self, end: tuple[str, int], fn: Callable[[], list[core.Action]]) -> None:
        self.queues.setdefault(end, collections.deque()).append(fn)

    def _close_end(self, end: tuple[str, int]) -> None:
        other = self.ends.pop(end, None)
        if other is None:
            return
        self.ends.pop(other, None)
        name, cid = other
        self._queue(other, lambda: self.members[name].node.closed(cid, self.now))

    def _act(self, m: Member, actions: list[core.Action]) -> None:
        for a in actions:
            m.actions.append(a)
            if isinstance(a, core.Send):
                m.sent.append((a.conn_id, wire.decode_body(a.data[4:])))
                other = self.ends.get((m.name, a.conn_id))
                if other is not None:
                    name, cid = other
                    self._queue(
                        other,
                        lambda name=name, cid=cid, data=a.data: self.members[name].node.received(cid, data, self.now),
                    )
            elif isinstance(a, core.Connect):
                target = self.by_addr.get(a.addr)
                if target is None or self.members[target].killed:
                    self._queue(
                        (m.name, a.conn_id),
                        lambda m=m, cid=a.conn_id: m.node.connect_failed(cid, self.now, refused=True),
                    )
                    continue
                rid = self._next_accept
                self._next_accept -= 1
                self.ends[(m.name, a.conn_id)] = (target, rid)
                self.ends[(target, rid)] = (m.name, a.conn_id)
                t = self.members[target]
                self._queue((target, rid), lambda t=t, rid=rid: t.node.accepted(rid, self.now))
                self._queue((m.name, a.conn_id), lambda m=m, cid=a.conn_id: m.node.connected(cid, self.now))
            elif isinstance(a, core.Close):
                self._close_end((m.name, a.conn_id))
            elif isinstance(a, core.Emit):
                m.events.append(a.event)
