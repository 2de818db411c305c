"""Peers and the peer table.

A *peer* is one process of the job running a RAS node. It is known by its mesh address (the host IP and the
ephemeral port its node listens on) and an *incarnation*, a random 64-bit number drawn when the node starts, so a
restarted process is always a new peer.

The table is sorted by address (IPv4 before IPv6, then IP bytes, then port), so the processes of one host sit
together, and it only grows: dead and departed peers stay listed, and are tracked in separate sets by the node. Its
hash travels in every keepalive; a mismatch makes neighbours exchange tables until they agree.

Nothing here does I/O.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple


class Addr(NamedTuple):
    """A mesh listening address: numeric host IP and port."""

    host: str
    port: int

    def sort_key(self) -> tuple[int, bytes, int]:
        return _sort_key(self.host, self.port)

    def __str__(self) -> str:
        # NCCL's socket format, used in logs and in events about unknown peers: IP<port>.
        return f"{self.host}<{self.port}>"


@functools.lru_cache(maxsize=1 << 16)
def _sort_key(host: str, port: int) -> tuple[int, bytes, int]:
    # Cached: the table is re-sorted on every merge and the ring compares addresses often; parsing an IP is slow.
    ip = ipaddress.ip_address(host)
    return (ip.version, ip.packed, port)


@dataclass(frozen=True)
class PeerInfo:
    """What the job knows about one process."""

    addr: Addr
    pid: int
    hostname: str
    incarnation: int
    devices: tuple[int, ...] = ()  # CUDA device indices; empty for a CPU process
    rank: int = -1  # global rank in the job's first process group, -1 when unknown

    @property
    def host(self) -> str:
        return self.addr.host

    def sort_key(self) -> tuple[int, bytes, int]:
        return self.addr.sort_key()

    def describe(self) -> str:
        """NCCL's process description: ``Process <pid> on node <ip> managing GPU[s] <list>`` (or ``CPU``)."""
        return f"Process {self.pid} on node {self.host} managing {devices_text(self.devices)}"


def devices_text(devices: tuple[int, ...]) -> str:
    if not devices:
        return "CPU"
    return ("GPU " if len(devices) == 1 else "GPUs ") + ",".join(str(d) for d in devices)


def table_hash(entries: Iterable[PeerInfo]) -> int:
    """A 64-bit hash of a sorted peer list; equal tables give equal hashes on every node."""
    h = hashlib.blake2b(digest_size=8)
    for p in entries:
        h.update(f"{p.addr.host}|{p.addr.port}|{p.pid}|{p.incarnation}|{p.rank};".encode())
    return int.from_bytes(h.digest(), "big")


def addr_set_hash(addrs: Iterable[Addr]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for a in sorted(addrs, key=Addr.sort_key):
        h.update(f"{a.host}|{a.port};".encode())
    return int.from_bytes(h.digest(), "big")


@dataclass
class PeerTable:
    """The sorted, grow-only table of every process the node has heard of."""

    _by_addr: dict[Addr, PeerInfo] = field(default_factory=dict)
    _sorted: list[PeerInfo] = field(default_factory=list)
    _hash: int = 0

    def __post_init__(self) -> None:
        self._resort()

    def _resort(self) -> None:
        self._sorted = sorted(self._by_addr.values(), key=PeerInfo.sort_key)
        self._hash = table_hash(self._sorted)

    def merge(self, peers: Iterable[PeerInfo]) -> list[PeerInfo]:
        """Add unknown peers; return the ones that were new (the diff to gossip on).

        An entry for a known address is kept as first seen: an address belongs to one incarnation for the life of
        the job (a restarted process binds a new ephemeral port).
        """
        new = [p for p in peers if p.addr not in self._by_addr]
        for p in new:
            self._by_addr[p.addr] = p
        if new:
            self._resort()
        # Dedupe peers listed twice in the input.
        seen: set[Addr] = set()
        unique = []
        for p in new:
            if p.addr not in seen:
                seen.add(p.addr)
                unique.append(p)
        return unique

    def copy(self) -> "PeerTable":
        """An independent table with the same entries (no re-sorting or re-hashing)."""
        other = PeerTable.__new__(PeerTable)
        other._by_addr = dict(self._by_addr)
        other._sorted = list(self._sorted)
        other._hash = self._hash
        return other

    def __contains__(self, addr: object) -> bool:
        return addr in self._by_addr

    def __len__(self) -> int:
        return len(self._sorted)

    def __iter__(self):
        return iter(self._sorted)

    def get(self, addr: Addr) -> PeerInfo | None:
        return self._by_addr.get(addr)

    def entries(self) -> list[PeerInfo]:
        return list(self._sorted)

    def index(self, addr: Addr) -> int:
        for i, p in enumerate(self._sorted):
            if p.addr == addr:
                return i
        raise KeyError(addr)

    @property
    def hash(self) -> int:
        return self._hash
