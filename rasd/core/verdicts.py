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
from .events import Kind
from .liveness import HUNG_EXPIRY
from .peers import Addr, PeerKey, key_set_hash

if TYPE_CHECKING:
    from .node import Node


class Verdicts:
    def __init__(self, node: Node) -> None:
        self.node = node
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
        """The hash of the dead and departed sets, as every keepalive carries it."""
        return key_set_hash(self.dead) ^ (key_set_hash(self.left) * 3 & 0xFFFFFFFFFFFFFFFF)

    def gone_addresses(self) -> set[Addr]:
        """The addresses whose current process is dead or departed (the ring skips them)."""
        return {k.addr for k in self.dead | self.left if self.node.table.is_current(k)}

    # --- death and departure -----------------------------------------------------------------------------------

    def declare_dead(self, key: PeerKey, now: float, why: str | None, flood: bool = True) -> None:
        node = self.node
        if key in self.dead or key == node.me.key:
            return
        peer = node.table.entry(key)
        self.dead.add(key)
        self.left.discard(key)
        self.hung.pop(key, None)
        self.dead_hash = self.gone_hash()
        self.disconnect(key)
        node.emit(Kind.PEER_DEAD, now, peer, why or "")
        if flood and peer is not None:
            node.pass_on(node.floods.verdict(wire.FloodKind.DEAD, key), except_conn=None)
        node.links.relink(now)

    def mark_left(self, key: PeerKey, now: float) -> None:
        node = self.node
        if key in self.left or key in self.dead or key == node.me.key:
            return
        self.left.add(key)
        self.hung.pop(key, None)
        self.dead_hash = self.gone_hash()
        self.disconnect(key)
        node.emit(Kind.PEER_LEFT, now, node.table.entry(key), "process left the job")
        node.links.relink(now)

    def disconnect(self, key: PeerKey) -> None:
        """Forget the link to that process and close its connections. Connections to the same address that belong
        to a newer incarnation stay; ones still in their handshake (incarnation unknown) go only if ``key`` is the
        current entry, as they would reach that process."""
        node = self.node
        contact = node.links.contacts.get(key.addr)
        if contact is not None and contact.incarnation == key.incarnation:
            del node.links.contacts[key.addr]
        current = node.table.is_current(key)
        for c in node.connections:
            if c.peer == key.addr and (c.incarnation == key.incarnation or (c.incarnation is None and current)):
                node.drop_conn(c.id)

    def retire(self, addrs: set[Addr], now: float) -> None:
        """Newer incarnations arrived at ``addrs``: every older one there that is not yet known gone is dead (its
        port was free for the newer process to bind). If a newer incarnation holds this node's own address, the job
        counts this node gone: it stops taking part."""
        node = self.node
        for addr in sorted(addrs, key=Addr.sort_key):
            for p in node.table.former(addr):
                if not self.gone(p.key):
                    self.declare_dead(p.key, now, "a newer process holds its address", flood=False)
        if node.me.addr in addrs and not node.table.is_current(node.me.key):
            node.expel(now)

    # --- fast death --------------------------------------------------------------------------------------------

    def refused(self, key: PeerKey, lost_connection: bool, now: float) -> None:
        """A reconnect to that process was refused (nobody listens on its port). After a lost connection it is
        dead at once (fast death); otherwise it may not listen yet, so only a local process is probed."""
        if self.node.timers.fast_death and lost_connection:
            self.declare_dead(key, now, "connection closed and reconnect refused")
        else:
            self.probe_if_local(key.addr)  # nobody listens there: if its process is gone, it is dead

    def probe_if_local(self, addr: Addr) -> None:
        """Ask the driver whether a peer on this host still has a process (same IP and host name)."""
        node = self.node
        peer = node.table.get(addr)
        same_host = peer is not None and peer.host == node.me.host and peer.hostname == node.me.hostname
        if same_host and node.timers.fast_death and peer is not None:
            self._probes[addr] = peer.key
            node.probe(peer)

    def pid_gone(self, addr: Addr, now: float) -> None:
        """The answer to a probe: the process at ``addr`` that the probe asked about no longer exists."""
        node = self.node
        current = node.table.get(addr)
        key = self._probes.pop(addr, None) or (current.key if current is not None else None)
        if node.timers.fast_death and key is not None and node.table.is_current(key) and not self.gone(key):
            self.declare_dead(key, now, "process no longer exists")

    # --- hangs -------------------------------------------------------------------------------------------------

    def hung_verdict(self, key: PeerKey, now: float, why: str) -> None:
        if key not in self.hung:
            self.node.emit(Kind.PEER_HUNG, now, self.node.table.entry(key), why)
        self.hung[key] = now

    def recovered(self, key: PeerKey, now: float) -> None:
        """A RECOVERED flood: the verdict ends here too, and only a node that held it says so."""
        if self.hung.pop(key, None) is not None:
            self.node.emit(Kind.PEER_RECOVERED, now, self.node.table.entry(key), "peer responding again")

    def expire_hung(self, now: float) -> None:
        node = self.node
        for key, confirmed in list(self.hung.items()):
            contact = node.links.contacts.get(key.addr)
            if contact is not None and contact.hung and contact.incarnation == key.incarnation:
                continue  # our own verdict: it stands while we hear nothing
            if now - confirmed > HUNG_EXPIRY * node.timers.hang:
                del self.hung[key]
                node.emit(Kind.PEER_RECOVERED, now, node.table.entry(key), "hang verdict no longer confirmed")

    def forgive(self, gap: float) -> None:
        for key in self.hung:
            self.hung[key] += gap
