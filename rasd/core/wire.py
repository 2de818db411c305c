"""The mesh's wire format: length-prefixed binary messages, strictly checked.

A frame is ``u32 length`` (network byte order) followed by ``length`` bytes: ``u8 version``, ``u8 type``, then the
body of that type. Every field has a fixed width or an explicit, bounded length; a frame whose body is too short,
too long, or holds an out-of-range value raises ``ProtocolError``, and the connection that sent it is closed.

Until a connection has authenticated (see ``auth``), only the two small handshake messages are accepted and a frame
may be at most ``PREAUTH_MAX_FRAME`` bytes, so a stranger can make a node hold no more than a few hundred bytes.

Nothing here does I/O; ``FrameReader`` is fed bytes and yields messages.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
import math
import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .answer import Answer as Answer  # re-exported: the wire carries it (``Answers``)
from .comms import N_OPS, CommRecord, ProcessData, RankRecord, RestartRecord, Work
from .fold import Members, RankState, States, raised, unfold
from .frames import POSITION_FRAMES, Frame, Position, Positions
from .peers import Addr, PeerInfo, PeerKey
from .stuck import StuckVerdict

#: 2: deaths keyed by (address, incarnation); restart records in gather replies. 3: the waiting flag. 4: the
#: sender's clock in keepalives and stamps in floods, SUSPECT and OUTVOTED floods, a probe's side in CONNINIT and the
#: OUTNUMBERED nack (docs/architecture.md 2.7). 5: a probe's side measured by a reachability gather and the MEASURE
#: nack; the HEARD flood. 6: what a gather asks for (``Ask``) and the answers of the asks other than STATUS; a
#: process's position in its process data and the positions of the ranks behind in a communicator verdict. 7: the
#: table and dead-set hashes in keepalives are sums of per-entry digests (``peers.table_hash``), kept up to date in
#: O(1) per change. 8: a STATUS or SWEEP gather's entries are folded (``Fold``: ranks by state, in columns). 9: the
#: REACH ask, a reachability gather that carries nothing but who answered. 10: a process's work (``comms.Work``) in its
#: sweep data; a communicator verdict's SLOW flag, ranks working, phase, time stood and limit (issue 39). 11: the
#: answers of the other asks are two-part (``Answer``: a part processes share, and their own), and a relay passes
#: each distinct shared part once (``Answers``; issue 42: STACKS folded on the way up).
VERSION = 11
MAGIC = b"TRAS"
PREAUTH_MAX_FRAME = 128
MAX_FRAME = 64 * 1024 * 1024
NONCE_LEN = 16
MAC_LEN = 32


class ProtocolError(Exception):
    """The peer sent something that is not a valid message: the connection is dropped."""


class MsgType(enum.IntEnum):
    HELLO = 1  # connector -> acceptor: magic, nonce
    CHALLENGE = 2  # acceptor -> connector: nonce, proof of the secret
    PROOF = 3  # connector -> acceptor: proof of the secret
    CONNINIT = 4
    CONNINITACK = 5
    KEEPALIVE = 6
    PEERSUPDATE = 7
    FLOOD = 8
    COLLREQ = 9
    COLLRESP = 10
    COMMVERDICT = 11


class Nack(enum.IntEnum):
    OK = 0
    YOU_ARE_DEAD = 1  # the connector's incarnation is dead, departed or replaced at its address: it can never rejoin
    DUPLICATE = 2  # a simultaneous connect lost the tie-break; the other connection stays
    LEAVING = 3  # the acceptor is shutting down
    OUTNUMBERED = 4  # a reunion probe: the acceptor's side of a healed partition is the smaller one; it leaves
    MEASURE = 5  # a reunion probe: a side is not measured yet; both gather, and the prober probes again


class Ask(enum.IntEnum):
    """What a gather collects from every process. STATUS: the process data of the status report (``ProcessData``).
    The others: one opaque answer per process (``Answer``), made by the provider the process registered for that
    ask (``Node.answers``) and read only by the gather's root."""

    STATUS = 0
    DIAGNOSTICS = 1  # the process's configuration (rasd.net.configuration, docs/protocol.md §2.4)
    SWEEP = 2  # the sweeper's: STATUS's process data, with each process's position (``ProcessData.where``)
    STACKS = 3  # the main thread's stack (rasd.net.thread_stacks, docs/protocol.md "STACKS")
    STACKS_ALL = 4  # every thread's stack
    REACH = 5  # a reachability gather's (suspicion.py): who answers, an empty ``ProcessData`` each, folded as STATUS


#: The largest answer a process contributes to a gather other than STATUS (its two parts together); a provider's
#: longer answer is dropped (the process then answers empty). NCCL bounds its diagnostics payload per rank the same
#: way (16 KiB of NCCL_*).
MAX_ANSWER_BYTES = 64 * 1024


class FloodKind(enum.IntEnum):
    DEAD = 1
    LEFT = 2
    HUNG = 3
    RECOVERED = 4
    OUTVOTED = 5  # the subject's side of a healed partition outnumbers the origin's, and holds it dead
    SUSPECT = 6  # the origin cannot reach the subject since a silence death nearby: has anybody heard it?
    HEARD = 7  # a SUSPECT answered: the origin had bytes from the subject within the dead limit (or is the subject)


# ----------------------------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Hello:
    nonce: bytes


@dataclass(frozen=True)
class Challenge:
    nonce: bytes
    mac: bytes


@dataclass(frozen=True)
class Proof:
    mac: bytes


@dataclass(frozen=True)
class ConnInit:
    info: PeerInfo
    peers_hash: int
    dead_hash: int
    # A reunion probe (docs/architecture.md 2.7): the connector holds the acceptor dead and says how large its own
    # side is: how many processes answered its last reachability gather, itself included (0: not measured lately),
    # and the lowest address among them.
    side_live: int = 0
    side_lowest: Addr | None = None


@dataclass(frozen=True)
class ConnInitAck:
    nack: Nack
    info: PeerInfo | None = None  # the acceptor's own entry, so the connector can check whom it reached


@dataclass(frozen=True)
class Keepalive:
    peers_hash: int
    dead_hash: int
    wanted: bool  # the sender uses this connection as one of its links
    clock: float = 0.0  # the sender's monotonic clock when it sent this (stamps in HUNG/RECOVERED floods compare it)


@dataclass(frozen=True)
class PeersUpdate:
    peers: tuple[PeerInfo, ...]
    dead: tuple[PeerKey, ...]  # processes, not addresses: a newer incarnation at a dead one's address is alive
    left: tuple[PeerKey, ...]
    full: bool  # the sender's whole table (a hash mismatch) rather than a diff to pass on


@dataclass(frozen=True)
class Flood:
    """A broadcast with no reply: a verdict about ``subject``, passed on by every node that did not know it."""

    origin: Addr
    flood_id: int
    kind: FloodKind
    subject: Addr
    incarnation: int
    # HUNG: the subject's clock in the last keepalive the origin had from it; RECOVERED and HEARD: the same, from a
    # node that hears it. A refutation must be fresher than the verdict on the subject's own clock (liveness.py).
    stamp: float = 0.0


@dataclass(frozen=True)
class CollReq:
    root: Addr
    coll_id: int
    timeout_ms: int  # 0: no collective-level timeout
    ask: Ask = Ask.STATUS


@dataclass(frozen=True)
class CollResp:
    """A gather's answer from one leg: ``count`` entries, as bytes (``raw``). A STATUS or SWEEP gather's are a
    ``Fold``: the processes' own records, kept encoded, and their communicator ranks folded by state; a relay
    merges its legs' folds into its own without decoding a process or a rank, and only the root decodes them, once.
    Any other gather's are ``Answers``: per process its address and ``Answer``, each distinct shared part carried
    once, which a relay merges without reading a part."""

    root: Addr
    coll_id: int
    leg_timeouts: int
    count: int
    raw: bytes

    @property
    def fold(self) -> Fold:
        """The entries of a STATUS or SWEEP gather: a ``Fold`` (a ``ProtocolError`` if it is malformed)."""
        return Fold.decode(self.count, self.raw)

    @property
    def entries(self) -> tuple[tuple[Addr, ProcessData], ...]:
        """The entries of a STATUS or SWEEP gather, each process's data whole (its communicators unfolded)."""
        return self.fold.entries()

    @property
    def answer_set(self) -> Answers:
        """The entries of any other gather: an ``Answers`` (a ``ProtocolError`` if it is malformed)."""
        return Answers.decode(self.count, self.raw)

    @property
    def answers(self) -> tuple[tuple[Addr, Answer], ...]:
        """The entries of any other gather: (address, answer) each, decoded likewise."""
        return self.answer_set.answers()


def collresp(
    root: Addr, coll_id: int, leg_timeouts: int, entries: tuple[tuple[Addr, ProcessData], ...] = ()
) -> CollResp:
    """A STATUS gather's ``CollResp`` from decoded entries."""
    fold = Fold()
    for addr, data in entries:
        fold.add(addr, data)
    return CollResp(root, coll_id, leg_timeouts, fold.count, fold.encode())


@dataclass(frozen=True)
class CommVerdict:
    """A flooded communicator verdict: stuck (with its attribution) or cleared. Re-flooded by the sweeper every
    sweep while it stands."""

    origin: Addr
    flood_id: int
    stuck: bool
    verdict: StuckVerdict


Message = (
    CommVerdict
    | Hello
    | Challenge
    | Proof
    | ConnInit
    | ConnInitAck
    | Keepalive
    | PeersUpdate
    | Flood
    | CollReq
    | CollResp
)

# ----------------------------------------------------------------------------------------------------------------
# Encoding primitives


class _Writer:
    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def fmt(self, fmt: str, *values: object) -> None:
        self.parts.append(_struct(fmt).pack(*values))

    def text(self, s: str) -> None:
        b = s.encode("utf-8")
        if len(b) > 255:
            raise ValueError("string too long for the wire")
        self.parts.append(bytes([len(b)]) + b)

    def addr(self, a: Addr) -> None:
        self.parts.append(_packed_addr(a))

    def raw(self, b: bytes) -> None:
        self.parts.append(b)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def fmt(self, fmt: str) -> tuple[Any, ...]:
        s = _struct(fmt)
        start = self.pos
        if start + s.size > len(self.buf):
            raise ProtocolError("message truncated")
        self.pos = start + s.size
        return s.unpack_from(self.buf, start)

    def one(self, fmt: str) -> int:
        value: int = self.fmt(fmt)[0]
        return value

    def u8(self) -> int:
        """``one("B")``, without the format: counts, lengths and flags are mostly single bytes."""
        if self.pos >= len(self.buf):
            raise ProtocolError("message truncated")
        self.pos += 1
        return self.buf[self.pos - 1]

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise ProtocolError("message truncated")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(b)

    def text(self) -> str:
        n = self.u8()
        try:
            return self.raw(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError("invalid utf-8 in a string") from e

    def addr(self) -> Addr:
        """``u8 n``, ``n`` bytes of IP, ``u16 port``: what ``_Writer.addr`` writes."""
        n = self.u8()
        if n not in (4, 16):
            raise ProtocolError(f"bad address length {n}")
        return _unpacked_addr(self.raw(n + 2))

    def count(self, fmt: str, min_item_size: int) -> int:
        n = self.one(fmt)
        if n * min_item_size > len(self.buf) - self.pos:
            raise ProtocolError("list longer than the message")
        return n

    def boolean(self) -> bool:
        v = self.u8()
        if v > 1:
            raise ProtocolError("bad boolean")
        return bool(v)

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"{len(self.buf) - self.pos} trailing bytes")


# Every frame carries addresses and the same few hundred recur: parsing and formatting IPs is the slowest part of
# encoding and decoding, so both directions are memoised (bounded; errors are raised, never cached).
@functools.lru_cache(maxsize=1 << 16)
def _packed_ip(host: str) -> bytes:
    return ipaddress.ip_address(host).packed


@functools.lru_cache(maxsize=1 << 16)
def _ip_text(packed: bytes) -> str:
    return str(ipaddress.ip_address(packed))


@functools.lru_cache(maxsize=1 << 16)
def _packed_addr(a: Addr) -> bytes:
    """An address as ``_Writer.addr`` writes it: ``u8 n``, the ``n`` bytes of the IP, ``u16 port``."""
    packed = _packed_ip(a.host)
    return bytes([len(packed)]) + packed + _U16.pack(a.port)


@functools.lru_cache(maxsize=1 << 12)  # the recurring addresses of floods and gathers; a table's are in _PEERS
def _unpacked_addr(ip_and_port: bytes) -> Addr:
    """The reverse of ``_packed_addr``, less its length byte (checked by the caller)."""
    (port,) = _U16.unpack_from(ip_and_port, len(ip_and_port) - 2)
    return Addr(_ip_text(ip_and_port[:-2]), port)


# The field formats recur (a few dozen, plus lists' lengths): each is compiled once. Bounded, as the lengths of the
# lists a peer sends are its choice.
@functools.lru_cache(maxsize=1024)
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct("!" + fmt)


_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_FRAME_HEAD = struct.Struct("!IBB")  # length, version, type


E = TypeVar("E", bound=enum.Enum)


def _enum(cls: type[E], value: int) -> E:
    # What ``cls(value)`` looks up first, without raising and catching a ValueError for every bad value.
    member = cls._value2member_map_.get(value)
    if member is None:
        raise ProtocolError(f"bad {cls.__name__} {value}")
    return cast(E, member)


def _put_peer(w: _Writer, p: PeerInfo) -> None:
    w.raw(_peer_bytes(p))


#: Decoded table entries by their bytes, and the bytes of each entry encoded: a node hears every entry of the job
#: several times at start-up (a diff and a whole table from each of its links), and decoding an entry costs about
#: 10 us where a cached one costs 1 (docs/architecture.md §11). Bounded, cleared when full: 16,384 entries cost
#: about 2 MB each, so a node of 100,000 processes keeps its table within its memory budget. The simulator, whose
#: nodes share one process and these caches, raises the bound.
PEER_CACHE_MAX = 1 << 14
_PEERS: dict[bytes, PeerInfo] = {}
_PEER_BYTES: dict[PeerInfo, bytes] = {}


def _peer_bytes(p: PeerInfo) -> bytes:
    b = _PEER_BYTES.get(p)
    if b is None:
        w = _Writer()
        w.addr(p.addr)
        w.fmt("IQi", p.pid, p.incarnation, p.rank)
        w.text(p.hostname)
        w.fmt("B", len(p.devices))
        w.raw(bytes(p.devices))
        b = w.getvalue()
        if len(_PEER_BYTES) >= PEER_CACHE_MAX:
            _PEER_BYTES.clear()
        _PEER_BYTES[p] = b
    return b


def _get_peer(r: _Reader) -> PeerInfo:
    buf, start = r.buf, r.pos
    try:
        end = start + buf[start] + 19  # address length, address, port, pid, incarnation, rank
        end += buf[end] + 1  # host name
        end += buf[end] + 1  # devices
    except IndexError:
        raise ProtocolError("message truncated") from None
    raw = bytes(buf[start:end])
    p = _PEERS.get(raw)
    if p is not None and end <= len(buf):
        r.pos = end
        return p
    p = _parse_peer(r)
    if r.pos == end:
        if len(_PEERS) >= PEER_CACHE_MAX:
            _PEERS.clear()
        _PEERS[raw] = p
    return p


@functools.lru_cache(maxsize=1 << 10)
def _devices(raw: bytes) -> tuple[int, ...]:
    # Shared: the same few device lists recur across the whole table.
    return tuple(raw)


def _parse_peer(r: _Reader) -> PeerInfo:
    addr = r.addr()
    pid, incarnation, rank = r.fmt("IQi")
    hostname = sys.intern(r.text())  # the processes of a host share one
    devices = _devices(r.raw(r.one("B")))
    if addr.port == 0:
        raise ProtocolError("peer with port 0")
    return PeerInfo(addr=addr, pid=pid, hostname=hostname, incarnation=incarnation, devices=devices, rank=rank)


def _get_key(r: _Reader) -> PeerKey:
    """A process in a dead or departed list: its address, then its incarnation (``u64``)."""
    addr = r.addr()
    return PeerKey(addr, r.one("Q"))


def _put_position(w: _Writer, position: Position) -> None:
    """``u8 n``, then each frame: the file, ``u32 line``, the function (the innermost ``POSITION_FRAMES``)."""
    position = position[-POSITION_FRAMES:]
    w.fmt("B", len(position))
    for f in position:
        w.text(_fitted(f.file))
        w.fmt("I", f.line)
        w.text(_fitted(f.function))


def _get_position(r: _Reader) -> Position:
    n = r.u8()
    if n > POSITION_FRAMES:
        raise ProtocolError(f"a position of {n} frames")
    frames = []
    for _ in range(n):
        file = r.text()
        line = r.one("I")
        frames.append(Frame(file, line, r.text()))
    return tuple(frames)


def _fitted(text: str) -> str:
    """``text`` within a wire string's 255 UTF-8 bytes (cut at a character boundary)."""
    data = text.encode("utf-8")
    return text if len(data) <= 255 else data[:255].decode("utf-8", "ignore")


def _put_positions(w: _Writer, positions: Positions) -> None:
    positions = positions[:255]
    w.fmt("B", len(positions))
    for rank, position in positions:
        w.fmt("i", rank)
        _put_position(w, position)


def _get_positions(r: _Reader) -> Positions:
    return tuple((r.one("i"), _get_position(r)) for _ in range(r.u8()))


def _put_process_data(w: _Writer, data: ProcessData) -> None:
    if not data.comms and data.restart is None and not data.where and data.work is None:
        # What most processes send, in one pack: the same bytes as below.
        w.fmt("IBBB", 0, False, data.waiting, 0)
        return
    w.fmt("I", len(data.comms))
    for c in data.comms:
        w.fmt("QIH", c.comm_hash, c.size, len(c.rank_map))
        for first, count, step in c.rank_map:
            w.fmt("iIi", first, count, step)
        w.fmt("I", len(c.ranks))
        for rk in c.ranks:
            flags = int(rk.finalize_called) | int(rk.destroy_flag) << 1 | int(rk.abort_flag) << 2
            w.fmt("IBBBhB", rk.comm_rank, rk.init_state, rk.async_error, flags, rk.device, len(rk.launched))
            w.fmt(f"{len(rk.launched)}Q", *rk.launched)
            w.fmt(f"{len(rk.completed)}Q", *rk.completed)
            w.fmt("I", min(rk.idle_ms, 0xFFFFFFFF))
    _put_restart(w, data.restart)
    # The waiting byte's bit 1 says a work record follows the position: what most processes send stays 7 bytes.
    w.fmt("B", data.waiting | (data.work is not None) << 1)
    _put_position(w, data.where)
    if data.work is not None:
        _put_work(w, data.work)


def _put_work(w: _Writer, work: Work) -> None:
    """The idle age, the phase's limit and age (``u32`` milliseconds each), then the phase's name."""
    w.fmt("III", work.idle_ms, work.phase_limit_ms, work.phase_ms)
    w.text(_fitted(work.phase))


def _get_work(r: _Reader) -> Work:
    idle_ms, phase_limit_ms, phase_ms = r.fmt("III")
    return Work(idle_ms=idle_ms, phase=r.text(), phase_limit_ms=phase_limit_ms, phase_ms=phase_ms)


def _put_restart(w: _Writer, restart: RestartRecord | None) -> None:
    """``u8 present``, then iteration, restarts, seconds lost, the cause and the terminated ranks."""
    w.fmt("B", restart is not None)
    if restart is None:
        return
    w.fmt("IId", restart.iteration, restart.restarts, restart.seconds_lost)
    w.text(restart.cause)
    w.fmt("I", len(restart.terminated))
    if restart.terminated:
        w.fmt(f"{len(restart.terminated)}i", *restart.terminated)


def _get_restart(r: _Reader) -> RestartRecord | None:
    if not r.boolean():
        return None
    iteration, restarts, seconds_lost = r.fmt("IId")
    cause = r.text()
    terminated = r.fmt(f"{r.count('I', 4)}i")
    # What ``comms.next_restart`` makes: a finite time lost, ranks non-negative, unique and ascending.
    if (
        not 0 <= seconds_lost < float("inf")
        or any(rank < 0 for rank in terminated)
        or list(terminated) != sorted(set(terminated))
    ):
        raise ProtocolError("bad restart record")
    return RestartRecord(
        iteration=iteration, restarts=restarts, cause=cause, terminated=terminated, seconds_lost=seconds_lost
    )


_RANK_HEAD = struct.calcsize("!IBBBhB")
#: What most processes send (no communicator, no restart; waiting or not), decoded once: a gather carries one entry
#: per process of the job. The values are frozen, so every entry may share them.
_BARE_DATA = {bytes(7): ProcessData(), bytes(5) + b"\x01\x00": ProcessData(waiting=True)}


_COUNTS = struct.Struct(f"!{N_OPS}Q")
_COUNTS_BYTES = _COUNTS.size


@functools.lru_cache(maxsize=1 << 12)
def _counts(raw: bytes) -> tuple[int, ...]:
    # Shared: the ranks of a job mostly hold the same counters, so a gather's root (100,000 entries) keeps one tuple
    # per distinct set of counters, not two per rank (docs/architecture.md §11).
    return cast(tuple[int, ...], _COUNTS.unpack(raw))


def _get_process_data(r: _Reader) -> ProcessData:
    bare = _BARE_DATA.get(bytes(r.buf[r.pos : r.pos + 7]))
    if bare is not None:
        r.pos += 7
        return bare
    comms = []
    for _ in range(r.count("I", 18)):
        comm_hash, size, nruns = r.fmt("QIH")
        runs = tuple(r.fmt("iIi") for _ in range(nruns))
        ranks = []
        for _ in range(r.count("I", _RANK_HEAD)):
            comm_rank, init_state, async_error, flags, device, nops = r.fmt("IBBBhB")
            if nops != N_OPS or flags > 7:
                raise ProtocolError("bad rank record")
            launched = _counts(r.raw(_COUNTS_BYTES))
            completed = _counts(r.raw(_COUNTS_BYTES))
            idle_ms = r.one("I")
            ranks.append(
                RankRecord(
                    comm_rank,
                    init_state,
                    async_error,
                    bool(flags & 1),
                    bool(flags & 2),
                    bool(flags & 4),
                    device,
                    launched,
                    completed,
                    idle_ms,
                )
            )
        comms.append(CommRecord(comm_hash=comm_hash, size=size, ranks=tuple(ranks), rank_map=runs))
    restart = _get_restart(r)
    flags = r.u8()
    if flags > 3:
        raise ProtocolError("bad process flags")
    where = _get_position(r)
    work = _get_work(r) if flags & 2 else None
    return ProcessData(comms=tuple(comms), restart=restart, waiting=bool(flags & 1), where=where, work=work)


# ----------------------------------------------------------------------------------------------------------------
# Messages <-> bytes


def encode(msg: Message) -> bytes:
    """One whole frame, length prefix included."""
    w = _Writer()
    if isinstance(msg, Hello):
        t = MsgType.HELLO
        w.raw(MAGIC)
        w.raw(_fixed(msg.nonce, NONCE_LEN))
    elif isinstance(msg, Challenge):
        t = MsgType.CHALLENGE
        w.raw(_fixed(msg.nonce, NONCE_LEN))
        w.raw(_fixed(msg.mac, MAC_LEN))
    elif isinstance(msg, Proof):
        t = MsgType.PROOF
        w.raw(_fixed(msg.mac, MAC_LEN))
    elif isinstance(msg, ConnInit):
        t = MsgType.CONNINIT
        _put_peer(w, msg.info)
        w.fmt("QQB", msg.peers_hash, msg.dead_hash, msg.side_lowest is not None)
        if msg.side_lowest is not None:
            w.fmt("I", msg.side_live)
            w.addr(msg.side_lowest)
    elif isinstance(msg, ConnInitAck):
        t = MsgType.CONNINITACK
        w.fmt("BB", int(msg.nack), msg.info is not None)
        if msg.info is not None:
            _put_peer(w, msg.info)
    elif isinstance(msg, Keepalive):
        t = MsgType.KEEPALIVE
        w.fmt("QQBd", msg.peers_hash, msg.dead_hash, int(msg.wanted), msg.clock)
    elif isinstance(msg, PeersUpdate):
        t = MsgType.PEERSUPDATE
        w.fmt("BI", int(msg.full), len(msg.peers))
        for p in msg.peers:
            _put_peer(w, p)
        for group in (msg.dead, msg.left):
            w.fmt("I", len(group))
            for key in group:
                w.addr(key.addr)
                w.fmt("Q", key.incarnation)
    elif isinstance(msg, Flood):
        t = MsgType.FLOOD
        w.addr(msg.origin)
        w.fmt("QB", msg.flood_id, int(msg.kind))
        w.addr(msg.subject)
        w.fmt("Qd", msg.incarnation, msg.stamp)
    elif isinstance(msg, CollReq):
        t = MsgType.COLLREQ
        w.addr(msg.root)
        w.fmt("QIB", msg.coll_id, msg.timeout_ms, int(msg.ask))
    elif isinstance(msg, CollResp):
        t = MsgType.COLLRESP
        w.addr(msg.root)
        w.fmt("QII", msg.coll_id, msg.leg_timeouts, msg.count)
        w.raw(msg.raw)
    elif isinstance(msg, CommVerdict):
        t = MsgType.COMMVERDICT
        w.addr(msg.origin)
        v = msg.verdict
        w.fmt("QBQBQ", msg.flood_id, int(msg.stuck), v.comm_hash, v.op, v.seq)
        for ranks, fmt in ((v.behind, "I"), (v.inside, "I"), (v.global_behind, "i"), (v.global_inside, "i")):
            w.fmt("I", len(ranks))
            if ranks:
                w.fmt(f"{len(ranks)}{fmt}", *ranks)
        _put_positions(w, v.positions)
        w.fmt("BIII", v.slow, min(v.stood_ms, 0xFFFFFFFF), min(v.limit_ms, 0xFFFFFFFF), len(v.busy))
        if v.busy:
            w.fmt(f"{len(v.busy)}I", *v.busy)
        w.text(_fitted(v.phase))
    else:  # pragma: no cover - a programming error, not bad input
        raise TypeError(f"not a message: {msg!r}")
    fields = w.getvalue()
    return _FRAME_HEAD.pack(2 + len(fields), VERSION, t) + fields


@functools.lru_cache(maxsize=1 << 12)
def flood_frame(msg: Flood | CommVerdict) -> bytes:
    """``encode(msg)``, memoised: a verdict flood reaches every node and each passes it on to all its other
    connections, so a relay hands on the frame it was made from (or first made) rather than encoding it again."""
    return encode(msg)


@functools.lru_cache(maxsize=1 << 10)
def keepalive_frame(peers_hash: int, dead_hash: int, wanted: bool, clock: float) -> bytes:
    """``encode(Keepalive(peers_hash, dead_hash, wanted, clock))``, memoised: every node sends one on each of its links
    every keepalive, and in a settled job they all carry the same two hashes (and, within one keepalive interval,
    the same clock: ``links.Links.keepalives`` rounds it down to the interval)."""
    return encode(Keepalive(peers_hash, dead_hash, wanted, clock))


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ProtocolError("clock not a finite number")
    return x


def _fixed(b: bytes, n: int) -> bytes:
    if len(b) != n:
        raise ValueError(f"expected {n} bytes, got {len(b)}")
    return b


# The same small frames recur: every keepalive of a settled job carries the same two hashes, and a flood or a gather
# request reaches a node from each of its neighbours, byte for byte the same. Messages are frozen, so one decoded
# message may be handed out again (bounded; errors are raised, never cached).
_RECURRING_MAX = 64


def decode_body(body: bytes) -> Message:
    """Decode one frame's body (version, type, fields). Raises ProtocolError on anything malformed."""
    if len(body) <= _RECURRING_MAX:
        return _decode_recurring(bytes(body))
    return _decode(body)


@functools.lru_cache(maxsize=1 << 12)
def _decode_recurring(body: bytes) -> Message:
    return _decode(body)


def _decode(body: bytes) -> Message:
    if len(body) < 2:
        raise ProtocolError("frame too short")
    if body[0] != VERSION:
        raise ProtocolError(f"unsupported wire version {body[0]}")
    t = _enum(MsgType, body[1])
    r = _Reader(body, 2)
    msg: Message
    if t is MsgType.HELLO:
        if r.raw(len(MAGIC)) != MAGIC:
            raise ProtocolError("bad magic")
        msg = Hello(r.raw(NONCE_LEN))
    elif t is MsgType.CHALLENGE:
        msg = Challenge(r.raw(NONCE_LEN), r.raw(MAC_LEN))
    elif t is MsgType.PROOF:
        msg = Proof(r.raw(MAC_LEN))
    elif t is MsgType.CONNINIT:
        info = _get_peer(r)
        peers_hash, dead_hash = r.fmt("QQ")
        if r.boolean():
            side_live = r.one("I")
            msg = ConnInit(info, peers_hash, dead_hash, side_live, r.addr())
        else:
            msg = ConnInit(info, peers_hash, dead_hash)
    elif t is MsgType.CONNINITACK:
        nack = _enum(Nack, r.one("B"))
        msg = ConnInitAck(nack, _get_peer(r) if r.boolean() else None)
    elif t is MsgType.KEEPALIVE:
        peers_hash, dead_hash = r.fmt("QQ")
        wanted = r.boolean()
        msg = Keepalive(peers_hash, dead_hash, wanted, _finite(r.one("d")))
    elif t is MsgType.PEERSUPDATE:
        full = r.boolean()
        peers = tuple(_get_peer(r) for _ in range(r.count("I", 20)))
        dead = tuple(_get_key(r) for _ in range(r.count("I", 15)))
        left = tuple(_get_key(r) for _ in range(r.count("I", 15)))
        msg = PeersUpdate(peers, dead, left, full)
    elif t is MsgType.FLOOD:
        origin = r.addr()
        flood_id, kind = r.fmt("QB")
        subject = r.addr()
        incarnation, stamp = r.fmt("Qd")
        msg = Flood(origin, flood_id, _enum(FloodKind, kind), subject, incarnation, _finite(stamp))
    elif t is MsgType.COLLREQ:
        root = r.addr()
        coll_id, timeout_ms, ask = r.fmt("QIB")
        msg = CollReq(root, coll_id, timeout_ms, _enum(Ask, ask))
    elif t is MsgType.COMMVERDICT:
        origin = r.addr()
        flood_id, stuck, comm_hash, op, seq = r.fmt("QBQBQ")
        if stuck > 1 or op >= N_OPS:
            raise ProtocolError("bad communicator verdict")
        behind, inside, global_behind, global_inside = (r.fmt(f"{r.count('I', 4)}{fmt}") for fmt in "IIii")
        positions = _get_positions(r)
        slow, stood_ms, limit_ms = r.fmt("BII")
        if slow > 1:
            raise ProtocolError("bad communicator verdict")
        busy = r.fmt(f"{r.count('I', 4)}I")
        verdict = StuckVerdict(
            comm_hash,
            op,
            seq,
            behind,
            inside,
            global_behind,
            global_inside,
            positions=positions,
            slow=bool(slow),
            busy=busy,
            phase=r.text(),
            stood_ms=stood_ms,
            limit_ms=limit_ms,
        )
        msg = CommVerdict(origin, flood_id, bool(stuck), verdict)
    else:  # COLLRESP
        root = r.addr()
        coll_id, leg_timeouts, n = r.fmt("QII")
        if n * 11 > len(body):
            raise ProtocolError("list longer than the message")
        # The entries stay encoded: the root decodes them (``CollResp.entries``), a relay passes them on.
        msg = CollResp(root, coll_id, leg_timeouts, n, r.raw(len(body) - r.pos))
    r.done()
    return msg


def encode_entry(addr: Addr, data: ProcessData) -> bytes:
    """One gather entry, as a ``CollResp`` carries it."""
    w = _Writer()
    w.addr(addr)
    _put_process_data(w, data)
    return w.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# Answers: the entries of a gather of any ask but STATUS, SWEEP and REACH
#
#     u32 shared parts, then each: u32 length and the part
#     ``count`` entries, each: the address, u32 its shared part's index (0xFFFFFFFF: none), u32 length and its own part
#
# A relay adds its legs' answers to its own: a shared part it already holds is not carried twice, and an entry's index
# is moved to the relay's numbering of the parts (one integer per entry); neither part is ever read by the core.

_NO_SHARED = 0xFFFFFFFF
_ENTRY_HEAD = struct.Struct("!II")


class Answers:
    """A gather's answers as a relay gathers them and the root reads them: each distinct shared part once, and per
    process its address (packed, as the wire writes it), the index of its shared part and its own part. ``add`` a
    process, ``merge`` a leg's, ``encode`` for the way back; ``answers`` at the root."""

    __slots__ = ("count", "shared", "index", "entries", "size")

    def __init__(self) -> None:
        self.count = 0
        self.shared: list[bytes] = []
        self.index: dict[bytes, int] = {}  # shared part -> its position in ``shared``
        self.entries: list[tuple[bytes, int, bytes]] = []  # (packed address, shared index or _NO_SHARED, own part)
        self.size = 4  # bytes ``encode`` gives

    def _shared_index(self, part: bytes) -> int:
        if not part:
            return _NO_SHARED
        at = self.index.get(part)
        if at is None:
            at = self.index[part] = len(self.shared)
            self.shared.append(part)
            self.size += 4 + len(part)
        return at

    def _put(self, packed: bytes, at: int, own: bytes) -> None:
        self.entries.append((packed, at, own))
        self.count += 1
        self.size += len(packed) + 8 + len(own)

    def add(self, addr: Addr, answer: Answer) -> None:
        if answer.size > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of {answer.size} bytes (at most {MAX_ANSWER_BYTES})")
        self._put(_packed_addr(addr), self._shared_index(answer.shared), answer.own)

    def merge(self, other: Answers) -> None:
        """Add ``other``'s entries after this one's, each shared part once. Into an empty one, ``other``'s are taken
        over as they are (a relay's first leg), and a leg whose shared parts keep their numbers here (they came in
        the same order) is added without touching an entry: along a gather's deep paths most relays have one large
        leg, and the ranks of a job mostly stand in the same few places."""
        if not self.count and not self.shared:
            self.count, self.size = other.count, other.size
            self.shared, self.index, self.entries = list(other.shared), dict(other.index), list(other.entries)
            return
        moved = [self._shared_index(part) for part in other.shared]
        if moved == list(range(len(moved))):
            self.entries += other.entries
            self.count += other.count
            self.size += other.size - 4 - sum(4 + len(part) for part in other.shared)  # its entries' bytes
            return
        put = self._put
        for packed, at, own in other.entries:
            put(packed, _NO_SHARED if at == _NO_SHARED else moved[at], own)

    def encode(self) -> bytes:
        if not self.count:
            return b""  # nothing gathered (a duplicate's answer)
        parts = [_U32.pack(len(self.shared))]
        for part in self.shared:
            parts += (_U32.pack(len(part)), part)
        pack = _ENTRY_HEAD.pack
        for packed, at, own in self.entries:
            parts += (packed, pack(at, len(own)), own)
        return b"".join(parts)

    @classmethod
    def decode(cls, count: int, raw: bytes) -> Answers:
        """``count`` answers from ``raw``, which must hold exactly them, checked as a relay needs: the structure, the
        sizes and the indices (a ``ProtocolError`` if not). The parts themselves are for the root's readers."""
        answers = cls()
        if not count:
            if raw:
                raise ProtocolError(f"{len(raw)} trailing bytes")
            return answers
        end = len(raw)
        try:
            (n_shared,) = _U32.unpack_from(raw, 0)
            pos = 4
            if n_shared * 4 > end - pos:
                raise ProtocolError("list longer than the message")
            for _ in range(n_shared):
                (length,) = _U32.unpack_from(raw, pos)
                stop = pos + 4 + length
                if length == 0 or length > MAX_ANSWER_BYTES or stop > end:
                    raise ProtocolError("a shared part empty, too long or truncated")
                part = raw[pos + 4 : stop]
                if part in answers.index:
                    raise ProtocolError("a shared part twice")
                answers.index[part] = len(answers.shared)
                answers.shared.append(part)
                pos = stop
            for _ in range(count):
                n = raw[pos] if pos < end else 0
                if n not in (4, 16):
                    raise ProtocolError(f"bad address length {n}" if pos < end else "message truncated")
                packed = raw[pos : pos + n + 3]
                at, length = _ENTRY_HEAD.unpack_from(raw, pos + n + 3)
                pos += n + 11
                stop = pos + length
                if (at != _NO_SHARED and at >= n_shared) or length > MAX_ANSWER_BYTES or stop > end:
                    raise ProtocolError("an answer of a shared part not held, too long or truncated")
                if at != _NO_SHARED and length + len(answers.shared[at]) > MAX_ANSWER_BYTES:
                    raise ProtocolError("an answer too long")
                answers.entries.append((packed, at, raw[pos:stop]))
                pos = stop
        except struct.error as e:
            raise ProtocolError("message truncated") from e
        if pos != end:
            raise ProtocolError(f"{end - pos} trailing bytes")
        answers.count = count
        answers.size = end
        return answers

    def answers(self) -> tuple[tuple[Addr, Answer], ...]:
        """Each process's address and answer; the processes of one shared part share its bytes object."""
        shared = self.shared
        return tuple(
            (_unpacked_addr(packed[1:]), Answer(b"" if at == _NO_SHARED else shared[at], own))
            for packed, at, own in self.entries
        )


# ----------------------------------------------------------------------------------------------------------------
# Folds: a STATUS or SWEEP gather's entries (fold.py)
#
#     u32 length of the processes' records, then ``count`` records: the address and the process's data less its
#         communicators (what ``_put_process_data`` writes of a process holding none)
#     u32 states, then each: u16 length and the state (``_put_state``), u32 rows, and four columns of that many
#         little-endian integers: u32 process (an index into this fold's records), u32 communicator rank,
#         i16 device, u32 idle ms
#
# Columns, not rows: a relay merges a leg's fold into its own by adding an offset to one column (one integer
# addition for the whole column: ``fold.raised``) and copying the rest as it came, without reading a row; the root
# reads each column in one call (``array.frombytes``).

#: The columns' array type codes, their widths on the wire fixed whatever the platform's.
_COLUMNS = (("I", 4), ("I", 4), ("h", 2), ("I", 4))
_ROW_BYTES = sum(width for _, width in _COLUMNS)
_SWAP = sys.byteorder == "big"  # the columns are little-endian
_STATE_HEAD = struct.Struct("!QIH")
_STATE_FLAGS = struct.Struct("!BBBB")


def _columns_ok() -> bool:
    return all(array(code).itemsize == width for code, width in _COLUMNS)


if not _columns_ok():  # pragma: no cover - every platform CPython runs on has 2- and 4-byte C ints
    raise ImportError("rasd.core.wire needs 2-byte shorts and 4-byte ints")


def _put_state(state: RankState) -> bytes:
    w = _Writer()
    w.raw(_STATE_HEAD.pack(state.comm_hash, state.size, len(state.rank_map)))
    for first, count, step in state.rank_map:
        w.fmt("iIi", first, count, step)
    flags = int(state.finalize_called) | int(state.destroy_flag) << 1 | int(state.abort_flag) << 2
    w.raw(_STATE_FLAGS.pack(state.init_state, state.async_error, flags, len(state.launched)))
    w.raw(_COUNTS.pack(*state.launched))
    w.raw(_COUNTS.pack(*state.completed))
    return w.getvalue()


_STATE_RUN = struct.Struct("!iIi")


@functools.lru_cache(maxsize=1 << 12)
def _get_state(raw: bytes) -> RankState:
    # A job's ranks share few states, and every gather brings the same ones again: decoded once each. Read with
    # whole structs, not a field at a time: a job of 100,000 processes has 12,500 tensor-parallel states.
    head, run, flags_at = _STATE_HEAD.size, _STATE_RUN.size, _STATE_FLAGS.size
    try:
        comm_hash, size, nruns = _STATE_HEAD.unpack_from(raw, 0)
        pos = head + run * nruns
        runs = cast(tuple[tuple[int, int, int], ...], tuple(_STATE_RUN.iter_unpack(raw[head:pos])))
        init_state, async_error, flags, nops = _STATE_FLAGS.unpack_from(raw, pos)
    except struct.error as e:
        raise ProtocolError("message truncated") from e
    pos += flags_at
    if nops != N_OPS or flags > 7:
        raise ProtocolError("bad rank state")
    if len(runs) != nruns or pos + 2 * _COUNTS_BYTES > len(raw):
        raise ProtocolError("message truncated")
    if pos + 2 * _COUNTS_BYTES != len(raw):
        raise ProtocolError(f"{len(raw) - pos - 2 * _COUNTS_BYTES} trailing bytes")
    return RankState(
        comm_hash,
        size,
        runs,
        init_state,
        async_error,
        bool(flags & 1),
        bool(flags & 2),
        bool(flags & 4),
        _counts(raw[pos : pos + _COUNTS_BYTES]),
        _counts(raw[pos + _COUNTS_BYTES : pos + 2 * _COUNTS_BYTES]),
    )


def _state_bytes(state: RankState) -> bytes:
    if len(state.launched) != N_OPS or len(state.completed) != N_OPS:
        raise ValueError(f"a rank's counters are {N_OPS} per op type")
    return _put_state(state)


#: A fold decoded (``Fold.decoded``): each process's address, and its data less its communicators, and its ranks by
#: state, each member's process an index into those lists.
Decoded = tuple[list[Addr], list[ProcessData], States]


def _new_columns() -> list[array[int]]:
    return [array(code) for code, _ in _COLUMNS]


def _block(columns: list[array[int]]) -> bytes:
    """Rows as the wire carries them: each column's little-endian integers, one column after the other."""
    if _SWAP:
        columns = [array(c.typecode, c) for c in columns]
        for c in columns:
            c.byteswap()
    return b"".join(c.tobytes() for c in columns)


def _joined(blocks: list[bytes]) -> bytes:
    """One block of the rows of ``blocks``, in their order: each column of every block, then the next column."""
    if len(blocks) == 1:
        return blocks[0]
    rows = [len(b) // _ROW_BYTES for b in blocks]
    parts: list[bytes] = []
    start = 0
    for _, width in _COLUMNS:
        parts += [b[r * start : r * (start + width)] for b, r in zip(blocks, rows, strict=True)]
        start += width
    return b"".join(parts)


def _rebased(block: bytes, offset: int) -> bytes:
    """``block`` with ``offset`` added to each row's process index (``fold.raised``, on the little-endian column)."""
    end = 4 * (len(block) // _ROW_BYTES)
    return raised(block[:end], offset, "little") + block[end:]


def _records(buf: bytes, count: int) -> tuple[list[Addr], list[ProcessData]]:
    """The addresses and data of ``count`` process records (a fold's), one after the other in ``buf``."""
    r = _Reader(buf)
    addrs: list[Addr] = []
    datas: list[ProcessData] = []
    bare, ip_text, new_addr, end = _BARE_DATA.get, _ip_text, tuple.__new__, len(buf)
    for _ in range(count):
        # ``_Reader.addr`` and ``_get_process_data`` inlined for what most processes send, an address and no
        # restart or position (the root reads one per process of the job: docs/architecture.md §11).
        pos = r.pos
        n = buf[pos] if pos < end else 0
        if n not in (4, 16) or pos + n + 3 > end:
            addrs.append(r.addr())  # raises ProtocolError, as the reader does
        else:
            addrs.append(
                new_addr(Addr, (ip_text(buf[pos + 1 : pos + 1 + n]), buf[pos + 1 + n] << 8 | buf[pos + 2 + n]))
            )
            r.pos = pos + n + 3
        data = bare(buf[r.pos : r.pos + 7])
        if data is None:
            data = _get_process_data(r)
            if data.comms:
                raise ProtocolError("communicators outside the fold")
        else:
            r.pos += 7
        datas.append(data)
    r.done()
    return addrs, datas


#: A process record of an IPv4 address and no restart, position or waiting flag: 14 bytes (``_records``).
_IPV4_BARE = struct.Struct("!B4sH7s")


def _ipv4_bare(buf: bytes, count: int) -> tuple[list[Addr], list[ProcessData]] | None:
    """``_records`` of a fold whose every process has an IPv4 address and sends nothing but its communicators (a
    job without in-process restarts, the common case), read in one call (``Struct.iter_unpack``) instead of a
    record at a time; None where any record is not of that kind (``_records`` reads those). Exact: a buffer of
    ``count`` 14-byte pieces, each an IPv4 address and data that ``_BARE_DATA`` holds, is read as ``_records``
    would read it."""
    if len(buf) != _IPV4_BARE.size * count:
        return None
    rows = list(_IPV4_BARE.iter_unpack(buf))
    bare = _BARE_DATA.get
    datas = [bare(data) for _, _, _, data in rows]
    if None in datas or buf[:: _IPV4_BARE.size].count(4) != count:  # every record's first byte: an IPv4 address
        return None
    ip_text, new_addr = _ip_text, tuple.__new__
    return [new_addr(Addr, (ip_text(ip), port)) for _, ip, port, _ in rows], cast(list[ProcessData], datas)


class Fold:
    """A STATUS or SWEEP gather's entries, as a relay gathers them and the root decodes them (fold.py): the
    processes' records kept encoded, and their ranks by encoded state, in blocks of rows as the wire carries them.
    ``add`` a process, ``merge`` a leg's fold, ``encode`` for the way back; the root turns it into a snapshot's values
    with ``decoded``. A relay never decodes a process, a state or a row: a merge moves a leg's blocks over, their
    process indices raised by one integer addition per block (``_rebased``), so that it costs per state and per byte
    copied, not per rank (docs/architecture.md §4.1)."""

    __slots__ = ("count", "processes", "states", "size")

    def __init__(self) -> None:
        self.count = 0
        self.processes: list[bytes] = []
        #: encoded state -> its blocks of rows (``_block``), process indices into this fold's records
        self.states: dict[bytes, list[bytes]] = {}
        self.size = 8  # bytes ``encode`` gives

    def add(self, addr: Addr, data: ProcessData) -> None:
        """One process's entry: its record, and its ranks folded in under its index."""
        proc = self.count
        record = encode_entry(addr, dataclasses.replace(data, comms=()) if data.comms else data)
        self.processes.append(record)
        self.count += 1
        self.size += len(record)
        rows: dict[bytes, list[array[int]]] = {}
        for comm in data.comms:
            for rank in comm.ranks:
                key = _state_bytes(RankState.of(comm, rank))
                columns = rows.get(key)
                if columns is None:
                    columns = rows[key] = _new_columns()
                for column, value in zip(
                    columns, (proc, rank.comm_rank, rank.device, min(rank.idle_ms, 0xFFFFFFFF)), strict=True
                ):
                    column.append(value)
        for key, columns in rows.items():
            self._put(key, [_block(columns)])

    def _put(self, key: bytes, blocks: list[bytes]) -> None:
        """Add rows under ``key``, their process indices this fold's already. A state's list of blocks is never
        changed in place: a merge into an empty fold takes the other's lists over."""
        held = self.states.get(key)
        if held is None:
            self.states[key] = blocks
            self.size += 6 + len(key)
        else:
            self.states[key] = held + blocks
        self.size += sum(map(len, blocks))

    def merge(self, other: Fold) -> None:
        """Add ``other``'s entries after this one's: its process indices move up by this fold's count. Into an empty
        fold, its entries are taken over as they are, a state at a time (a relay's first leg)."""
        offset = self.count
        if not offset:
            self.processes = list(other.processes)
            self.count, self.size = other.count, other.size
            self.states = dict(other.states)
            return
        self.processes += other.processes
        self.count += other.count
        self.size += sum(map(len, other.processes))
        put = self._put
        for key, blocks in other.states.items():
            put(key, [_rebased(b, offset) for b in blocks] if offset else blocks)

    def encode(self) -> bytes:
        if not self.count:
            return b""  # nothing gathered (a duplicate's answer)
        parts = [_U32.pack(sum(map(len, self.processes))), *self.processes, _U32.pack(len(self.states))]
        for key, blocks in self.states.items():
            block = _joined(blocks)
            parts += (_U16.pack(len(key)), key, _U32.pack(len(block) // _ROW_BYTES), block)
        return b"".join(parts)

    @classmethod
    def decode(cls, count: int, raw: bytes) -> Fold:
        """A fold of ``count`` processes from ``raw``, checked as far as a relay needs: its structure and its process
        indices. The processes' records and the states are checked by the root, which decodes them (``decoded``)."""
        fold = cls()
        if not count:
            if raw:
                raise ProtocolError(f"{len(raw)} trailing bytes")
            return fold  # a duplicate's empty answer
        end = len(raw)
        states = fold.states
        procs: list[bytes] = []
        try:
            (length,) = _U32.unpack_from(raw, 0)
            pos = 4 + length
            records = raw[4:pos]
            (nstates,) = _U32.unpack_from(raw, pos)
            pos += 4
            if pos > end or nstates * 7 > end - pos:
                raise ProtocolError("message truncated")
            for _ in range(nstates):
                (key_length,) = _U16.unpack_from(raw, pos)
                key = raw[pos + 2 : pos + 2 + key_length]
                (rows,) = _U32.unpack_from(raw, pos + 2 + key_length)
                pos += 6 + key_length
                stop = pos + rows * _ROW_BYTES
                if not rows or key in states or stop > end:
                    raise ProtocolError("a state twice, none of its ranks, or truncated")
                procs.append(raw[pos : pos + 4 * rows])
                states[key] = [raw[pos:stop]]
                pos = stop
        except struct.error as e:
            raise ProtocolError("message truncated") from e
        if pos != end:
            raise ProtocolError(f"{end - pos} trailing bytes" if pos < end else "message truncated")
        indices = array("I", b"".join(procs))  # every state's process column, checked in one pass
        if _SWAP:
            indices.byteswap()
        if indices and max(indices) >= count:
            raise ProtocolError("a rank of a process the fold does not hold")
        fold.processes = [records]
        fold.count = count
        fold.size = end
        return fold

    def decoded(self, known: dict[bytes, RankState] | None = None) -> Decoded:
        """Each process's address and data (without communicators), and the ranks by state, their process an index
        into those lists (a ``ProtocolError`` if a record or a state is malformed). ``known``: the states decoded
        so far (by encoded state), used and added to: a gather's legs bring the same states. The members' columns
        are this fold's own arrays, typed as on the wire."""
        buf = b"".join(self.processes)
        records = _ipv4_bare(buf, self.count)
        if records is not None:
            addrs, datas = records
        else:
            addrs, datas = _records(buf, self.count)
        states: States = {}
        if known is None:
            known = {}
        for key, blocks in self.states.items():
            state = known.get(key)
            if state is None:
                state = known[key] = _get_state(key)
            block = _joined(blocks)
            rows = len(block) // _ROW_BYTES
            columns = _new_columns()
            start = 0
            for column, (_, width) in zip(columns, _COLUMNS, strict=True):
                column.frombytes(block[rows * start : rows * (start + width)])
                if _SWAP:
                    column.byteswap()
                start += width
            states[state] = Members(*columns)
        return addrs, datas, states

    def entries(self) -> tuple[tuple[Addr, ProcessData], ...]:
        """Each process's address and whole data, its communicators unfolded (``fold.unfold``)."""
        addrs, datas, states = self.decoded()
        comms = unfold(states, len(addrs))
        return tuple(
            (addr, dataclasses.replace(data, comms=held) if held else data)
            for addr, data, held in zip(addrs, datas, comms, strict=True)
        )


class FrameReader:
    """Reassembles frames from a byte stream. ``max_frame`` can be raised once the peer has authenticated."""

    def __init__(self, max_frame: int = PREAUTH_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[Message]:
        """Yield every complete message in the buffer. Raises ProtocolError on a bad or oversized frame."""
        if not self._buf and len(data) >= 4:
            # The common case, one whole frame with nothing buffered before it: decoded without buffering.
            (length,) = _U32.unpack_from(data, 0)
            if len(data) == 4 + length and length <= self.max_frame:
                yield decode_body(bytes(data[4:]))
                return
        self._buf += data
        while len(self._buf) >= 4:
            (length,) = _U32.unpack_from(self._buf, 0)
            if length > self.max_frame:
                raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self.max_frame}")
            if len(self._buf) < 4 + length:
                return
            body = bytes(self._buf[4 : 4 + length])
            del self._buf[: 4 + length]
            yield decode_body(body)

    @property
    def buffered(self) -> int:
        return len(self._buf)


def encode_peer(p: PeerInfo) -> bytes:
    """A peer entry on its own (for the bootstrap store)."""
    w = _Writer()
    w.fmt("B", VERSION)
    _put_peer(w, p)
    return w.getvalue()


def decode_peer(data: bytes) -> PeerInfo:
    r = _Reader(data)
    if r.one("B") != VERSION:
        raise ProtocolError("unsupported peer record version")
    p = _get_peer(r)
    r.done()
    return p
