"""The stuck sweeper: one node gathers every process's counters every sweep and floods COMM_STUCK verdicts.

Belongs here: who sweeps (the live process with the lowest address that this node does not know to be silent),
when (every ``Timers.sweep``, longer in jobs of more than ``SWEEP_FLAT`` processes), what it does with the
snapshot (``stuck.StuckDetector``), and the communicator verdicts every node holds with when each was last
confirmed. The sweeper re-floods standing verdicts every sweep; a node drops a verdict nobody confirms for
``3 × interval + leg_timeout + gather_extra``, and the sweeper floods a clear as soon as the counters move or agree
again (docs/architecture.md section 4). Deciding *whether* a communicator is stuck, and whom to blame, is
``stuck.py``; the gather itself is ``gather.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import wire
from .actions import Emit
from .effects import SWEEP_QUERY, Effects, OriginateComm, StartGather
from .events import Event, Kind
from .frames import Position
from .peers import Addr, PeerInfo
from .snapshot import JobSnapshot
from .stuck import StuckDetector, StuckVerdict

if TYPE_CHECKING:
    from .view import World


#: Up to this many processes the sweeper sweeps every ``Timers.sweep``; beyond, the interval grows in proportion
#: to the job, so that the sweeping root's CPU per second stays what it is at this size: its root decodes every
#: process's answer, 0.06 s per sweep at 16,384 processes and about 0.6 s at 100,000 (bench/report_cost.py's
#: ``sweep``; docs/architecture.md §11), 12 % of a core every 5 s, taken from the training thread it shares the GIL
#: with. At 100,000 processes: a sweep every 30.5 s.
SWEEP_FLAT = 16_384
#: A sweep brought forward to when a verdict falls due (``StuckDetector.due``) comes at least this share of the
#: sweep interval after the last one (0.25 s at the default 5 s): a due time is exact (the ranks send how long
#: they have been idle), so a verdict lands within a tick of its limit, and a communicator judged again and again
#: can never make the root sweep more than a few times a second (a silent rank's communicator is not due at all).
DUE_SWEEP_FLOOR = 0.05


class Sweeper:
    def __init__(self, world: World) -> None:
        self.world = world
        t = world.timers
        self.detector = StuckDetector(t.stuck, t.stuck_max, t.busy)
        #: Every communicator verdict this node holds, by communicator hash, with when it was last confirmed.
        self.stuck: dict[int, tuple[StuckVerdict, float]] = {}
        self._next_sweep = 0.0
        self._sweeping = False
        #: Where each process's main thread was in the last sweep it answered (frames.py), with that sweep's time:
        #: the last position known here of a process that stops answering (a PEER_HUNG names it).
        self.positions: dict[Addr, tuple[Position, float]] = {}

    def start(self, now: float) -> None:
        self._next_sweep = now + self.interval()

    def interval(self) -> float:
        """Seconds between sweeps: ``Timers.sweep``, stretched in proportion to the job beyond ``SWEEP_FLAT``
        processes. Every node reads it from its own table, so the sweeper and the nodes that expire its verdicts
        agree (their tables agree but while processes join or leave)."""
        return self.world.timers.sweep * max(1.0, len(self.world.table) / SWEEP_FLAT)

    def is_sweeper(self) -> bool:
        """The lowest-address live peer that this node does not know to be silent sweeps the job."""
        world = self.world
        for p in world.table:
            if p.addr == world.me.addr:
                return True
            if world.is_gone(p.key) or world.is_hung(p.key) or world.is_delayed(p.addr):
                continue
            return False
        return False

    def tick(self, now: float) -> Effects:
        world = self.world
        if self._sweeping or now < self._next_sweep or not self.is_sweeper():
            return []
        self._next_sweep = now + self.interval()
        if not world.local_data().comms:
            return []  # a sweeper that holds no communicator has none to watch (every rank holds the world group)
        self._sweeping = True
        return [StartGather(SWEEP_QUERY, ask=wire.Ask.SWEEP)]

    def swept(self, snapshot: JobSnapshot, now: float) -> Effects:
        """Our sweep's gather ended (``snapshot``): new verdicts, refreshes of standing ones, and clears."""
        world = self.world
        self._sweeping = False
        if world.expelled:
            return []
        out: Effects = []
        for addr, data in snapshot.responses.items():
            if data.where:
                self.positions[addr] = (data.where, now)
        _, cleared = self.detector.observe(snapshot, now)
        due = self.detector.due()
        if due is not None:  # a verdict falls due before the next sweep: sweep then, not up to a sweep later
            self._next_sweep = min(self._next_sweep, max(due, now + DUE_SWEEP_FLOOR * self.interval()))
        for v in cleared:
            out += self.release(v.comm_hash, now, "counters moving again")
            out.append(OriginateComm(v, stuck=False))
        for v in self.detector.active():  # new ones, and a refresh of those that stand
            out += self.hold(v, now)
            out.append(OriginateComm(v, stuck=True))
        return out

    def hold(self, v: StuckVerdict, now: float) -> Effects:
        """Hold ``v``, confirmed now: an event when it is new, or when a SLOW one became COMM_STUCK."""
        out: Effects = []
        held = self.stuck.get(v.comm_hash)
        if held is None or (held[0].slow and not v.slow):
            out.append(
                Emit(
                    Event(
                        kind=Kind.COMM_SLOW if v.slow else Kind.COMM_STUCK,
                        at=now,
                        details=v.describe(),
                        comm_hash=v.comm_hash,
                        ranks=v.global_ranks,
                        positions=v.positions,
                    )
                )
            )
        self.stuck[v.comm_hash] = (v, now)
        return out

    def release(self, comm_hash: int, now: float, why: str) -> Effects:
        held = self.stuck.pop(comm_hash, None)
        if held is None:
            return []
        return [
            Emit(Event(kind=Kind.COMM_RECOVERED, at=now, details=why, comm_hash=comm_hash, ranks=held[0].global_ranks))
        ]

    def expire(self, now: float) -> Effects:
        t = self.world.timers
        out: Effects = []
        for comm_hash, (_, confirmed) in list(self.stuck.items()):
            if now - confirmed > 3 * self.interval() + t.leg_timeout + t.gather_extra:
                out += self.release(comm_hash, now, "verdict no longer confirmed")
        return out

    def last_position(self, addr: Addr) -> Position:
        """The last position a sweep of this node saw of the process at ``addr`` (empty when none)."""
        seen = self.positions.get(addr)
        return seen[0] if seen is not None else ()

    def silent_positions(self, now: float) -> list[tuple[PeerInfo, Position, float]]:
        """The processes this node hears from no more, where its sweeps last saw them, and how long ago: those that
        missed its last sweep (a position older than one and a half sweeps), or are unresponsive or hung. What a
        STACKS answer adds for the processes that cannot answer for themselves (docs/protocol.md §2.6)."""
        world = self.world
        stale = 1.5 * self.interval()
        out = []
        for addr, (position, at) in self.positions.items():
            peer = world.table.get(addr)
            if peer is not None and (now - at > stale or world.is_delayed(addr) or world.is_hung(peer.key)):
                out.append((peer, position, now - at))
        return out

    def standing(self) -> dict[int, StuckVerdict]:
        """The verdicts this node holds now, SLOW ones included (``StuckVerdict.slow``), for a report."""
        return {h: v for h, (v, _) in self.stuck.items()}

    def forgive(self, gap: float) -> None:
        for h, (v, confirmed) in list(self.stuck.items()):
            self.stuck[h] = (v, confirmed + gap)
