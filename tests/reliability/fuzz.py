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

A verdict change is a change of the victim's beliefs (dead, left, hung, peer table, expelled) or a verdict event it
emits (``VERDICT_KINDS``: a transient PEER_HUNG that a RECOVERED flood ends before the beliefs are read counts too),
after an input or while time passes after hostile input (``settle``). The meshed job is healthy (every rank's
counts agree), so no verdict is due with time alone. Each finding carries the whole input, the seed and a one-line
reproduction command, which replays the stream from the start exactly (docs/reliability.md §2.2)::

    python tests/reliability/fuzz.py --target postauth --seed 7 --count 1200     # one stream, findings printed

``scan(...)`` is the live part: a port scanner against real listening sockets (connect and go, garbage,
half-open frames, slowloris, a valid HELLO then silence, overlong lines), for the tests and bench/faults.py.
"""

from __future__ import annotations

import argparse
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
for extra in (HERE.parents[1], HERE.parent / "unit" / "core"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from harness import Harness, peer  # noqa: E402 - after sys.path takes the helpers' folders
from rasd.core import (  # noqa: E402 - likewise
    client_session,
    node as core,
    wire,
)
from rasd.core.comms import OP_TYPES, CommRecord, ProcessData, RankRecord  # noqa: E402 - likewise
from rasd.core.config import Timers  # noqa: E402 - likewise
from rasd.core.events import Kind  # noqa: E402 - likewise
from rasd.core.stuck import StuckVerdict  # noqa: E402 - likewise
from rasd.core.wire import Ask  # noqa: E402 - likewise

HANG_S = 1.0  # one input that costs more CPU than this is a hang (CPU time: the machine may be shared)
CLIENT_COMMANDS = [
    b"CLIENT PROTOCOL 2\n",
    b"TIMEOUT 5\n",
    b"TIMEOUT -1\n",
    b"TIMEOUT 99999999999999999999\n",
    b"SET FORMAT json\n",
    b"SET FORMAT text\n",
    b"MONITOR\n",
    b"MONITOR lifecycle,trace\n",
    b"MONITOR all\n",
    b"STATUS\n",
    b"VERBOSE STATUS\n",
    b"DIAGNOSTICS\n",
    b"STACKS\n",
    b"STACKS ALL RANKS 0,2-3\n",
    b"STACKS RANKS 99999999999\n",
    b"CONTROL PROFILER_MASK all\n",
    b"CONTROL PROFILER_MASK 0x\n",
    b"TIMEOUT 2.5\n",
    b"\r\n",
    b"\n",
]
#: The events that are verdicts (docs/protocol.md §5): hostile bytes must make the victim emit none of them.
VERDICT_KINDS = frozenset(
    {Kind.PEER_DEAD, Kind.PEER_TIMEOUT_DEAD, Kind.PEER_LEFT, Kind.PEER_HUNG, Kind.COMM_STUCK, Kind.COMM_RECOVERED}
)
SETTLE_EVERY = 200  # inputs between two settles of the mesh target


@dataclass
class Findings:
    inputs: int = 0
    crashes: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    verdict_changes: list[str] = field(default_factory=list)
    slowest_s: float = 0.0

    def add(self, other: Findings) -> None:
        self.inputs += other.inputs
        self.crashes += other.crashes
        self.hangs += other.hangs
        self.verdict_changes += other.verdict_changes
        self.slowest_s = max(self.slowest_s, other.slowest_s)

    @property
    def clean(self) -> bool:
        return not (self.crashes or self.hangs or self.verdict_changes)


def _data(i: int) -> ProcessData:
    """Rank ``i`` of a healthy communicator: every rank's counts agree, so the sweeper has no COMM_STUCK to give
    (with counts that differ, a clean mesh says COMM_STUCK after the stuck limit: a verdict due to time alone)."""
    counts = tuple(10 if op == OP_TYPES.index("AllReduce") else 0 for op in range(len(OP_TYPES)))
    return ProcessData(
        comms=(CommRecord(0xC0FFEE, 3, (RankRecord(i, launched=counts, completed=counts),), ((0, 3, 1),)),)
    )


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
    frames |= {
        wire.encode(wire.PeersUpdate((a, b), (b.key,), (), True)),
        wire.encode(wire.PeersUpdate((b,), (), (a.key,), False)),
        wire.encode(wire.CommVerdict(a.addr, 3, True, StuckVerdict(0xC0FFEE, 1, 42, (2,), (0, 1), (2,), (0, 1)))),
        wire.encode(wire.CommVerdict(b.addr, 4, False, StuckVerdict(0xC0FFEE, 1, 42, (), (), (), ()))),
    }
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
            del b[i : i + rng.randint(1, 8)]
        elif op == 4 and b:  # truncate
            del b[rng.randrange(len(b)) :]
        elif op == 5:  # splice another frame in
            other = rng.choice(pool)
            i = rng.randrange(len(b) + 1)
            b[i:i] = other[rng.randrange(len(other)) :]
        elif len(b) >= 4:  # rewrite the length prefix
            b[0:4] = struct.pack(
                "!I", rng.choice((0, 1, len(b) - 4, len(b), 127, 128, 129, 2**31, 2**32 - 1, rng.randrange(2**32)))
            )
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
            yield rng.choice(
                (
                    b"A" * 1023 + b"\n",
                    b"A" * 1024 + b"\n",
                    b"A" * 5000,
                    b"STATUS" * 300 + b"\n",
                    b"TIMEOUT " + b"9" * 1000 + b"\n",
                    b"\xff\xfe" * 100 + b"\n",
                )
            )


def _chunks(rng: random.Random, data: bytes) -> list[bytes]:
    if len(data) < 2 or rng.random() < 0.5:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 4))))
    return [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]


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
                out.crashes.append(f"FrameReader({limit}) {type(exc).__name__}: {exc} on {data.hex()}")
            took = time.process_time() - started
            out.slowest_s = max(out.slowest_s, took)
            if took > HANG_S:
                out.hangs.append(f"FrameReader({limit}) {took:.2f}s on {len(data)} bytes")
        out.inputs += 1
    return out


class MeshTarget:
    """A real Node ("b") meshed with two peers; hostile bytes reach it before or after authentication.

    ``where`` (the stream's seed and the input's index, from ``mesh``) goes into each finding with the whole input,
    so that it can be replayed."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.h = _mesh()
        self.victim = self.h["b"].node
        # The harness seeds every node's nonces, and the corpus was recorded from this very mesh: without a nonce
        # stream of its own, the victim could draw a nonce the corpus holds a valid PROOF for, and a replayed
        # handshake would pass (with the runtime's SystemRandom it cannot, docs/architecture.md 3.1).
        self.victim.rng = random.Random("fuzz victim")
        self.baseline = self.beliefs()
        self._seen_events = len(self.h["b"].events)
        self._stranger = -1_000_000

    def beliefs(self) -> tuple:
        n = self.victim
        return (frozenset(n.dead), frozenset(n.left), frozenset(n.hung), n.table.hash, n.expelled)

    def verdicts(self) -> list[str]:
        """The verdict events the victim emitted since the last call."""
        events = self.h["b"].events
        new, self._seen_events = events[self._seen_events :], len(events)
        return [f"{e.kind.value} {e.addr} at {e.at:g}: {e.details}" for e in new if e.kind in VERDICT_KINDS]

    def changed(self) -> list[str]:
        """What changed since the baseline: the beliefs that differ and the verdict events emitted."""
        said = self.verdicts()
        if self.beliefs() != self.baseline:
            said.insert(0, f"beliefs {self.baseline} -> {self.beliefs()}")
        return said

    def _insider_conn(self) -> int | None:
        for cid, c in self.victim.conns.items():
            if c.state is core.ConnState.READY:
                return cid
        return None

    def preauth(self, rng: random.Random, data: bytes, out: Findings, where: str = "") -> None:
        self._stranger -= 1
        cid = self._stranger
        self._feed(rng, cid, data, out, accept=True, where=where)
        changes = self.changed()
        if changes:
            out.verdict_changes.append(_finding("pre-auth input changed a verdict", changes, data, where))
            self.reset()

    def postauth(self, rng: random.Random, data: bytes, out: Findings, where: str = "") -> None:
        cid = self._insider_conn()
        if cid is None:
            self.settle(out, where)
            cid = self._insider_conn()
            if cid is None:
                out.crashes.append("the victim lost every authenticated connection and never got one back")
                self.reset()
                return
        # What the node decodes: the bytes of an unfinished frame already on that connection, then these.
        decodes = _decodes(bytes(self.victim.conns[cid].reader._buf) + data)
        self._feed(rng, cid, data, out, accept=False, where=where)
        changes = self.changed()
        if changes:
            if not decodes:
                out.verdict_changes.append(_finding("post-auth garbage changed a verdict", changes, data, where))
            self.reset()  # a valid message from an insider may change beliefs: start again from a clean mesh

    def _feed(self, rng: random.Random, cid: int, data: bytes, out: Findings, accept: bool, where: str) -> None:
        n = self.victim
        started = time.process_time()
        try:
            if accept:
                self.h._act(self.h["b"], n.accepted(cid, self.h.now))
            for chunk in _chunks(rng, data):
                self.h._act(self.h["b"], n.received(cid, chunk, self.h.now))
            self.h.run()
        except Exception as exc:  # noqa: BLE001 - the finding
            out.crashes.append(f"Node {type(exc).__name__}: {exc} on {data.hex()}" + (f"; {where}" if where else ""))
            self.reset()
        took = time.process_time() - started
        out.slowest_s = max(out.slowest_s, took)
        if took > HANG_S:
            out.hangs.append(f"Node {took:.2f}s on {len(data)} bytes")
        out.inputs += 1

    def settle(self, out: Findings | None = None, where: str = "") -> None:
        """Let time pass (6 s: past the unresponsive limit) so dropped connections are re-made and stale strangers
        time out. With ``out``, a verdict the victim reaches meanwhile is a finding (no valid message came in)."""
        self.h.advance(self.h.now + 6.0, 0.25)
        changes = self.changed()
        if changes and out is not None:
            unfinished = {
                cid: c.reader.buffered
                for cid, c in self.victim.conns.items()
                if c.state is core.ConnState.READY and c.reader.buffered
            }
            note = f"; unfinished frames on authenticated connections (id: bytes): {unfinished}" if unfinished else ""
            out.verdict_changes.append(
                _finding("a verdict changed while time passed after hostile input" + note, changes, b"", where)
            )
        if changes:
            self.reset()


def _finding(what: str, changes: list[str], data: bytes, where: str) -> str:
    """One finding, replayable: what changed, the whole input (hex) and where it came from (seed, index)."""
    text = f"{what}: {'; '.join(changes)}"
    if data:
        text += f"; input ({len(data)} bytes) {data.hex()}"
    return text + (f"; {where}" if where else "")


def _decodes(data: bytes) -> bool:
    """Whether any valid message reaches the node (the frames before a bad one are handled too)."""
    decoded = False
    try:
        for _msg in wire.FrameReader(wire.MAX_FRAME).feed(data):
            decoded = True
    except wire.ProtocolError:
        pass
    return decoded


def repro(target: str, seed: int, count: int) -> str:
    return f"python tests/reliability/fuzz.py --target {target} --seed {seed} --count {count}"


def mesh(seed: int, count: int, authenticated: bool, pool: list[bytes] | None = None) -> Findings:
    """``count`` inputs of the stream ``seed`` against a meshed node, settling every ``SETTLE_EVERY`` inputs.
    Deterministic: the same seed and count replay the same inputs, chunks and mesh (``repro``)."""
    target, out = MeshTarget(), Findings()
    rng = random.Random(seed)
    stream = inputs(rng, pool if pool is not None else corpus())
    name = "postauth" if authenticated else "preauth"
    for i in range(count):
        data = next(stream)
        where = f"seed {seed}, input {i}; repro: {repro(name, seed, i + 1)}"
        (target.postauth if authenticated else target.preauth)(rng, data, out, where)
        if i % SETTLE_EVERY == SETTLE_EVERY - 1:
            target.settle(out, where)
    return out


def client(rng: random.Random, stream: Iterator[bytes], count: int, target: MeshTarget | None = None) -> Findings:
    """The text port's state machine, and what it asks of the node: each status request it makes starts a real
    gather on a meshed node with the client's timeout (so ``TIMEOUT <huge>`` reaches the wire encoder)."""
    out = Findings()
    target = target or MeshTarget()
    kinds = (
        client_session.Reply,
        client_session.StartStatus,
        client_session.StartDiagnostics,
        client_session.StartStacks,
        client_session.CloseClient,
    )
    for i in range(count):
        data = next(stream)
        session = client_session.ClientSession()
        started = time.process_time()
        try:
            for chunk in _chunks(rng, data):
                for o in session.feed(chunk):
                    if not isinstance(o, kinds):
                        out.crashes.append(f"ClientSession gave {o!r}")
                    elif isinstance(o, (client_session.StartStatus, client_session.StartDiagnostics)):
                        ask = Ask.STATUS if isinstance(o, client_session.StartStatus) else Ask.DIAGNOSTICS
                        h = target.h
                        h._act(h["b"], target.victim.start_gather(i, h.now, o.timeout, ask))
                        h.run()
                    elif isinstance(o, client_session.StartStacks):
                        h = target.h
                        ask = Ask.STACKS_ALL if o.all_threads else Ask.STACKS
                        h._act(h["b"], target.victim.start_gather(i, h.now, o.timeout, ask))
                        h.run()
            if not (session.closed or session.reporting) and len(session._buf) > client_session.LINE_LIMIT:
                out.crashes.append(f"ClientSession buffered {len(session._buf)} bytes")
        except Exception as exc:  # noqa: BLE001 - the finding
            out.crashes.append(f"ClientSession {type(exc).__name__}: {exc} on {data!r}")
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


def scan(
    targets: list[tuple[str, int]], seconds: float, rng: random.Random, pool: list[bytes], held: int = 40
) -> ScanResult:
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


# ----------------------------------------------------------------------------------------------------------------
# Replaying a finding


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fuzz.py", description="replay one fuzz stream against a meshed node")
    parser.add_argument("--target", choices=("preauth", "postauth"), required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, required=True, help="inputs, from the first (a finding's index + 1)")
    args = parser.parse_args(argv)
    out = mesh(args.seed, args.count, authenticated=args.target == "postauth")
    print(
        f"{out.inputs} inputs: {len(out.crashes)} crashes, {len(out.hangs)} hangs, "
        f"{len(out.verdict_changes)} verdict changes; slowest {out.slowest_s:.3f} s"
    )
    for finding in out.crashes + out.hangs + out.verdict_changes:
        print(finding)
    return 0 if out.clean else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
