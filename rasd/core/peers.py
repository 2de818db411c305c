"""Peers and the peer table.

A *peer* is one process of the job running a RAS node. It is known by its mesh address (the host IP and the port
its node listens on) and an *incarnation*, drawn when the node starts: the start time in milliseconds in the high
bits, random bits below (``new_incarnation``). The pair (address, incarnation), a ``PeerKey``, names one process for
the life of the job: a restarted process that gets its predecessor's port back is a new peer.

Two processes cannot listen on one address at once, so of the incarnations known at an address the newest (the
highest) is the one that holds it now, the *current* entry; the older ones are *former* entries, processes that are
gone (the node records each as dead unless it left cleanly, docs/architecture.md section 2.6). This rule is a pure
function of what a node has heard, so every node that has heard the same entries agrees, whatever the order.

The table is sorted by address (IPv4 before IPv6, then IP bytes, then port), so the processes of one host sit
together, and it only grows: dead, departed and former peers stay listed, and the node tracks which are dead or
departed in separate sets of keys. Iterating it gives the current entries, one per address; its hash covers every
entry, former ones included, and travels in every keepalive; a mismatch makes neighbours exchange tables until they
agree.

Nothing here does I/O.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import ipaddress
import random
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload


class Addr(NamedTuple):
    """A mesh listening address: numeric host IP and port."""

    host: str
    port: int

    def sort_key(self) -> tuple[int, bytes, int]:
        return _sort_key(self.host, self.port)

    def __hash__(self) -> int:
        # Not the host text's hash, which Python salts per process (PYTHONHASHSEED): sets and dicts of addresses
        # and keys iterate in one order in every process, so a simulator seed replays exactly (tests/reliability/
        # sweep.py prints a one-line reproduction). Equal addresses still hash equal; a tuple equal to an Addr
        # need not, and none is mixed with Addrs as a key.
        return _host_hash(self.host) ^ self.port

    def __str__(self) -> str:
        # NCCL's socket format, used in logs and in events about unknown peers: IP<port>.
        return f"{self.host}<{self.port}>"


#: Sorts hosts that are not numeric IPs after IPv4 (4) and IPv6 (6) ones (``host_order``).
_NOT_AN_IP = 99


@functools.lru_cache(maxsize=1 << 16)  # a report sorts by it, a job's hosts recur: each is parsed once
def host_order(host: str) -> tuple[int, bytes]:
    """The order of hosts in reports: IPv4, then IPv6, then anything else (by its text); within a family, by address
    bytes. Unlike ``Addr.sort_key`` it accepts any text, so a malformed entry can never make a report raise."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return (_NOT_AN_IP, host.encode("utf-8", "surrogatepass"))
    return (ip.version, ip.packed)


def addr_order(addr: Addr) -> tuple[int, bytes, int]:
    """The order of the peer table (host, then port), for any address (``host_order``)."""
    return (*host_order(addr.host), addr.port)


@functools.lru_cache(maxsize=1 << 16)
def _host_hash(host: str) -> int:
    # Cached: addresses are hashed for every table, link and connection lookup, and a job has few hosts.
    return zlib.crc32(host.encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=1 << 17)
def _host_key(host: str) -> tuple[int, bytes]:
    # Cached per host, not per address: a job of 100,000 processes has about 12,500 hosts, and parsing an IP is slow.
    # The same order as ``host_order`` (mesh addresses are always numeric: the wire carries packed IPs).
    return host_order(host)


def _sort_key(host: str, port: int) -> tuple[int, bytes, int]:
    version, packed = _host_key(host)
    return (version, packed, port)


class PeerKey(NamedTuple):
    """One process of the job: its mesh address and its incarnation. Death and departure are keyed by it."""

    addr: Addr
    incarnation: int

    def sort_key(self) -> tuple[tuple[int, bytes, int], int]:
        return (self.addr.sort_key(), self.incarnation)


#: Bits of an incarnation below the start time (random, so two processes started in one millisecond differ).
INCARNATION_RANDOM_BITS = 22


def new_incarnation(wall_time: float, rng: random.Random) -> int:
    """The incarnation of a process started at ``wall_time`` (seconds since the epoch): the start time in milliseconds
    in the high bits, so a later process at the same address has a higher incarnation, and random bits below.

    Fits the wire's u64 until the year 2109. A clock stepped back by more than the time between a process's death and
    its successor's start at the same address would make the successor look older: it would be taken for the former
    entry (docs/architecture.md section 10)."""
    millis = max(0, int(wall_time * 1000))
    return (
        (millis << INCARNATION_RANDOM_BITS) | (rng.getrandbits(64) & ((1 << INCARNATION_RANDOM_BITS) - 1))
    ) & 0xFFFFFFFFFFFFFFFF


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """What the job knows about one process.

    Slotted, and its key made when asked for rather than kept: a node of a 100,000-process job holds 100,000 of
    them (docs/architecture.md §11 measures the bytes per entry)."""

    addr: Addr
    pid: int
    hostname: str
    incarnation: int
    devices: tuple[int, ...] = ()  # CUDA device indices; empty for a CPU process
    rank: int = -1  # global rank in the job's first process group, -1 when unknown

    @property
    def key(self) -> PeerKey:
        return PeerKey(self.addr, self.incarnation)

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


_MASK64 = (1 << 64) - 1


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def entry_digest(p: PeerInfo) -> int:
    """One entry's share of the table hash: what a keepalive compares is the sum of these, modulo 2**64."""
    return _digest(f"{p.addr.host}|{p.addr.port}|{p.pid}|{p.incarnation}|{p.rank};")


def key_digest(k: PeerKey) -> int:
    """One process's share of the hash of a set of peer keys (``key_set_hash``)."""
    return _digest(f"{k.addr.host}|{k.addr.port}|{k.incarnation};")


def table_hash(entries: Iterable[PeerInfo]) -> int:
    """A 64-bit hash of a set of entries, the same on every node that holds them, whatever the order they came in.

    The sum of the entries' digests modulo 2**64 (an additive set hash), so that a node merging one entry into a
    table of 100,000 updates the hash in O(1), rather than rehashing the table (wire version 7; docs/architecture.md
    §11). Entries are unique (by address and incarnation), so no two equal digests cancel as they would with XOR."""
    return sum(map(entry_digest, entries)) & _MASK64


def key_set_hash(keys: Iterable[PeerKey]) -> int:
    """A 64-bit hash of a set of peer keys (the dead or the departed), independent of order: the sum of their
    digests modulo 2**64, so that a set can be kept hashed as it grows (``verdicts.py``)."""
    return sum(key_digest(k) for k in keys) & _MASK64


#: A merge of more new entries than this re-sorts the table (Timsort of a sorted run and the new ones) rather than
#: inserting each one at its place (a list insert moves the tail: at 100,000 entries, about 10 us each).
_INSERT_MAX = 16


class PeerTable:
    """The sorted, grow-only table of every process the node has heard of.

    Iteration, ``len``, ``get`` and ``in`` (by address) see the current entry of each address; ``former`` and
    ``entry`` (by key) reach the entries a newer incarnation replaced.

    Every operation of a settled job is O(1) or O(log N): a merge costs O(log N) per new entry (its hash is added,
    it is inserted at its place), ``index_of`` bisects (once per address while the order holds). ``copy`` shares the
    entries until either table changes (copy on write): the simulator starts 16,384 nodes from one table without
    16,384 copies of it."""

    __slots__ = ("_current", "_former", "_sorted", "_hash", "_shared", "_positions")

    def __init__(self) -> None:
        self._current: dict[Addr, PeerInfo] = {}
        self._former: dict[PeerKey, PeerInfo] = {}
        self._sorted: list[PeerInfo] = []  # the current entries, in address order
        self._hash = 0  # table_hash of every entry, current and former
        self._shared = False  # the three containers are shared with another table: copy them before a change
        # ``index_of``'s answers, kept until the order changes (a merge that adds anything replaces the dict; a copy
        # shares it as it shares the entries). Every relink looks up the position of every dead or departed process
        # (``links.Links.relink``), and every death relinks every node: bisecting them anew made a 1 % partition of
        # 16,384 nodes cost O(dead²) bisects per node.
        self._positions: dict[Addr, int] = {}

    def _own(self) -> None:
        if self._shared:
            self._current = dict(self._current)
            self._former = dict(self._former)
            self._sorted = list(self._sorted)
            self._shared = False

    def merge(self, peers: Iterable[PeerInfo]) -> list[PeerInfo]:
        """Add unknown entries; return the ones that were new (the diff to gossip on), each once, in input order.

        An entry for a known key is kept as first seen. A new incarnation at a known address becomes the current
        entry if it is newer than the current one (which becomes former), else it is filed as former at once."""
        new: list[PeerInfo] = []
        added: dict[Addr, None] = {}  # addresses the table did not hold, in order (their entries: ``_current``)
        for p in peers:
            current = self._current.get(p.addr)
            if (current is not None and current.incarnation == p.incarnation) or p.key in self._former:
                continue
            if not new:
                self._own()
            if current is None:
                self._current[p.addr] = p
                added[p.addr] = None
            elif p.incarnation > current.incarnation:
                self._former[current.key] = current
                self._current[p.addr] = p
                if p.addr not in added:
                    # Same address, same place in the order: the newer entry takes the older one's slot.
                    self._sorted[self._position(p.addr.sort_key())] = p
            else:
                self._former[p.key] = p
            self._hash = (self._hash + entry_digest(p)) & _MASK64
            new.append(p)
        if new:
            self._positions = {}  # a new dict, not a clear: a copy sharing the old one keeps its (still true) answers
        if len(added) > _INSERT_MAX:
            self._sorted.extend(self._current[a] for a in added)
            self._sorted.sort(key=PeerInfo.sort_key)
        else:
            for a in added:
                q = self._current[a]
                self._sorted.insert(self._position(q.addr.sort_key()), q)
        return new

    def _position(self, order: tuple[int, bytes, int]) -> int:
        return bisect.bisect_left(self._sorted, order, key=PeerInfo.sort_key)

    def index_of(self, addr: Addr) -> int | None:
        """The position of the current entry at ``addr`` in the table order, or None (O(log N), then O(1) until the
        table changes)."""
        at = self._positions.get(addr)
        if at is None:
            if addr not in self._current:
                return None
            at = self._positions[addr] = self._position(addr.sort_key())
        return at

    def addresses(self) -> Sequence[Addr]:
        """The current entries' addresses in table order: a view, without a copy."""
        return _Addresses(self._sorted)

    def copy(self) -> PeerTable:
        """An independent table with the same entries: shared until either one changes (copy on write)."""
        other = PeerTable.__new__(PeerTable)
        other._current, other._former, other._sorted, other._hash, other._positions = (
            self._current,
            self._former,
            self._sorted,
            self._hash,
            self._positions,
        )
        other._shared = self._shared = True
        return other

    def __contains__(self, addr: object) -> bool:
        return addr in self._current

    def __len__(self) -> int:
        return len(self._sorted)

    def __iter__(self) -> Iterator[PeerInfo]:
        return iter(self._sorted)

    def get(self, addr: Addr) -> PeerInfo | None:
        """The current entry at ``addr``."""
        return self._current.get(addr)

    def entry(self, key: PeerKey) -> PeerInfo | None:
        """The entry of that process, current or former."""
        current = self._current.get(key.addr)
        if current is not None and current.incarnation == key.incarnation:
            return current
        return self._former.get(key)

    def knows(self, key: PeerKey) -> bool:
        return self.entry(key) is not None

    def is_current(self, key: PeerKey) -> bool:
        current = self._current.get(key.addr)
        return current is not None and current.incarnation == key.incarnation

    def is_outdated(self, key: PeerKey) -> bool:
        """A newer incarnation holds that address: the process is (or would be, if unknown) a former entry."""
        current = self._current.get(key.addr)
        return current is not None and current.incarnation > key.incarnation

    def former(self, addr: Addr | None = None) -> list[PeerInfo]:
        """Replaced entries (at ``addr``, or everywhere), in address then incarnation order."""
        found = [p for k, p in self._former.items() if addr is None or k.addr == addr]
        return sorted(found, key=lambda p: p.key.sort_key())

    def all_entries(self) -> list[PeerInfo]:
        """Every entry, former ones included, in address then incarnation order (what a full table update sends)."""
        if not self._former:
            return list(self._sorted)
        return sorted([*self._sorted, *self._former.values()], key=lambda p: p.key.sort_key())

    @property
    def hash(self) -> int:
        return self._hash


class _Addresses(Sequence[Addr]):
    """The addresses of a list of entries, read through (``PeerTable.addresses``)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[PeerInfo]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> Addr: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Addr]: ...

    def __getitem__(self, i: int | slice) -> Addr | Sequence[Addr]:
        if isinstance(i, slice):
            return [p.addr for p in self._entries[i]]
        return self._entries[i].addr
