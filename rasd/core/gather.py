"""Gathers: a status query floods a request over the mesh and folds the replies back up the tree it made.

Belongs here: the gathers in progress (``Gather``), their ids, the memory of finished ones, which connections a
gather may use, answering duplicates, counting leg timeouts (a leg that closes or goes silent, the collective
timeout, the hard limit) and, at the root, turning what was gathered into a ``JobSnapshot``. NCCL's scheme
(docs/architecture.md section 4): duplicates answered empty, a quiet leg counted as a timeout, a hard limit of
timeout + ``gather_extra``. A gather asks for one thing (``wire.Ask``): STATUS, and the sweeper's SWEEP, collect
each process's ``ProcessData`` (a sweep's with its position); any other ask collects one opaque answer per process,
from the provider that process registered (``World.answer``), and only the root reads them
(``JobSnapshot.answers``). A gather rooted here ends in a ``GatherFinished``, which the node routes: the sweeper's
to ``sweeper.py``, a reachability gather's to ``suspicion.py``, a client's to its driver as a ``GatherDone``. A
relay keeps the entries it passes on encoded (``wire.CollResp``): only the root decodes them. An answer has a part
that processes share and a part of its own (``wire.Answer``); a relay passes each distinct shared part once
(``wire.Answers``), so the stacks of thousands of processes in one all-reduce travel up as one stack.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import wire
from .comms import ProcessData
from .connections import Conn, ConnState
from .effects import Effects, GatherFinished, Say, SayFrame
from .fold import Members, RankState, States, fold_into, raised_column
from .peers import Addr
from .recent import Recent
from .snapshot import JobSnapshot

if TYPE_CHECKING:
    from .view import World


#: What a relay passes back at most, in bytes: its answer goes in one frame (``wire.MAX_FRAME``, with room for the
#: header). A leg that would take it past this is counted as a leg timeout, and its processes are missing at the
#: root: STACKS of every thread of many thousands of processes, not a status gather (docs/architecture.md §4).
RELAY_BYTES = wire.MAX_FRAME - 4096

#: The asks whose entries are process data (``ProcessData``); any other's are opaque answers.
PROCESS_DATA = (wire.Ask.STATUS, wire.Ask.SWEEP, wire.Ask.REACH)


@dataclass
class Gather:
    root: Addr
    coll_id: int
    from_conn: int | None  # None at the root
    query_id: int
    started: float
    timeout: float | None
    pending: set[int]
    ask: wire.Ask = wire.Ask.STATUS
    #: At a relay of a STATUS or SWEEP gather: the entries to pass back, folded (``wire.Fold``): its legs' as they
    #: answer, then its own (``own``), merged last so that the first leg's rows are taken over as they came, their
    #: process indices unchanged (``Fold.merge``): along a gather's deep paths most relays have one large leg.
    fold: wire.Fold = field(default_factory=wire.Fold)
    own: wire.Fold = field(default_factory=wire.Fold)
    #: At the root of one: its own entry and each leg's, decoded as they arrive, and the states decoded so far.
    parts: list[wire.Decoded] = field(default_factory=list)
    known: dict[bytes, RankState] = field(default_factory=dict)
    #: At the root of any other gather: every answer, as it arrives.
    answers: list[tuple[Addr, wire.Answer]] = field(default_factory=list)
    #: At a relay of any other gather: the answers to pass back, each shared part once: its legs' as they answer,
    #: then its own (``own_answer``), added last so that the first leg's are taken over as they came.
    answered: wire.Answers = field(default_factory=wire.Answers)
    own_answer: wire.Answer | None = None
    leg_timeouts: int = 0

    @property
    def key(self) -> tuple[Addr, int]:
        return (self.root, self.coll_id)


def responses_of(parts: list[wire.Decoded]) -> tuple[dict[Addr, ProcessData], States]:
    """What a root gathered, one response per address, the members of the states indexing ``responses``: the parts
    (its own entry, then each leg's answer) one after the other. A process that answered twice is taken from its
    first answer (its ranks from the second are left out). The parts' columns are taken over, not copied."""
    addrs: list[Addr] = []
    datas: list[ProcessData] = []
    states: States = {}
    for part_addrs, part_datas, part_states in parts:
        offset = len(addrs)
        addrs += part_addrs
        datas += part_datas
        for state, members in part_states.items():
            procs = raised_column(members.procs, offset)
            mine = states.get(state)
            if mine is None:  # the part's columns, taken over
                states[state] = Members(procs, members.comm_ranks, members.devices, members.idle_ms)
                continue
            for column, more in zip(
                (mine.procs, mine.comm_ranks, mine.devices, mine.idle_ms),
                (procs, members.comm_ranks, members.devices, members.idle_ms),
                strict=True,
            ):
                column.extend(more if more.typecode == column.typecode else iter(more))
    responses: dict[Addr, ProcessData] = {}
    for addr, data in zip(addrs, datas, strict=True):
        responses.setdefault(addr, data)
    if len(responses) == len(addrs):
        return responses, states
    index = {addr: i for i, addr in enumerate(responses)}
    first: dict[Addr, int] = {}
    for proc, addr in enumerate(addrs):
        first.setdefault(addr, proc)
    renamed: States = {}
    for state, members in states.items():
        kept = Members()
        for proc, comm_rank, device, idle_ms in members.rows():
            addr = addrs[proc]
            if first[addr] == proc:
                kept.add(index[addr], comm_rank, device, idle_ms)
        if len(kept):
            renamed[state] = kept
    return responses, renamed


def own_part(addr: Addr, data: ProcessData) -> wire.Decoded:
    """The root's own entry, as a decoded part."""
    states: States = {}
    fold_into(states, 0, data)
    return [addr], [dataclasses.replace(data, comms=()) if data.comms else data], states


class Gathering:
    def __init__(self, world: World) -> None:
        self.world = world
        self.gathers: dict[tuple[Addr, int], Gather] = {}
        self._done: Recent[tuple[Addr, int]] = Recent()
        self._next_id = 1

    def contribution(self, ask: wire.Ask = wire.Ask.STATUS) -> ProcessData:
        """What this process adds to a status gather: its communicators, once it has restarted its restarts,
        whether it waits to be admitted into training, and to a sweep where its main thread is; to a reachability
        gather, nothing (its answer is what counts)."""
        if ask is wire.Ask.REACH:
            return ProcessData()
        world = self.world
        data = world.local_data()
        if world.restart is not None and data.restart is None:
            data = dataclasses.replace(data, restart=world.restart)
        if world.waiting and not data.waiting:
            data = dataclasses.replace(data, waiting=True)
        if ask is wire.Ask.SWEEP:
            data = dataclasses.replace(data, where=world.position(), work=world.work())
        return data

    def _open(self, g: Gather, request: wire.CollReq, now: float) -> Effects:
        """Record ``g`` and forward the request on every connection a gather may use (not back where it came
        from); a gather with nobody to wait on ends at once."""
        self.gathers[g.key] = g
        usable = self._usable(now, except_conn=g.from_conn)
        out: Effects = []
        if usable:
            frame = wire.encode(request)
            for c in usable:
                out.append(SayFrame(c.id, frame))
                g.pending.add(c.id)
        return out + self._maybe_finish(g, now)

    def start(self, query_id: int, now: float, timeout: float | None, ask: wire.Ask = wire.Ask.STATUS) -> Effects:
        """A gather rooted here. ``timeout``: None for the default, ``inf`` for none."""
        world = self.world
        if timeout is None:
            timeout = world.timers.leg_timeout
        coll_id = self._next_id
        self._next_id += 1
        g = Gather(
            root=world.me.addr,
            coll_id=coll_id,
            from_conn=None,
            query_id=query_id,
            started=now,
            timeout=None if timeout == float("inf") else timeout,
            pending=set(),
            ask=ask,
        )
        if ask in PROCESS_DATA:
            g.parts.append(own_part(world.me.addr, self.contribution(ask)))
        else:
            g.answers.append((world.me.addr, world.answer(ask)))
        # The wire carries a u32 of milliseconds (49.7 days): a longer client TIMEOUT is clamped, never raised.
        timeout_ms = 0 if g.timeout is None else max(1, min(int(g.timeout * 1000), 0xFFFFFFFF))
        return self._open(g, wire.CollReq(g.root, g.coll_id, timeout_ms, ask), now)

    def _usable(self, now: float, except_conn: int | None) -> list[Conn]:
        """Connections a gather may use: ready, in use by a link, and not silent."""
        world = self.world
        out = []
        for c in world.ready_conns(except_conn):
            if c.peer is None:
                continue
            in_use = world.has_link(c.peer) or world.peer_wants(c.id)
            if in_use and now - c.last_recv <= world.timers.unresponsive and not world.is_delayed(c.peer):
                out.append(c)
        return out

    def on_collreq(self, conn: Conn, msg: wire.CollReq, now: float) -> Effects:
        key = (msg.root, msg.coll_id)
        if key in self.gathers or key in self._done:
            return [Say(conn.id, wire.CollResp(msg.root, msg.coll_id, 0, 0, b""))]
        g = Gather(
            root=msg.root,
            coll_id=msg.coll_id,
            from_conn=conn.id,
            query_id=0,
            started=now,
            timeout=None if msg.timeout_ms == 0 else msg.timeout_ms / 1000,
            pending=set(),
            ask=msg.ask,
        )
        if msg.ask in PROCESS_DATA:
            g.own.add(self.world.me.addr, self.contribution(msg.ask))
        else:
            g.own_answer = self.world.answer(msg.ask)
        return self._open(g, msg, now)

    def on_collresp(self, conn: Conn, msg: wire.CollResp, now: float) -> Effects:
        g = self.gathers.get((msg.root, msg.coll_id))
        if g is None or conn.id not in g.pending:
            return []
        if g.ask in PROCESS_DATA:
            if msg.count:
                fold = msg.fold  # a ProtocolError drops the leg, here and at the root
                if g.from_conn is None:
                    g.parts.append(fold.decoded(g.known))  # decoded here, at the root, once
                elif g.fold.size + g.own.size + fold.size > RELAY_BYTES:
                    g.leg_timeouts += 1  # more than one frame may carry: this leg's processes go missing at the root
                else:
                    g.fold.merge(fold)  # neither a process nor a state decoded
        elif g.from_conn is None:
            g.answers.extend(msg.answers)  # decoded here, at the root, once (a ProtocolError drops the leg)
        elif msg.count:
            leg = msg.answer_set  # a ProtocolError drops the leg, here and at the root
            own = g.own_answer.size + 24 if g.own_answer is not None else 0  # its shared part, its entry
            if g.answered.size + leg.size + own > RELAY_BYTES:
                g.leg_timeouts += 1  # more than one frame may carry: this leg's processes go missing at the root
            else:
                g.answered.merge(leg)
        g.pending.discard(conn.id)
        g.leg_timeouts += msg.leg_timeouts
        return self._maybe_finish(g, now)

    def _maybe_finish(self, g: Gather, now: float, force: bool = False) -> Effects:
        if g.pending and not force:
            return []
        g.leg_timeouts += len(g.pending)
        g.pending.clear()
        self.gathers.pop(g.key, None)
        self._done.remember(g.key)
        if g.from_conn is None:
            return [GatherFinished(g.query_id, self._snapshot(g, now))]
        back = self.world.conn(g.from_conn)
        if back is not None and back.state is ConnState.READY:
            if g.ask in PROCESS_DATA:
                g.fold.merge(g.own)
                reply = wire.CollResp(g.root, g.coll_id, g.leg_timeouts, g.fold.count, g.fold.encode())
            else:
                if g.own_answer is not None:
                    g.answered.add(self.world.me.addr, g.own_answer)
                reply = wire.CollResp(g.root, g.coll_id, g.leg_timeouts, g.answered.count, g.answered.encode())
            return [Say(back.id, reply)]
        return []

    def _snapshot(self, g: Gather, now: float) -> JobSnapshot:
        """What the root knows when its gather ends."""
        world = self.world
        table = world.table
        responses: dict[Addr, ProcessData] = {}
        states: States = {}
        if g.ask in PROCESS_DATA:
            responses, states = responses_of(g.parts)
        answers: dict[Addr, wire.Answer] = {}
        for addr, answer in g.answers:
            answers.setdefault(addr, answer)
            responses.setdefault(addr, ProcessData())  # it answered: not missing
        dead, left = world.dead, world.left
        former = table.former()
        return JobSnapshot(
            peers=tuple(table),
            ordered=True,  # a table iterates in address order
            dead=frozenset(k.addr for k in dead if table.is_current(k)),
            left=frozenset(k.addr for k in left if table.is_current(k)),
            former_dead=tuple(p for p in former if p.key in dead),
            former_left=tuple(p for p in former if p.key in left and p.key not in dead),
            responses=responses,
            states=states,
            timeouts=g.leg_timeouts,
            collection_time=now - g.started,
            stuck=world.standing_stuck(),
            in_flight_grace=world.timers.in_flight,
            ask=g.ask,
            answers=answers,
        )

    def purge(self, conn_id: int, now: float) -> Effects:
        """A connection went silent or away: count it as a leg timeout wherever a gather waits on it."""
        out: Effects = []
        for key, g in list(self.gathers.items()):
            if g.from_conn == conn_id:
                del self.gathers[key]  # nobody left to answer to
                self._done.remember(key)
            elif conn_id in g.pending:
                g.pending.discard(conn_id)
                g.leg_timeouts += 1
                out += self._maybe_finish(g, now)
        return out

    def finish_all(self, now: float) -> Effects:
        """This node was expelled: its own gathers end at once with what they have; the others are dropped."""
        out: Effects = []
        for g in list(self.gathers.values()):
            if g.from_conn is None:
                out += self._maybe_finish(g, now, force=True)
        self.gathers.clear()
        return out

    def tick(self, now: float) -> Effects:
        world = self.world
        out: Effects = []
        for g in list(self.gathers.values()):
            # A leg whose connection has gone silent is answered by nobody: count it now (NCCL purges a delayed
            # connection from its collectives), whether or not the connection is one of our links.
            for cid in list(g.pending):
                c = world.conn(cid)
                if c is not None and c.state is ConnState.READY and now - c.last_recv > world.timers.unresponsive:
                    out += self.purge(cid, now)
            if g.timeout is None or g.key not in self.gathers:
                continue
            if now >= g.started + g.timeout + world.timers.gather_extra:
                out += self._maybe_finish(g, now, force=True)
            elif now >= g.started + g.timeout:
                for cid in list(g.pending):
                    c = world.conn(cid)
                    if c is None or c.state is not ConnState.READY or (c.peer is not None and world.is_delayed(c.peer)):
                        g.pending.discard(cid)
                        g.leg_timeouts += 1
                out += self._maybe_finish(g, now)
        return out
