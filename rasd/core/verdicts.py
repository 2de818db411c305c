"""Verdicts about processes: who is dead, who left, who is hung, and the rules that decide it at once.

Belongs here: the dead and departed sets and their hash (carried in every keepalive), the HUNG verdicts with when
each was last confirmed, the fast-death rule (a refused reconnect after a lost connection, a vanished pid on this
host), and retiring the older incarnations at an address a newer process holds. Verdicts are about a ``PeerKey``
(address, incarnation), never about an address alone (docs/architecture.md section 2.6). How verdicts travel
(floods) is ``floods.py``; the silence that leads to HUNG and DEAD is the ladder in ``liveness.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import wire
from .actions import ProbePid
from .effects import Drop, Effects, Expel, Forget, Notify, Originate, Relink
from .events import Kind
from .liveness import HUNG_EXPIRY
from .peers import Addr, PeerKey, key_digest, key_set_hash

if TYPE_CHECKING:
    from .view import World

_MASK64 = (1 << 64) - 1


class Verdicts:
    def __init__(self, world: World) -> None:
        self.world = world
        # Dead and departed processes, by (address, incarnation): a newer process at one of their addresses is not.
        self.dead: set[PeerKey] = set()
        self.left: set[PeerKey] = set()
        # Peers under a HUNG verdict (ours or flooded to us), with when it was last confirmed. The peers that flag
        # a hang re-flood it every HUNG_REFRESH hang limits while it lasts; a verdict nobody confirms expires, so a
        # node that missed the RECOVERED flood (cut off, paused) does not keep a stale verdict.
        self.hung: dict[PeerKey, float] = {}
        # The process each outstanding ProbePid asked about, by address (the answer names only the address).
        self._probes: dict[Addr, PeerKey] = {}
        self.dead_hash = self.gone_hash()

    def gone(self, key: PeerKey) -> bool:
        return key in self.dead or key in self.left

    def gone_hash(self) -> int:
        """The hash of the dead and departed sets, as every keepalive carries it (recomputed; the node keeps
        ``dead_hash`` up to date as the sets grow, in O(1) per verdict: the set hashes are sums, peers.key_set_hash)."""
        return (key_set_hash(self.dead) + 3 * key_set_hash(self.left)) & _MASK64

    def gone_addresses(self) -> set[Addr]:
        """The addresses whose current process is dead or departed (the ring skips them)."""
        table = self.world.table
        return {k.addr for k in self.dead | self.left if table.is_current(k)}

    # --- death and departure -----------------------------------------------------------------------------------

    def declare_dead(self, key: PeerKey, now: float, why: str | None, flood: bool = True) -> Effects:
        world = self.world
        if key in self.dead or key == world.me.key:
            return []
        known = world.table.entry(key) is not None
        self.dead.add(key)
        digest = key_digest(key)
        if key in self.left:
            self.left.discard(key)
            digest -= 3 * digest
        self.hung.pop(key, None)
        self.dead_hash = (self.dead_hash + digest) & _MASK64
        out = self._disconnect(key)
        out.append(Notify(Kind.PEER_DEAD, key, why or ""))
        if flood and known:
            out.append(Originate(wire.FloodKind.DEAD, key))
        out.append(Relink())
        return out

    def mark_left(self, key: PeerKey, now: float) -> Effects:
        if key in self.left or key in self.dead or key == self.world.me.key:
            return []
        self.left.add(key)
        self.hung.pop(key, None)
        self.dead_hash = (self.dead_hash + 3 * key_digest(key)) & _MASK64
        out = self._disconnect(key)
        out.append(Notify(Kind.PEER_LEFT, key, "process left the job"))
        out.append(Relink())
        return out

    def _disconnect(self, key: PeerKey) -> Effects:
        """Forget the link to that process and close its connections. Connections to the same address that belong
        to a newer incarnation stay; ones still in their handshake (incarnation unknown) go only if ``key`` is the
        current entry, as they would reach that process."""
        world = self.world
        out: Effects = [Forget(key)]
        current = world.table.is_current(key)
        for c in world.conns_list():
            if c.peer == key.addr and (c.incarnation == key.incarnation or (c.incarnation is None and current)):
                out.append(Drop(c.id))
        return out

    def retire(self, addrs: frozenset[Addr], now: float) -> Effects:
        """Newer incarnations arrived at ``addrs``: every older one there that is not yet known gone is dead (its
        port was free for the newer process to bind). If a newer incarnation holds this node's own address, the job
        counts this node gone: it stops taking part."""
        world = self.world
        out: Effects = []
        for addr in sorted(addrs, key=Addr.sort_key):
            for p in world.table.former(addr):
                if not self.gone(p.key):
                    out += self.declare_dead(p.key, now, "a newer process holds its address", flood=False)
        if world.me.addr in addrs and not world.table.is_current(world.me.key):
            out.append(Expel())
        return out

    # --- fast death --------------------------------------------------------------------------------------------

    def refused(self, key: PeerKey, lost_connection: bool, now: float) -> Effects:
        """A reconnect to that process was refused (nobody listens on its port). After a lost connection it is
        dead at once (fast death); otherwise it may not listen yet, so only a local process is probed."""
        if self.world.timers.fast_death and lost_connection:
            return self.declare_dead(key, now, "connection closed and reconnect refused")
        return self.probe_if_local(key.addr)  # nobody listens there: if its process is gone, it is dead

    def probe_if_local(self, addr: Addr) -> Effects:
        """Ask the driver whether a peer on this host still has a process (same IP and host name)."""
        world = self.world
        peer = world.table.get(addr)
        same_host = peer is not None and peer.host == world.me.host and peer.hostname == world.me.hostname
        if same_host and world.timers.fast_death and peer is not None:
            self._probes[addr] = peer.key
            return [ProbePid(peer.addr, peer.pid)]
        return []

    def pid_gone(self, addr: Addr, now: float) -> Effects:
        """The answer to a probe: the process at ``addr`` that the probe asked about no longer exists."""
        table = self.world.table
        current = table.get(addr)
        key = self._probes.pop(addr, None) or (current.key if current is not None else None)
        if self.world.timers.fast_death and key is not None and table.is_current(key) and not self.gone(key):
            return self.declare_dead(key, now, "process no longer exists")
        return []

    # --- hangs -------------------------------------------------------------------------------------------------

    def hung_verdict(self, key: PeerKey, now: float, why: str) -> Effects:
        out: Effects = [] if key in self.hung else [Notify(Kind.PEER_HUNG, key, why)]
        self.hung[key] = now
        return out

    def hung_ended(self, key: PeerKey) -> None:
        """We heard that process ourselves (links.py tells the job)."""
        self.hung.pop(key, None)

    def recovered(self, key: PeerKey, now: float) -> Effects:
        """A RECOVERED flood: the verdict ends here too, and only a node that held it says so."""
        if self.hung.pop(key, None) is not None:
            return [Notify(Kind.PEER_RECOVERED, key, "peer responding again")]
        return []

    def expire_hung(self, now: float) -> Effects:
        world = self.world
        out: Effects = []
        for key, confirmed in list(self.hung.items()):
            if world.holds_hung(key):
                continue  # our own verdict: it stands while we hear nothing
            if now - confirmed > HUNG_EXPIRY * world.timers.hang:
                del self.hung[key]
                out.append(Notify(Kind.PEER_RECOVERED, key, "hang verdict no longer confirmed"))
        return out

    def forgive(self, gap: float) -> None:
        for key in self.hung:
            self.hung[key] += gap
