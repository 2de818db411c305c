"""Fuzzing at volume of both ports (issue 14, item 2; docs/reliability.md): inputs, targets and a port scanner.

Inputs. ``corpus()`` records every frame a small real mesh sends (a ``Harness`` of core nodes: handshakes, gossip,
keepalives, floods, a gather), so mutations start from what the wire really carries. ``inputs(rng, corpus)``
yields raw random bytes, valid frames with bytes flipped, inserted, deleted or truncated, frames spliced together,
and lengths rewritten; ``client_inputs`` does the same for the text protocol from its valid commands.

Targets, each checked for: no exception other than the documented ``ProtocolError`` (a crash), no input that
takes longer than ``HANG_S`` (a hang), and no change to any verdict:

* ``frames(data)``: ``wire.FrameReader`` at the pre-authentication and the authenticated frame limits;
* ``MeshTarget``: a real ``Node`` meshed with two peers. ``preauth(data)`` feeds a stranger's connection;
  ``postauth(data)`` injects the bytes into an authenticated, READY connection from a peer (an insider with the
  secret, sending garbage). A verdict may change only through a frame that decodes to a valid message from an
  authenticated peer (the secret is the trust boundary, docs/architecture.md 3.1); garbage must change nothing;
* ``client(data)``: ``ClientSession`` (the text port's state machine), every output of the documented kinds.

``scan(...)`` is the live part: a port scanner against real listening sockets (connect and go, garbage,
half-open frames, slowloris, a valid HELLO then silence, overlong lines), for the tests and bench/faults.py.
"""

from __future__ import annotations

import random
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
for extra in (HERE.parents[1], HERE.parent / "unit" / "core"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from harness import Harness, peer  # noqa: E402

from rasd.core import client_session, wire  # noqa: E402
from rasd.core import node as core  # noqa: E402
from rasd.core.comms import OP_TYPES, CommRecord, ProcessData, RankRecord  # noqa: E402
from rasd.core.config import Timers  # noqa: E402

HANG_S = 1.0  # one input that costs more CPU than this is a hang (CPU time: the machine may be shared)
CLIENT_COMMANDS = [b"CLIENT PROTOCOL 2\n", b"TIMEOUT 5\n", b"TIMEOUT -1\n", b"TIMEOUT 99999999999999999999\n",
                   b"SET FORMAT json\n", b"SET FORMAT text\n", b"MONITOR\n", b"MONITOR lifecycle,trace\n",
                   b"MONITOR all\n", b"STATUS\n", b"VERBOSE STATUS\n", b"\r\n", b"\n"]


@dataclass
class Findings:
    inputs: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    verdict_changes: list[str] = field(default_factory=list)
    slowest_s: float = 0.0

    def add(self, other: "Findings") -> None:
        self.inputs += other.inputs
        self.crashes += other.crashes
        self.hangs += other.hangs
        self.verdict_changes += other.verdict_changes
        self.slowest_s = max(self.slowest_s, other.slowest_s)

    @property
    def clean(self) -> bool:
        return not (self.crashes or self.hangs or self.verdict_changes)


def _data(i: int) -> ProcessData:
    counts = tuple(10 + i if op == OP_TYPES.index("AllReduce") else 0 for op in range(len(OP_TYPES)))
    return ProcessData(comms=(CommRecord(0xC0FFEE, 3, (RankRecord(i, launched=counts, completed=counts),),
                                         ((0, 3, 1),)),))


def _mesh(timers: Timers = Timers()) -> Harness:
    h = Harness(random.Random(1))
    for i, name in enumerate("abc"):
        h.add(name, peer(i), timers=timers, local_data=lambda i=i: _data(i))
    h.introduce()
    h.advance(3.0, 0.25)
    return h


def corpus() -> list[bytes]:
    """Every distinct frame a small mesh sends: handshakes, keepalives, gossip, a gather, a verdict flood."""
    h = _mesh()
    h.call("a", lambda: h["a"].node.start_gather(1, h.now))
    h.run()
    h.pause("c")
    h.advance(h.now + 12.0, 0.25, ["a", "b"])  # c is HUNG: HUNG floods
    h.resume("c")  # RECOVERED floods
    h.advance(h.now + 2.0, 0.25)
    h.kill("c")  # a DEAD flood
    h.advance(h.now + 2.0, 0.25, ["a", "b"])
    frames = {a.data for m in h.members.values() for a in m.actions if isinstance(a, core.Send)}
    # Gossip and communicator verdicts do not occur in this short run: add valid ones by hand.
    a, b = peer(0), peer(1)
    frames |= {wire.encode(wire.PeersUpdate((a, b), (b.key,), (), True)),
               wire.encode(wire.PeersUpdate((b,), (), (a.key,), False)),
               wire.encode(wire.CommVerdict(a.addr, 3, True, 0xC0FFEE, 1, 42, (2,), (0, 1), (2,), (0, 1))),
               wire.encode(wire.CommVerdict(b.addr, 4, False, 0xC0FFEE, 1, 42, (), (), (), ()))}
    return sorted(frames)


def mutate(rng: random.Random, frame: bytes, pool: list[bytes]) -> bytes:
    b = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and b:  # flip bits
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # set a byte to an interesting value
            b[rng.randrange(len(b))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2:  # insert bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and b:  # delete a span
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 8)]
        elif op == 4 and b:  # truncate
            del b[rng.randrange(len(b)):]
        elif op == 5:  # splice another frame in
            other = rng.choice(pool)
            i = rng.randrange(len(b) + 1)
            b[i:i] = other[rng.randrange(len(other)):]
        elif len(b) >= 4:  # rewrite the length prefix
            b[0:4] = struct.pack("!I", rng.choice((0, 1, len(b) - 4, len(b), 127, 128, 129, 2**31, 2**32 - 1,
                                                    rng.randrange(2**32))))
    return bytes(b)


def inputs(rng: random.Random, pool: list[bytes]) -> Iterator[bytes]:
    """An endless stream of hostile inputs: a third raw random bytes, two thirds mutated real frames."""
    while True:
        kind = rng.randrange(3)
        if kind == 0:
            yield rng.randbytes(rng.choice((1, 3, 4, 5, 8, 16, 40, 127, 128, 200, 1000)))
        else:
            yield mutate(rng, rng.choice(pool), pool)


def client_inputs(rng: random.Random) -> Iterator[bytes]:
    while True:
        kind = rng.randrange(4)
        if kind == 0:
            yield rng.randbytes(rng.randint(1, 300))
        elif kind == 1:
            yield b"".join(rng.choice(CLIENT_COMMANDS) for _ in range(rng.randint(1, 5)))
        elif kind == 2:
            yield mutate(rng, b"".join(rng.choice(CLIENT_COMMANDS) for _ in range(3)), CLIENT_COMMANDS)
        else:
            yield rng.choice((b"A" * 1023 + b"\n", b"A" * 1024 + b"\n", b"A" * 5000, b"STATUS" * 300 + b"\n",
                              b"TIMEOUT " + b"9" * 1000 + b"\n", b"\xff\xfe" * 100 + b"\n"))


def _chunks(rng: random.Random, data: bytes) -> list[bytes]:
    if len(data) < 2 or rng.random() < 0.5:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 4))))
    return [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)])]


# ----------------------------------------------------------------------------------------------------------------
# Targets


def frames(rng: random.Random, stream: Iterator[bytes], count: int) -> Findings:
    """FrameReader at both limits: only ProtocolError may come out."""
    out = Findings()
    for _ in range(count):
        data = next(stream)
        for limit in (wire.PREAUTH_MAX_FRAME, wire.MAX_FRAME):
            reader = wire.FrameReader(limit)
            started = time.process_time()
            try:
                for chunk in _chunks(rng, data):
                    for _msg in reader.feed(chunk):
                        pass
            except wire.ProtocolError:
                pass
            except Exception as exc:  # noqa: BLE001 - anything else is the finding
                out.crashes.append(f"FrameReader({limit}) {type(exc).__name__}: {exc} on {data[:64].hex()}")
            took = time.process_time() - started
            out.slowest_s = max(out.slowest_s, took)
            if took > HANG_S:
                out.hangs.append(f"FrameReader({limit}) {took:.2f}s on {len(data)} bytes")
        out.inputs += 1
    return out


class MeshTarget:
    """A real Node ("b") meshed with two peers; hostile bytes reach it before or after authentication."""

    def __init__(self) -> None:
        self.h = _mesh()
        self.victim = self.h["b"].node
        self._stranger = -1_000_000
        self.baseline = self.beliefs()

    def beliefs(self) -> tuple:
        n = self.victim
        return (frozenset(n.dead), frozenset(n.left), frozenset(n.hung), n.table.hash, n.expelled)

    def _insider_conn(self) -> int | None:
        for cid, c in self.victim.conns.items():
            if c.state is core.ConnState.READY:
                return cid
        return None

    def preauth(self, rng: random.Random, data: bytes, out: Findings) -> None:
        self._stranger -= 1
        cid = self._stranger
        self._feed(rng, cid, data, out, accept=True)
        if self.beliefs() != self.baseline:
            out.verdict_changes.append(f"pre-auth input changed beliefs: {data[:64].hex()}")
            self.reset()

    def postauth(self, rng: random.Random, data: bytes, out: Findings) -> None:
        cid = self._insider_conn()
        if cid is None:
            self.settle()
            cid = self._insider_conn()
            if cid is None:
                out.crashes.append("the victim lost every authenticated connection and never got one back")
                self.reset()
                return
        decodes = _decodes(data)
        self._feed(rng, cid, data, out, accept=False)
        if self.beliefs() != self.baseline:
            if not decodes:
                out.verdict_changes.append(f"post-auth garbage changed beliefs: {data[:64].hex()}")
            self.reset()  # a valid message from an insider may change beliefs: start again from a clean mesh

    def _feed(self, rng: random.Random, cid: int, data: bytes, out: Findings, accept: bool) -> None:
        n = self.victim
        started = time.process_time()
        try:
            if accept:
                self.h._act(self.h["b"], n.accepted(cid, self.h.now))
            for chunk in _chunks(rng, data):
                self.h._act(self.h["b"], n.received(cid, chunk, self.h.now))
            self.h.run()
        except Exception as exc:  # noqa: BLE001 - the finding
            out.crashes.append(f"Node {type(exc).__name__}: {exc} on {data[:64].hex()}")
            self.reset()
        took = time.process_time() - started
        out.slowest_s = max(out.slowest_s, took)
        if took > HANG_S:
            out.hangs.append(f"Node {took:.2f}s on {len(data)} bytes")
        out.inputs += 1

    def settle(self) -> None:
        """Let time pass so dropped connections are re-made and stale strangers time out."""
        self.h.advance(self.h.now + 6.0, 0.25)

    def reset(self) -> None:
        self.h = _mesh()
        self.victim = self.h["b"].node
        self.baseline = self.beliefs()


def _decodes(data: bytes) -> bool:
    """Whether any valid message reaches the node (the frames before a bad one are handled too)."""
    decoded = False
    try:
        for _msg in wire.FrameReader(wire.MAX_FRAME).feed(data):
            decoded = True
    except wire.ProtocolError:
        pass
    return decoded


def mesh(rng: random.Random, stream: Iterator[bytes], count: int, authenticated: bool) -> Findings:
    target, out = MeshTarget(), Findings()
    for i in range(count):
        data = next(stream)
        (target.postauth if authenticated else target.preauth)(rng, data, out)
        if i % 200 == 199:
            target.settle()
            if target.beliefs() != target.baseline:
                out.verdict_changes.append("beliefs changed while settling after hostile input")
                target.reset()
    return out


def client(rng: random.Random, stream: Iterator[bytes], count: int, target: MeshTarget | None = None) -> Findings:
    """The text port's state machine, and what it asks of the node: each status request it makes starts a real
    gather on a meshed node with the client's timeout (so ``TIMEOUT <huge>`` reaches the wire encoder)."""
    out = Findings()
    target = target or MeshTarget()
    kinds = (client_session.Reply, client_session.StartStatus, client_session.CloseClient)
    for i in range(count):
        data = next(stream)
        session = client_session.ClientSession()
        started = time.process_time()
        try:
            for chunk in _chunks(rng, data):
                for o in session.feed(chunk):
                    if not isinstance(o, kinds):
                        out.crashes.append(f"ClientSession gave {o!r}")
                    elif isinstance(o, client_session.StartStatus):
                        h = target.h
                        h._act(h["b"], target.victim.start_gather(i, h.now, o.timeout))
                        h.run()
            if not (session.closed or session.reporting) and len(session._buf) > client_session.LINE_LIMIT:
                out.crashes.append(f"ClientSession buffered {len(session._buf)} bytes")
        except Exception as exc:  # noqa: BLE001 - the finding
            out.crashes.append(f"ClientSession {type(exc).__name__}: {exc} on {data[:64]!r}")
        took = time.process_time() - started
        out.slowest_s = max(out.slowest_s, took)
        if took > HANG_S:
            out.hangs.append(f"ClientSession {took:.2f}s")
        out.inputs += 1
        if i % 500 == 499:
            target.settle()  # the gathers end
            if target.victim.gathers:
                out.hangs.append(f"{len(target.victim.gathers)} gathers still open after their hard limit")
                target.reset()
    return out


# ----------------------------------------------------------------------------------------------------------------
# A port scanner against live sockets


@dataclass
class ScanResult:
    connections: int = 0
    errors: int = 0


def scan(targets: list[tuple[str, int]], seconds: float, rng: random.Random, pool: list[bytes],
         held: int = 40) -> ScanResult:
    """Hit every (host, port) for ``seconds``: connect-and-close, garbage, mutated frames, half-open frames kept
    open (``held`` at a time), slowloris (a byte every 0.2 s), a valid HELLO then silence, overlong lines."""
    result = ScanResult()
    stop = time.monotonic() + seconds
    open_socks: list[socket.socket] = []
    lock = threading.Lock()

    def slowloris(target: tuple[str, int]) -> None:
        try:
            with socket.create_connection(target, 2) as s:
                s.settimeout(2)
                payload = b"CLIENT PROTOCOL 2\nSTAT" + bytes(rng.randrange(256) for _ in range(40))
                for byte in payload:
                    if time.monotonic() > stop:
                        break
                    s.sendall(bytes([byte]))
                    time.sleep(0.2)
        except OSError:
            with lock:
                result.errors += 1

    lorises = [threading.Thread(target=slowloris, args=(t,), daemon=True) for t in targets for _ in range(2)]
    for t in lorises:
        t.start()
    while time.monotonic() < stop:
        target = rng.choice(targets)
        move = rng.randrange(6)
        try:
            s = socket.create_connection(target, 2)
            result.connections += 1
            s.settimeout(0.5)
            if move == 0:
                s.close()  # connect and go
                continue
            if move == 1:
                s.sendall(rng.randbytes(rng.randint(1, 2000)))
            elif move == 2:
                s.sendall(mutate(rng, rng.choice(pool), pool))
            elif move == 3:
                s.sendall(struct.pack("!I", rng.randint(5, 120)) + b"\x01")  # half a frame, kept open
            elif move == 4:
                s.sendall(wire.encode(wire.Hello(rng.randbytes(wire.NONCE_LEN))))  # then silence
            else:
                s.sendall(b"X" * rng.choice((1023, 1024, 1025, 4096)) + b"\n")
            if rng.random() < 0.3:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
            open_socks.append(s)
            if len(open_socks) > held:
                open_socks.pop(0).close()
        except OSError:
            result.errors += 1
        time.sleep(0.002)
    for s in open_socks:
        s.close()
    for t in lorises:
        t.join(5)
    return result
