"""Which peers a node keeps links to: a pure function of the peer table and what the node knows of its peers.

The mesh is a ring over the table sorted by address (docs/architecture.md §2.3): each node links to the next and
the previous live peer. When the primary peer of a direction is unhealthy (silent, or not reachable for a while),
the node also links to the next peer beyond it in that direction, and keeps walking while those are unhealthy too
(a chain of fallbacks). Past two unhealthy processes of another host, the walk skips the rest of that host's
processes but those known healthy, so a dead host of 8 processes costs two hops, not 8.

::

    table order:   A  B  C  [D]  E  F        D silent
    C's links:     next D (primary), E (fallback);  prev B
    E's links:     prev D (primary), C (fallback);  next F

Skip links (``express``) shorten the gather tree: besides its ring neighbours every node links to the first live
peer ``stride`` positions away in each direction, where ``stride`` is about the square root of the table's size, so
a flood reaches every node in about ``2 * sqrt(N)`` hops instead of ``N / 2``.

Far links. A node none of whose ring and skip links is known healthy, and some unhealthy, is cut off from the job as
far as its links go, though the network may reach it: the middle of a silent region by address, more than
``MAX_FALLBACKS`` processes and a stride from its edges (sweep seed 3152: a process of the larger side of a
partition, inside the cut-off region by address, reached by no gather, was declared dead). Such a node also links to
``FAR_LINKS`` peers spread evenly over the live table, as fallbacks: most of them lie outside any region a partition
cuts off. They stay while its ring and skip links are unhealthy, so they do not come and go with their own health.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

A = TypeVar("A")

#: A direction walks at most this many unhealthy peers before giving up (a partition must not make a node connect
#: to every peer on the far side).
MAX_FALLBACKS = 16
#: Below this many live peers a ring alone is shallow enough.
EXPRESS_MIN_PEERS = 64
#: Links spread over the table of a node whose ring and skip links are all unhealthy (with express links only).
FAR_LINKS = 4


def links(
    order: Sequence[A],
    me_index: int,
    excluded: Callable[[A], bool],
    unhealthy: Callable[[A], bool],
    host_of: Callable[[A], str],
    express: bool = True,
    healthy: Callable[[A], bool] | None = None,
    excluded_at: Sequence[int] | None = None,
) -> set[A]:
    """The peers ``order[me_index]`` should keep links to.

    ``order`` is the whole sorted table; ``excluded`` peers (dead, departed) are skipped as if absent;
    ``unhealthy`` peers are linked to but also bridged over by fallbacks. ``healthy``: the peers known healthy, the
    only ones of a skipped host the walk does not skip (default: every peer not unhealthy). ``excluded_at``: the
    positions in ``order`` of the excluded peers, sorted, when the caller knows them: the skip links are then found
    in O(log N) rather than by a walk over the whole table (a node of 100,000 relinks on every death it hears of).
    """
    n = len(order)
    me = order[me_index]
    out: set[A] = set()
    known_healthy = healthy if healthy is not None else (lambda p: not unhealthy(p))
    for direction in (1, -1):
        out |= _walk(order, me_index, direction, excluded, unhealthy, host_of, known_healthy)
    if express:
        if excluded_at is None:
            excluded_at = [i for i in range(n) if excluded(order[i])]
        live = LiveOrder(n, [i for i in excluded_at if i != me_index])
        if live.count >= EXPRESS_MIN_PEERS:
            pos = live.rank(me_index)
            # The stride counts the whole table, the dead included, and the skip peer is the first live one at or
            # beyond that many positions: a death elsewhere moves no skip link. (Counted over the live peers, every
            # node's skip links moved each time the live count crossed a square: a rack of 64 dying at once made
            # the whole job relink, and dropped the links whose refused reconnects would have found the rack's last
            # members dead at once; docs/architecture.md §11.)
            stride = max(2, int(math.isqrt(n)))
            for direction in (1, -1):
                at = live.live_from((me_index + direction * stride) % n, direction)
                target = order[at]
                if target != me:
                    out.add(target)
                    if unhealthy(target):
                        # Bridge a silent express peer with its live successor, one step further.
                        nxt = order[live.live_from((at + direction) % n, direction)]
                        if nxt != me:
                            out.add(nxt)
            out.discard(me)
            # Isolated: no link known healthy, and some known unhealthy (at start-up none is either). Fallbacks
            # still connecting count as neither, or a walk in progress would hold the far links back (seed 3152).
            if any(unhealthy(p) for p in out) and not any(known_healthy(p) for p in out):
                for k in range(1, FAR_LINKS + 1):
                    far = order[live.at(pos + k * live.count // (FAR_LINKS + 1))]
                    if far != me:
                        out.add(far)
    out.discard(me)
    return out


class LiveOrder:
    """The live entries of a table of ``n`` with a few positions excluded, numbered 0 .. count-1 in table order,
    without listing them: ``rank`` and ``at`` bisect the excluded positions."""

    def __init__(self, n: int, excluded_at: Sequence[int]) -> None:
        self.n = n
        self.excluded_at = excluded_at  # sorted
        self.count = n - len(excluded_at)

    def rank(self, position: int) -> int:
        """The live number of the (live) entry at ``position``."""
        return position - bisect.bisect_left(self.excluded_at, position)

    def live_from(self, position: int, direction: int) -> int:
        """The first live position at or after ``position`` going in ``direction`` (wrapping)."""
        excluded = self.excluded_at
        while True:
            i = bisect.bisect_left(excluded, position)
            if i == len(excluded) or excluded[i] != position:
                return position
            position = (position + direction) % self.n

    def at(self, k: int) -> int:
        """The position of live entry number ``k`` (modulo the live count)."""
        k %= self.count
        low, high = k, min(self.n - 1, k + len(self.excluded_at))
        # The smallest position with k + 1 live entries at or before it.
        while low < high:
            mid = (low + high) // 2
            if mid + 1 - bisect.bisect_right(self.excluded_at, mid) >= k + 1:
                high = mid
            else:
                low = mid + 1
        return low


def _walk(
    order: Sequence[A],
    me_index: int,
    direction: int,
    excluded: Callable[[A], bool],
    unhealthy: Callable[[A], bool],
    host_of: Callable[[A], str],
    healthy: Callable[[A], bool],
) -> set[A]:
    n = len(order)
    me = order[me_index]
    chosen: set[A] = set()
    i = me_index
    fallbacks = 0
    skip_host: str | None = None
    bad_on_host: dict[str, int] = {}  # unhealthy processes met on each host in this walk
    for _ in range(n - 1):
        i = (i + direction) % n
        peer = order[i]
        if peer == me:
            break
        if excluded(peer):
            continue
        host = host_of(peer)
        # The rest of a skipped host, once two of its processes were unhealthy in this walk: only its processes
        # known healthy are kept (a host cut off whole is crossed in one step, sweep seed 5152). After one, the walk
        # goes on through it as through any host, or a live process between silent ones could be left with no live
        # link at all.
        if skip_host == host and bad_on_host.get(host, 0) >= 2 and not healthy(peer):
            continue
        chosen.add(peer)
        if not unhealthy(peer):
            break
        bad_on_host[host] = bad_on_host.get(host, 0) + 1
        fallbacks += 1
        if fallbacks > MAX_FALLBACKS:
            break
        # A fallback of a fallback on another host skips the rest of that host.
        if fallbacks >= 2 and host != host_of(me):
            skip_host = host
    return chosen
