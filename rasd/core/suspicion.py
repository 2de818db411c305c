"""Silence deaths, decided with the job's view: who this node can still reach, and whether anybody heard the peer.

Belongs here: the silence verdicts our ladder reached (*pending*), the reachability gather that decides them, the
*suspects* it leaves (live in our table, absent from the gather) with their SUSPECT floods and refutations, whether
this node is on the larger side of the job, and declaring the deaths. Theory of operation (docs/architecture.md
section 2.7)::

    our DEAD rung (silent past the dead limit, our HUNG unrefuted)  -> pending; a gather (REACH_QUERY), one at a time
    the gather ends -> majority: we reach more than half of the processes we hold alive (half: and the lowest one)
                    -> every live process that did not answer is suspected: a SUSPECT flood each
    a node that had bytes from the suspect within the dead limit, or the suspect itself -> RECOVERED (refuted)
    majority: pending deaths now; suspicions unrefuted for CONFIRM unresponsive limits   -> PEER_DEAD, flooded
    minority: both wait one more dead limit (gathering again meanwhile: a heal makes us the majority again)
    while a gather leaves processes unreached, gather again every gather time limit: a refuted suspect that is
    still unreachable is suspected again, until nobody has heard it for the dead limit

Why a gather. The ring watches each process from its neighbours and a few skip links, so a whole silent region (the
far side of a partition) is learnt one link at a time: each death moves the link one process on, and the new link
needs a dead limit of its own; on the smaller side of a partition that walk took a dead limit per process. A gather
measures at once what this node can still reach; what it cannot, and nobody on its side heard within the dead
limit, is dead by the same rule as a silent neighbour (a process cut off only briefly, or a gather leg lost, was
heard by somebody within the dead limit, who refutes).

Why the smaller side waits. Death is permanent, and a partition that heals just after the dead limit would carry
each side's fresh verdicts into the other, where the processes they name are alive: a union of the two dead lists
that takes live processes out of the job. With the smaller side one dead limit behind, a partition that heals in
time leaves only the larger side's verdicts, which the smaller side's processes accept as a resumed zombie does; one
that lasts longer leaves both sides complete, and the reunion rule (``reunion.py``) lets the larger side win.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import wire
from .connections import Conn
from .events import Kind
from .liveness import CONFIRM
from .peers import PeerKey
from .snapshot import JobSnapshot

if TYPE_CHECKING:
    from .node import Node

#: The query id of reachability gathers (the stuck sweeper's is -1; a client's are positive).
REACH_QUERY = -2


class Suspicion:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.pending: dict[PeerKey, float] = {}  # silence verdicts of our ladder -> since when
        self.suspects: dict[PeerKey, float] = {}  # processes the last gather did not reach -> since when
        self.majority = True  # what the last reachability gather said
        self.unreached = False  # whether it left live processes unreached (then we gather again)
        self._gathering = False
        self._gathered = float("-inf")

    # --- inputs --------------------------------------------------------------------------------------------------

    def silent(self, key: PeerKey, now: float) -> None:
        """Our ladder's DEAD rung: that linked process is silent past the dead limit and nobody refuted our HUNG."""
        if key not in self.pending:
            self.pending[key] = now
            self._gather(now)

    def reached(self, snap: JobSnapshot, now: float) -> None:
        """A reachability gather ended: are we the larger side, and whom can we not reach?"""
        node = self.node
        self._gathering = False
        if node.expelled or node.leaving:
            return
        live = node.live_peers()
        reached = sum(1 for p in live if p.addr in snap.responses)
        lowest = live[0].addr if live else node.me.addr  # the table is sorted
        self.majority = 2 * reached > len(live) or (2 * reached == len(live) and lowest in snap.responses)
        for key in list(self.pending):
            # It answered: it is alive and reachable now (a partition healed, a link came back, a paused process
            # resumed while the gather ran), so the silence of our link to it is not a death.
            if key.addr in snap.responses:
                del self.pending[key]
                node.links.answered(key, now)
        for key in list(self.suspects):
            if key.addr in snap.responses:
                del self.suspects[key]
        self.unreached = False
        for p in live:
            if p.addr in snap.responses:
                continue
            self.unreached = True
            if p.key in self.suspects or p.key in self.pending:
                continue
            self.suspects[p.key] = now
            node.pass_on(node.floods.verdict(wire.FloodKind.SUSPECT, p.key), except_conn=None)
        self._decide(now)

    def on_suspect(self, conn: Conn, msg: wire.Flood, subject: PeerKey, now: float) -> None:
        """A SUSPECT flood: refute it if we are the suspect or heard it within the dead limit; else pass it on."""
        node = self.node
        if subject == node.me.key or node.links.heard_within(subject, node.timers.dead, now):
            stamp = now if subject == node.me.key else node.links.stamp(subject)
            node.pass_on(node.floods.verdict(wire.FloodKind.RECOVERED, subject, stamp), except_conn=None)
            return
        node.pass_on(msg, except_conn=conn.id)

    def refuted(self, subject: PeerKey) -> None:
        """A RECOVERED flood about that process: somebody heard it."""
        self.suspects.pop(subject, None)

    def tick(self, now: float) -> None:
        if not self.pending and not self.suspects and not self.unreached:
            return
        node = self.node
        for key in list(self.pending):
            if node.verdicts.gone(key) or node.links.still_silent(key, now) is None:
                del self.pending[key]  # declared by somebody else, heard again, or no longer a link of ours
        for key in list(self.suspects):
            if node.verdicts.gone(key) or not node.table.is_current(key):
                del self.suspects[key]
        if (
            not self.majority or self.unreached
        ) and now - self._gathered >= node.timers.leg_timeout + node.timers.gather_extra:
            # Look again: on the smaller side a heal makes us the larger one; processes we could not reach are
            # suspected again (a refutation by a node that heard them within the dead limit ages out).
            self._gather(now)
        self._decide(now)

    def forgive(self, gap: float) -> None:
        for d in (self.pending, self.suspects):
            for key in d:
                d[key] += gap

    # --- deciding ------------------------------------------------------------------------------------------------

    def _gather(self, now: float) -> None:
        node = self.node
        if not self._gathering and not node.expelled and not node.leaving:
            self._gathering = True
            self._gathered = now
            node.gathering.start(REACH_QUERY, now, None)

    def _decide(self, now: float) -> None:
        """Declare what is due: on the larger side pending deaths at once and suspicions after CONFIRM; on the
        smaller side both one dead limit later. A gather in flight decides first."""
        node = self.node
        if self._gathering:
            return
        wait = 0.0 if self.majority else node.timers.dead
        for key, since in list(self.pending.items()):
            if now - since >= wait:
                del self.pending[key]
                silence = node.links.still_silent(key, now) or node.timers.dead
                node.emit(
                    Kind.PEER_TIMEOUT_DEAD,
                    now,
                    node.table.entry(key),
                    f"peer failed to respond for {int(silence)}s, declaring dead",
                )
                node.verdicts.declare_dead(key, now, None)
        for key, since in list(self.suspects.items()):
            if now - since >= max(wait, CONFIRM * node.timers.unresponsive):
                del self.suspects[key]
                node.verdicts.declare_dead(key, now, "unreachable, and nobody reachable heard it for the dead limit")
