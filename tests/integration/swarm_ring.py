"""Wait until a swarm's ring is whole: every member has a ready link to both of its ring neighbours.

``Swarm.start`` returns once every member has connected to *some* peer. That is not yet the ring: while the table
fills in, a member links to peers that stop being its neighbours, and the links to its final neighbours may still
be in their handshake. A fault injected in that moment tests something else than the test means. A process
stopped before any neighbour ever heard it is never UNRESPONSIVE or HUNG (those verdicts need a peer that was once
heard, docs/architecture.md §2.5-2.6); it is only found at the dead limit. A refused reconnect is a death at once
only after a ready connection was closed (§2.6). So the tests that inject a fault right after the start wait for
the ring first.

The ring is the members sorted by address (``Addr.sort_key``, the mesh's own order, docs/architecture.md §2.3);
a link is ready on both sides when one side recorded PEER_CONNECTED about the other (it received the
acknowledgement) and the other PEER_CONNECTING (it accepted and acknowledged).
"""

from __future__ import annotations

from polling import wait_for
from rasd.core.peers import Addr
from rasd.swarm import Swarm

#: The events that say a member finished a handshake with a peer (as the connecting or the accepting side).
LINK_EVENTS = ("PEER_CONNECTED", "PEER_CONNECTING")


def ring_neighbours(sw: Swarm, i: int) -> set[int]:
    """The members next to member ``i`` in the ring (one or two)."""
    order = [m.index for m in sorted(sw.members, key=lambda m: Addr(m.host, m.port).sort_key())]
    pos = order.index(i)
    return {order[pos - 1], order[(pos + 1) % len(order)]} - {i}


def missing_ring_links(sw: Swarm) -> list[tuple[int, int]]:
    """(member, neighbour) for every ring neighbour a member has no finished handshake with yet."""
    missing = []
    for member in sw.members:
        linked = {e["addr"] for kind in LINK_EVENTS for e in sw.events(member.index, kind)}
        for neighbour in sorted(ring_neighbours(sw, member.index)):
            if sw.members[neighbour].addr not in linked:
                missing.append((member.index, neighbour))
    return missing


def wait_for_ring(sw: Swarm, timeout: float = 30.0) -> None:
    """Return once every ring link is ready on both sides; fail with the links still missing after ``timeout``."""
    wait_for(lambda: missing_ring_links(sw), lambda missing: not missing, timeout, 0.02, what="the ring to close")
