"""Where the shards of a sharded commit live, and which commit a restore takes: pure functions, no torch.

A sharded commit (``inprocess.elastic.sharded``) leaves on each rank the *blob* it wrote (its part of the state,
as ``torch.distributed.checkpoint`` assigned it) and copies of the blobs of the ranks it guards. Every blob is
named by its *owner*: the rank that wrote it, in the world of that commit.

* ``guards(rank, hosts, k)``: the k ranks that keep copies of ``rank``'s blob: the next ranks around the ring,
  those on other hosts first, so that a host lost with all its processes loses no blob its guards hold;
* ``choose(offers, disk)``: from what every rank of the new world holds, the version a restore takes, or the
  disk checkpoint, or nothing; with, for each owner, the ranks that can serve its blob;
* ``top_up(holders, hosts, k)``: after a restore, which ranks take more copies of the restored commit's blobs so
  that each is held k + 1 times again;
* ``serving_rank(owner, requester, holders)``: which holder serves a requester (itself if it holds the blob,
  else spread over the holders).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


def guards(rank: int, hosts: Sequence[str], k: int) -> list[int]:
    """The ranks that keep a copy of ``rank``'s blob: the next ``k`` ranks of the ring (``rank + 1``, ``rank + 2``,
    ...), those on another host than ``rank`` before those on its host (a copy beside its original dies with the
    host). Fewer when the world is smaller than ``k + 1``."""
    world = len(hosts)
    others = [(rank + step) % world for step in range(1, world)]
    others.sort(key=lambda other: (hosts[other] == hosts[rank], (other - rank) % world))
    return others[: max(0, k)]


def guarded_by(rank: int, hosts: Sequence[str], k: int) -> list[int]:
    """The ranks whose blobs ``rank`` keeps copies of (the inverse of ``guards``)."""
    return [other for other in range(len(hosts)) if other != rank and rank in guards(other, hosts, k)]


@dataclasses.dataclass(frozen=True)
class Held:
    """One commit a rank holds: its ``version`` (every memory commit, reshards included, has a new one), the
    public commit count, the world it was written in, the owners whose blobs the rank holds, and whether the rank
    completed it (``committed``) or only holds it whole while the commit's last collective was cut (``pending``)."""

    version: int
    commits: int
    world: int
    owners: frozenset[int]
    committed: bool


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a restore loads. ``source``: ``"memory"``, ``"disk"`` or ``"none"`` (nothing to load: the state as
    built). ``holders``: for a memory restore, each owner's blob and the ranks (of the new world) that hold it.
    ``missing``: the owners whose blobs nobody holds in the newest committed version (the reason for the disk)."""

    source: str
    version: int = -1
    commits: int = 0
    world: int = 0
    holders: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    missing: tuple[int, ...] = ()
    disk_commits: int | None = None


def choose(offers: Sequence[Sequence[Held]], disk: Sequence[int | None]) -> Choice:
    """The commit a restore takes, the same on every rank (every rank passes the same ``offers``, rank by rank,
    and ``disk``: the newest complete disk checkpoint (its commit count) each rank sees, None for none).

    The newest version whose blobs the ranks hold all of wins, provided no rank committed a newer one: a rank
    completes a commit only once every rank of its world holds it whole (``pending`` or ``committed``), so a
    version some rank completed and nobody holds whole lost blobs with the ranks that died, and the memory can no
    longer give the state the job had. Then the disk checkpoint that every rank sees, if any; else nothing."""
    newest_committed = max((held.version for rank in offers for held in rank if held.committed), default=-1)
    versions: dict[int, list[tuple[int, Held]]] = {}
    for rank, held_list in enumerate(offers):
        for held in held_list:
            versions.setdefault(held.version, []).append((rank, held))
    missing: tuple[int, ...] = ()
    for version in sorted(versions, reverse=True):
        entries = versions[version]
        world = entries[0][1].world
        holders: dict[int, list[int]] = {owner: [] for owner in range(world)}
        for rank, held in entries:
            for owner in held.owners:
                if owner in holders:
                    holders[owner].append(rank)
        lost = tuple(owner for owner, ranks in holders.items() if not ranks)
        if not lost and version >= newest_committed:
            return Choice(
                "memory",
                version,
                entries[0][1].commits,
                world,
                {owner: tuple(sorted(ranks)) for owner, ranks in holders.items()},
            )
        if version == newest_committed and not missing:
            missing = lost
    common = None if not disk or any(value is None for value in disk) else min(v for v in disk if v is not None)
    if common is not None:
        return Choice("disk", missing=missing, commits=common, disk_commits=common)
    return Choice("none", missing=missing)


def top_up(holders: dict[int, tuple[int, ...]], hosts: Sequence[str], k: int) -> dict[int, list[int]]:
    """After a restore, the ranks of the new world (``hosts``, one per rank) that take more copies of the restored
    commit's blobs so that each owner's blob is held by ``k + 1`` ranks again (or by all of them, in a smaller
    world): a restore keeps the commit it loaded, and a kill -9 of up to k ranks still loses nothing, before the
    next commit. ``holders``: each owner's current holders. The new holders are the next ranks around the ring from
    the first holder, those on a host no holder is on first, then those with the fewest new copies to take."""
    world = len(hosts)
    taken = [0] * world
    added: dict[int, list[int]] = {}
    for owner in sorted(holders):
        have = list(holders[owner])
        need = min(k + 1, world) - len(have)
        if need <= 0 or not have:
            continue
        start = min(have)
        others = [(start + step) % world for step in range(1, world)]
        others = [rank for rank in others if rank not in have]
        covered = {hosts[rank] for rank in have}
        others.sort(key=lambda rank: (hosts[rank] in covered, taken[rank], (rank - start) % world))
        added[owner] = others[:need]
        for rank in added[owner]:
            taken[rank] += 1
    return added


def serving_rank(owner: int, requester: int, holders: Sequence[int]) -> int:
    """The rank that sends ``owner``'s blob (or parts of it) to ``requester``: the requester itself when it holds
    it; else one of the holders, spread by requester so that one holder does not serve everybody."""
    if requester in holders:
        return requester
    ordered = sorted(holders)
    return ordered[(requester + owner) % len(ordered)]


def aligned(size: int, alignment: int = 16) -> int:
    """``size`` rounded up to a multiple of ``alignment`` (where the next item of a byte buffer starts, so that
    each item can be viewed as its dtype in place)."""
    return (size + alignment - 1) // alignment * alignment


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """The offsets of items of ``sizes`` bytes laid one after the other, each aligned; and the total."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total = aligned(total + size)
    return offsets, total
