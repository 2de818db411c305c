"""Silence deaths, decided with the job's view: who this node can still reach, and whether anybody heard the peer.

Belongs here: the silence verdicts our ladder reached (*pending*), the reachability gather that decides them, the
*suspects* it leaves (live in our table, absent from the gather) with their SUSPECT floods and refutations, whether
this node is on the larger side of the job, and declaring the deaths. Theory of operation (docs/architecture.md
section 2.7)::

    our DEAD rung (silent past the dead limit, our HUNG unrefuted)  -> pending; our HUNG once more (its last call,
                    links.py) and a gather (REACH_QUERY), one at a time; no death before the last call stood CONFIRM
    the gather ends -> majority: we reach more than half of the processes we hold alive (half: and the lowest one)
                    -> every live process that did not answer is suspected: a SUSPECT flood each
    a node that had bytes from the suspect within the dead limit, or the suspect itself -> HEARD (refuted),
                    and the refutation clears the suspect's whole *run* (below)
    majority: pending deaths now; suspicions unrefuted for CONFIRM unresponsive limits   -> PEER_DEAD, flooded
              (the first majority after a minority calls everything older again first: ``_call_again``)
    minority: a dead limit later, a last call first (one more SUSPECT, unrefuted for CONFIRM) -> PEER_DEAD, flooded
    minority: both wait one more dead limit (gathering again meanwhile: a heal makes us the majority again)
    while a gather leaves processes unreached, gather again every gather time limit: a refuted suspect that is
    still unreachable is suspected again, until nobody has heard it for the dead limit

Why a gather. The ring watches each process from its neighbours and a few skip links, so a whole silent region (the
far side of a partition) is learnt one link at a time: each death moves the link one process on, and the new link
needs a dead limit of its own; on the smaller side of a partition that walk took a dead limit per process. A gather
measures at once what this node can still reach; what it cannot, and nobody on its side heard within the dead
limit, is dead by the same rule as a silent neighbour (a process cut off only briefly, or a gather leg lost, was
heard by somebody within the dead limit, who refutes).

Why a refutation clears a run. The suspects of one gather fall into runs: processes consecutive in table order
(the ring) that the gather did not reach. Only a run's edges and its skip links are linked to reachable processes,
so a region cut off for less than the dead limit has an inside that no reachable node ever heard: those suspicions
go unrefuted although the region was reachable moments ago. Every path from this side into a run crosses a link to
one of its members, held by a node of this side; so if any member was heard within the dead limit, the run may have
been cut off for less than the dead limit, and none of it is declared. The run is suspected again at the next gather,
and declared once nobody has heard any of it for the dead limit.

Why each suspicion is flooded and refuted about once per gather. Many nodes gather at about the same time (every
node linked to a silent process, every node of a cut-off side), each suspecting the same processes, and every node
that heard a suspect would refute each of their floods: floods times refuters, each a flood of the whole job. So a
node floods no SUSPECT about a process another node's SUSPECT flood named less than ``ECHO`` ago, and refutes none
about a process a HEARD flood named less than ``ECHO`` ago; a suspicion itself is not raised against a run of
which a member was refuted less than ``ECHO`` ago. ``ECHO`` is shorter than the time between two gathers of one
node, so a suspicion that lasts is raised and answered again at each of its gathers. A flood reaches every node
reachable when it goes out, but none that became reachable just after (a partition healing): so a SUSPECT that went
by before our suspicion was raised does not stand for it. A death needs a SUSPECT flood sent or seen after the
suspicion (or the last call) began, unrefuted for CONFIRM; without one we flood our own first (``_answered``). And
the suspect itself answers every SUSPECT about itself, however lately it answered one, and a refuter that answered
lately passes the SUSPECT on towards it: a reachable process is never declared dead without having been asked
(sweep seed 5482). A refuter other than the suspect still sends one HEARD per ``ECHO`` (docs/architecture.md
section 10).

Why the smaller side waits. Death is permanent, and a partition that heals just after the dead limit would carry
each side's fresh verdicts into the other, where the processes they name are alive: a union of the two dead lists
that takes live processes out of the job. With the smaller side one dead limit behind, a partition that heals in
time leaves only the larger side's verdicts, which the smaller side's processes accept as a resumed zombie does; one
that lasts longer leaves both sides complete, and the reunion rule (``reunion.py``) lets the larger side win.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from . import wire
from .effects import (
    REACH_QUERY,
    Answered,
    Broadcast,
    Dead,
    Decide,
    Effects,
    LastCall,
    Measured,
    Notify,
    Originate,
    Side,
    StartGather,
)
from .events import Kind
from .liveness import CONFIRM
from .peers import Addr, PeerInfo, PeerKey
from .snapshot import JobSnapshot

if TYPE_CHECKING:
    from .view import World

__all__ = ["ECHO", "REACH_QUERY", "Suspicion", "unreached_runs"]
#: How long a SUSPECT or HEARD flood about a process stands for all, in gather leg timeouts: shorter than the time
#: from one gather of a node to its next (a leg timeout and the hard extra).
ECHO = 1.0


class Suspicion:
    def __init__(self, world: World) -> None:
        self.world = world
        self.pending: dict[PeerKey, float] = {}  # silence verdicts of our ladder -> since when
        self.suspects: dict[PeerKey, float] = {}  # processes the last gather did not reach -> since when
        self.runs: dict[PeerKey, frozenset[PeerKey]] = {}  # an unreached process -> its run (see the module's doc)
        self._suspected: dict[PeerKey, float] = {}  # the last SUSPECT flood seen or sent about a process -> when
        self._heard: dict[PeerKey, float] = {}  # the last HEARD flood seen or sent about a process -> when
        self._final: dict[PeerKey, float] = {}  # the smaller side's last SUSPECT before a death (``_last_call``)
        self._called: dict[PeerKey, float] = {}  # the first SUSPECT flood sent or seen since a suspicion (or call)
        self._pruned = float("-inf")
        self.majority = True  # what the last reachability gather said
        self.unreached = False  # whether it left live processes unreached (then we gather again)
        self._gathering = False
        self._gathered = float("-inf")

    # --- inputs --------------------------------------------------------------------------------------------------

    def silent(self, key: PeerKey, now: float) -> Effects:
        """Our ladder's DEAD rung: that linked process is silent past the dead limit and nobody refuted our HUNG.
        When the verdict is newly pending, our HUNG goes out once more (its last call) after our gather starts."""
        if key in self.pending:
            return []
        self.pending[key] = now
        out = self._gather(now)
        out.append(LastCall(key))
        return out

    def reached(self, snap: JobSnapshot, now: float) -> Effects:
        """A reachability gather ended: are we the larger side, and whom can we not reach?"""
        world = self.world
        self._gathering = False
        if world.expelled or world.leaving:
            return []
        live = world.live_peers()
        answered = [p for p in live if p.addr in snap.responses]  # the table is sorted: the first is the lowest
        lowest = live[0].addr if live else world.me.addr
        was_majority = self.majority
        self.majority = 2 * len(answered) > len(live) or (2 * len(answered) == len(live) and lowest in snap.responses)
        side = Side(len(answered), answered[0].addr if answered else world.me.addr)
        out: Effects = [Measured(side, snap.timeouts == 0)]
        for key in list(self.pending):
            # It answered: it is alive and reachable now (a partition healed, a link came back, a paused process
            # resumed while the gather ran), so the silence of our link to it is not a death.
            if key.addr in snap.responses:
                del self.pending[key]
                out.append(Answered(key))
        for key in list(self.suspects):
            if key.addr in snap.responses:
                del self.suspects[key]
        if self.majority and not was_majority:
            out += self._call_again(now)
        self.runs = unreached_runs(live, snap.responses)
        self.unreached = bool(self.runs)
        for run in set(self.runs.values()):
            if any(self._lately(self._heard, key, now) for key in run):
                continue  # a member was heard lately: the run may have been reachable moments ago
            for key in run:
                if key in self.suspects or key in self.pending:
                    continue
                self.suspects[key] = now
                self._called.pop(key, None)
                if not self._lately(self._suspected, key, now):
                    out += self._call(key, now)
        return out + self._decide(now)

    def on_suspect(self, conn_id: int, msg: wire.Flood, subject: PeerKey, now: float) -> Effects:
        """A SUSPECT flood: refute it if we are the suspect or heard it within the dead limit; else pass it on."""
        world = self.world
        if subject == world.me.key:
            # The suspect answers every SUSPECT about itself, however lately it answered one: its last HEARD may
            # have gone out before this suspecter could be reached (a partition healing; sweep seed 5482).
            self._heard[subject] = now
            return [Originate(wire.FloodKind.HEARD, subject, now)]
        if world.heard_within(subject, world.timers.dead, now) and not self._lately(self._heard, subject, now):
            self._heard[subject] = now
            return [Originate(wire.FloodKind.HEARD, subject, world.stamp(subject))]
        # Not heard by us, or heard and answered lately (maybe before this suspecter could be reached): no second
        # HEARD, but the SUSPECT goes on, towards the suspect, which answers every one; stopped here, it would stop
        # next to the suspect, whose links all heard it.
        self._suspected[subject] = now
        if (subject in self.suspects or subject in self._final) and subject not in self._called:
            self._called[subject] = now  # our suspicion's call: it went out after we suspected
        return [Broadcast(msg, conn_id)]

    def refuted(self, subject: PeerKey, now: float) -> None:
        """A HEARD flood about that process: somebody heard it within the dead limit, so its whole run may have been
        reachable lately (its suspicions are dropped; a pending verdict about it only if its last call was out: the
        ladder's own refutation, a vouch, handles the others)."""
        self._heard[subject] = now
        for key in self.runs.get(subject, (subject,)):
            self.suspects.pop(key, None)
        if self._final.pop(subject, None) is not None:
            self.pending.pop(subject, None)  # its last call was answered: somebody reachable hears it

    def tick(self, now: float) -> Effects:
        world = self.world
        if now - self._pruned >= ECHO * world.timers.leg_timeout:
            self._pruned = now
            for seen in (self._suspected, self._heard):
                for key in [k for k, at in seen.items() if not self._lately(seen, k, now)]:
                    del seen[key]
        for d in (self._final, self._called):
            for key in [k for k in d if k not in self.pending and k not in self.suspects]:
                del d[key]  # dropped meanwhile (answered a gather, heard again, refuted, declared)
        if not self.pending and not self.suspects and not self.unreached:
            return []
        for key in list(self.pending):
            if world.is_gone(key) or world.still_silent(key, now) is None:
                del self.pending[key]  # declared by somebody else, heard again, or no longer a link of ours
        for key in list(self.suspects):
            if world.is_gone(key) or not world.table.is_current(key):
                del self.suspects[key]
        out: Effects = []
        if (
            not self.majority or self.unreached
        ) and now - self._gathered >= world.timers.leg_timeout + world.timers.gather_extra:
            # Look again: on the smaller side a heal makes us the larger one; processes we could not reach are
            # suspected again (a refutation by a node that heard them within the dead limit ages out).
            out += self._gather(now)
        return out + self._decide(now)

    def forgive(self, gap: float) -> None:
        for d in (self.pending, self.suspects, self._final, self._called):
            for key in d:
                d[key] += gap

    def _lately(self, seen: dict[PeerKey, float], key: PeerKey, now: float) -> bool:
        at = seen.get(key)
        return at is not None and now - at < ECHO * self.world.timers.leg_timeout

    # --- deciding ------------------------------------------------------------------------------------------------

    @property
    def gathering(self) -> bool:
        return self._gathering

    def measure(self, now: float) -> Effects:
        """A reachability gather for the reunion rule, which measures a side with it (``reunion.py``)."""
        return self._gather(now)

    def _gather(self, now: float) -> Effects:
        world = self.world
        if not self._gathering and not world.expelled and not world.leaving:
            self._gathering = True
            self._gathered = now
            # Who answers is all the rules read: the REACH ask carries no process's communicators (at 4,096 processes
            # a STATUS-sized reachability gather moved 20 MB, and a partition starts one per node linked to a cut
            # process, at the dead limit: docs/architecture.md §11).
            return [StartGather(REACH_QUERY, ask=wire.Ask.REACH)]
        return []

    def decide(self, now: float) -> Effects:
        """Decide again, after a silence death this node declared has been carried out (``_decide``)."""
        return self._decide(now)

    def _decide(self, now: float) -> Effects:
        """Declare what is due: on the larger side pending deaths at once and suspicions after CONFIRM; on the
        smaller side both one dead limit later. A gather in flight decides first."""
        world = self.world
        if self._gathering:
            return []
        out: Effects = []
        declared: set[PeerKey] = set()  # suspects declared by this pass
        wait = 0.0 if self.majority else world.timers.dead
        confirm = CONFIRM * world.timers.unresponsive
        for key, since in list(self.pending.items()):
            silence = world.still_silent(key, now)
            if silence is None:
                del self.pending[key]  # heard again, or vouched for: its last HUNG was refuted
                continue
            if now - since >= max(wait, confirm) and self._last_call(key, wait, now, out):
                del self.pending[key]
                # One silence death at a time: the links it drops or adds are seen before the next one is decided (a
                # pending death whose link the relink after this one drops is no longer ours to declare).
                why = f"peer failed to respond for {int(silence)}s, declaring dead"
                return out + [Notify(Kind.PEER_TIMEOUT_DEAD, key, why), Dead(key, None), Decide()]
        for key, since in list(self.suspects.items()):
            if key in declared or world.is_gone(key):
                del self.suspects[key]  # declared already (as a pending death of ours, by the pass before this one)
                continue
            if (
                now - since >= max(wait, CONFIRM * world.timers.unresponsive)
                and (wait or self._answered(key, since, now, out))
                and self._last_call(key, wait, now, out)
            ):
                del self.suspects[key]
                declared.add(key)
                out.append(Dead(key, "unreachable, and nobody reachable heard it for the dead limit"))
        return out

    def _last_call(self, key: PeerKey, wait: float, now: float, out: Effects) -> bool:
        """On the smaller side a death is declared a dead limit after it was due, when the network may have healed
        meanwhile: one more SUSPECT flood first (into ``out``), and the death only if nobody refutes it for CONFIRM
        unresponsive limits. (Sweep seed 46: a suspicion raised during a partition came due after the heal and was
        declared; the verdict reached processes of the larger side that the larger side still held alive, and
        through them the larger side, about a process it heard all along.)"""
        if not wait:
            return True
        called = self._final.get(key)
        if called is None:
            if self._lately(self._heard, key, now):
                # Refuted just before the call (a HEARD to another node's SUSPECT): the call is answered, and
                # the refuters would not answer it again within ECHO.
                self.pending.pop(key, None)
                self.suspects.pop(key, None)
                return False
            self._final[key] = now
            self._called.pop(key, None)
            if not self._lately(self._suspected, key, now):
                out += self._call(key, now)
            return False
        return self._answered(key, called, now, out)

    def _call_again(self, now: float) -> Effects:
        """This gather put us on the larger side after the last one put us on the smaller: every last call and
        suspicion older than this gather went out where only the smaller side could hear it, so nobody who hears
        the process had the chance to refute. Each pending death is called again (our HUNG once more) and waits
        CONFIRM from now; each older suspicion is dropped, to be raised afresh by this gather with a SUSPECT flood
        that reaches the larger side. (Sweep seed 7705: a silence death pending on the cut-off side since before
        the heal was declared by the first gather after it, with a last call nobody on the larger side had seen,
        about a process the larger side heard all along.)"""
        out: Effects = []
        began = self._gathered
        for key, since in list(self.pending.items()):
            if since < began:
                self.pending[key] = now
                self._final.pop(key, None)
                out.append(LastCall(key))
        for key, since in list(self.suspects.items()):
            if since < began:
                del self.suspects[key]
                self._called.pop(key, None)
                self._final.pop(key, None)
        return out

    def _call(self, key: PeerKey, now: float) -> Effects:
        """Our SUSPECT flood about ``key``: its suspect, and anybody who heard it within the dead limit, refute."""
        self._suspected[key] = now
        self._called.setdefault(key, now)
        return [Originate(wire.FloodKind.SUSPECT, key)]

    def _answered(self, key: PeerKey, since: float, now: float, out: Effects) -> bool:
        """Whether a suspicion (or last call) begun at ``since`` has had its chance to be refuted: a SUSPECT flood
        about ``key``, ours or another node's seen here, went out after ``since`` and stood CONFIRM unresponsive
        limits. When we flooded none because another node's SUSPECT had just gone by (``ECHO``), and none came
        after ours began, we flood ours (into ``out``) once CONFIRM has passed: the other flood may have gone out
        over a network that did not reach the suspect (sweep seed 5482: a SUSPECT flooded on the smaller side of a
        partition that healed moments later stood in for a suspicion raised after the heal; the suspect, reachable,
        never saw it)."""
        confirm = CONFIRM * self.world.timers.unresponsive
        called = self._called.get(key)
        if called is None:
            if now - since >= confirm:
                out += self._call(key, now)
            return False
        return now - called >= confirm


def unreached_runs(live: list[PeerInfo], answered: Container[Addr]) -> dict[PeerKey, frozenset[PeerKey]]:
    """Each live process that did not answer -> its run: the maximal stretch of consecutive unanswered processes
    around it in table order, wrapping (``live`` is sorted and holds the root, which answers every gather)."""
    n = len(live)
    start = next((i for i, p in enumerate(live) if p.addr in answered), None)
    if start is None:
        return {}
    runs: dict[PeerKey, frozenset[PeerKey]] = {}
    current: list[PeerKey] = []
    for step in range(1, n + 1):
        p = live[(start + step) % n]
        if p.addr not in answered:
            current.append(p.key)
        elif current:
            run = frozenset(current)
            runs.update(dict.fromkeys(current, run))
            current = []
    return runs
