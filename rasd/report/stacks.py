"""The STACKS report: every process's stacks, identical ones folded together (docs/protocol.md §2.6).

A STACKS gather (``wire.Ask.STACKS`` or ``STACKS_ALL``) brings the root one answer per process (made by
``rasd.net.thread_stacks``), in two parts (``wire.Answer``): what processes in the same place share byte for byte
(their threads' frames and where their collectives stand, ``encode_shared``) and who each is (``encode_own``). The
relays carry each distinct shared part once, and the root reads each once: 4,096 ranks in one all-reduce are one
stack to parse, and 4,096 small records. ``fold`` groups the threads whose frames are identical, as py-spy's and
torch's stack dumps do, so that 1,000 ranks inside one all-reduce are one stack and the one rank elsewhere stands
out; a process that did not answer is listed with the last position the mesh saw of it, when one was seen.
``render_text`` writes the groups, largest first (the stragglers last, beside the missing); ``render_json`` the same
as data.

Each answer also carries its process's collective counters (``comms_of``: per communicator rank, the operations
launched and completed by type, and how long they have stood), so that a main thread's stack says which collective
it is in, as the frames cannot when the collective runs in C++ (DDP's reducer): the ranks *inside* an operation
(launched, not completed) and the ranks that have *not launched* an operation others are inside, once the counters
have stood ``STOOD_S`` (a healthy job's stacks fold as before). Main threads fold
by their frames and these collectives together: "ranks 0,1,3: inside AllReduce operation 33 of communicator
bbf5..., for 21 s" above their backward frames, "rank 2: not in AllReduce operation 33, never launched it" above the
frame it waits in.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rasd.core.answer import Answer
from rasd.core.comms import N_OPS, OP_TYPES, CommRecord
from rasd.core.frames import Frame, position_text
from rasd.core.peers import Addr, PeerInfo

#: The version of a STACKS answer's format (``rasd.net.thread_stacks.answer`` writes it): its shared part a JSON
#: object compressed with zlib (stacks repeat themselves, paths and library frames: compressed, a stack is about a
#: quarter of its size), its own part a short JSON object. 3: the two parts (issue 42).
FORMAT = 3
#: An answer's JSON is at most this long once decompressed (a small compressed answer can expand without bound).
MAX_DECODED = 1 << 20
#: A group names at most this many processes in its heading.
NAMED = 16
#: An answer carries the counters of at most this many communicator ranks of its process (those with an operation
#: in flight first).
MAX_COMMS = 32
#: A rank's collectives named on its stack: at most this many (communicators it is inside or behind in).
MAX_COLLECTIVES = 4
#: A collective is named once its ranks' counters have stood this long: a healthy job's ranks pass through
#: collectives many times a second, and naming each would split their identical stacks into groups by the
#: all-reduce they happened to be in when asked.
STOOD_S = 1.0

INSIDE = "inside"
NOT_LAUNCHED = "not_launched"


@dataclass(frozen=True)
class Proc:
    host: str
    pid: int
    rank: int  # -1: unknown

    @property
    def name(self) -> str:
        return f"rank {self.rank} ({self.host}:{self.pid})" if self.rank >= 0 else f"{self.host}:{self.pid}"


@dataclass(frozen=True)
class Collective:
    """A collective operation a main thread is in, or has not reached while others are in it: ``state``
    ``INSIDE`` (launched, not completed) or ``NOT_LAUNCHED``; the communicator's hash (16 hex digits), the
    operation's type and its number among that communicator's operations of that type (1-based, as a COMM_STUCK
    verdict numbers them)."""

    state: str
    comm: str
    op: str
    number: int

    def text(self, seconds: float, inside: Sequence[Proc]) -> str:
        what = f"{self.op} operation {self.number} of communicator {self.comm}"
        if self.state == INSIDE:
            return f"collective: inside {what} (launched, not completed), for {seconds:.1f} s"
        others = f", while {_who(inside)} {'is' if len(inside) == 1 else 'are'} inside it" if inside else ""
        return f"collective: not in {what}: never launched it{others}"


@dataclass
class Group:
    """Threads with identical frames (and, for main threads, the same collectives), in processes listed by rank."""

    frames: tuple[Frame, ...]
    threads: list[tuple[Proc, str]] = field(default_factory=list)  # (process, thread name)
    cut: bool = False  # some thread's outermost frames were left out to fit the answer
    collectives: tuple[Collective, ...] = ()
    #: The longest that any of its ranks' counters stood (how long they have been inside), in seconds.
    collective_s: float = 0.0

    @functools.cached_property
    def procs(self) -> list[Proc]:  # read once the group is complete (by ``fold``'s ordering, then the reports)
        return sorted({p for p, _ in self.threads}, key=_order)


@dataclass(frozen=True)
class Missing:
    proc: Proc
    #: The last position the mesh saw of it and how long before the answer, when one was seen.
    frames: tuple[Frame, ...] = ()
    age_s: float | None = None


@dataclass(frozen=True)
class Phase:
    """A phase a process's code declared (``rasd.phase``) when it answered: its name, how long it had lasted, and
    its limit (0: the busy limit)."""

    proc: Proc
    name: str
    seconds: float
    limit: float


@dataclass(frozen=True)
class Stacks:
    groups: tuple[Group, ...]
    missing: tuple[Missing, ...]
    answered: int
    collection_time: float
    all_threads: bool
    phases: tuple[Phase, ...] = ()
    #: For each collective some rank is inside: those ranks (named by a NOT_LAUNCHED line).
    inside: dict[tuple[str, str, int], tuple[Proc, ...]] = field(default_factory=dict)


def _order(p: Proc) -> tuple[int, int, str, int]:
    return (0, p.rank, "", 0) if p.rank >= 0 else (1, 0, p.host, p.pid)


def _frames(raw: Any) -> tuple[Frame, ...]:
    return tuple(Frame(str(f), int(line), str(fn)) for f, line, fn in raw)


def comms_of(records: Iterable[CommRecord]) -> tuple[list[dict[str, Any]], float]:
    """What an answer carries of its process's communicators (``ProcessData.comms``), and how long the longest
    standing of them has stood with an operation in flight (0 if none has stood ``STOOD_S``). Per communicator
    rank: the operations launched and completed, by type (``[type, launched, completed]`` for the types it has
    launched), and whether its counters have stood ``STOOD_S`` (not for how long: the part processes share must be
    the same bytes in every rank inside one operation); those with an operation in flight first, at most
    ``MAX_COMMS``."""
    carried: list[tuple[bool, dict[str, Any]]] = []
    stood_s = 0.0
    for record in records:
        for rank in record.ranks:
            ops = [[op, n, rank.completed[op]] for op, n in enumerate(rank.launched) if n]
            in_flight = any(launched != completed for _, launched, completed in ops)
            stood = rank.idle_ms >= STOOD_S * 1000
            entry = {"comm": f"{record.comm_hash & 0xFFFFFFFFFFFFFFFF:016x}", "ops": ops, "stood": stood}
            carried.append((in_flight, entry))
            if stood and in_flight:
                stood_s = max(stood_s, rank.idle_ms / 1000)
    carried.sort(key=lambda busy_entry: not busy_entry[0])
    return [entry for _, entry in carried[:MAX_COMMS]], stood_s


@dataclass(frozen=True)
class _Counters:
    comm: str
    #: (operation type, launched, completed) for the types its rank has launched.
    ops: tuple[tuple[int, int, int], ...]
    #: Its counters have stood ``STOOD_S``.
    stood: bool


def _counters(raw: Any) -> list[_Counters]:
    out = []
    for c in raw or ():
        ops = [(int(op), int(launched), int(completed)) for op, launched, completed in c["ops"]]
        known = tuple(entry for entry in ops if 0 <= entry[0] < N_OPS)  # a newer version's types: not named here
        out.append(_Counters(str(c["comm"]), known, c["stood"] is True))
    return out


def _collectives(
    counters: Sequence[_Counters],
    frontier: dict[tuple[str, int], int],
    inside: dict[tuple[str, str, int], Any],
    types: dict[str, tuple[int, ...]],
) -> tuple[Collective, ...]:
    """The collectives a process is in (or behind in). ``types``:
    every operation type some rank launched, by communicator: a type the process never launched is behind too when
    others are inside its first operation."""
    found: list[Collective] = []
    for c in counters:
        counts = {op: (launched, completed) for op, launched, completed in c.ops}
        for op in types.get(c.comm, ()):
            launched, completed = counts.get(op, (0, 0))
            if launched > completed and c.stood:
                found.append(Collective(INSIDE, c.comm, OP_TYPES[op], completed + 1))
            elif launched < frontier.get((c.comm, op), 0) and (c.comm, OP_TYPES[op], launched + 1) in inside:
                found.append(Collective(NOT_LAUNCHED, c.comm, OP_TYPES[op], launched + 1))
    return tuple(found[:MAX_COLLECTIVES])


def encode_shared(threads: list[dict[str, Any]], comms: list[dict[str, Any]]) -> tuple[bytes, int]:
    """An answer's shared part, and the length of its JSON before compression (``decode_shared`` refuses past
    MAX_DECODED): the threads (name, whether main, frames, whether cut) and the communicators (``comms_of``)."""
    doc = {"format": FORMAT, "threads": threads, "comms": comms}
    text = json.dumps(doc, separators=(",", ":")).encode()
    return zlib.compress(text, 1), len(text)


#: An answer's own part: u32 pid, i32 rank, f64 its clock, f64 the seconds its collective stood, u16 the length of
#: the host's name and the name; then, only where it has them, a JSON object of ``last_seen`` and ``phase``. Binary:
#: the root reads one of these per process (4,096 of them in 4 ms, where JSON took 30).
_OWN_HEAD = struct.Struct("!Iiddh")
#: The own part's fields in its JSON tail.
_EXTRAS = ("last_seen", "phase")


def encode_own(doc: dict[str, Any]) -> bytes:
    """An answer's own part: ``host``, ``pid``, ``rank``, ``wall`` (its clock), ``stood_s`` (``comms_of``), and
    where they are not empty ``last_seen`` (the positions it holds of processes it hears nothing from) and ``phase``
    (``rasd.phase``)."""
    host = str(doc["host"]).encode()[:255]
    extras = {key: doc[key] for key in _EXTRAS if doc.get(key)}
    tail = json.dumps(extras, separators=(",", ":")).encode() if extras else b""
    head = _OWN_HEAD.pack(
        int(doc["pid"]) & 0xFFFFFFFF,
        int(doc["rank"]),
        float(doc.get("wall", 0.0)),
        float(doc.get("stood_s", 0.0)),
        len(host),
    )
    return head + host + tail


def decode_own(data: bytes) -> dict[str, Any] | None:
    """The own part's fields (as ``encode_own`` takes them), or None for a malformed one."""
    try:
        pid, rank, wall, stood_s, n = _OWN_HEAD.unpack_from(data)
    except struct.error:
        return None
    start = _OWN_HEAD.size
    if n < 0 or start + n > len(data):
        return None
    doc: dict[str, Any] = {
        "host": data[start : start + n].decode(errors="replace"),
        "pid": pid,
        "rank": rank,
        "wall": wall,
        "stood_s": stood_s,
    }
    if len(data) > start + n:
        extras = _decoded_json(data[start + n :])
        if extras is None:
            return None
        doc.update((key, extras[key]) for key in _EXTRAS if key in extras)
    return doc


def _decoded_json(text: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def decode_shared(data: bytes) -> dict[str, Any] | None:
    """The shared part's object, or None for an empty, malformed, oversized or foreign one."""
    try:
        inflate = zlib.decompressobj()
        text = inflate.decompress(data, MAX_DECODED)
        if inflate.unconsumed_tail or not inflate.eof:
            return None
    except zlib.error:
        return None
    doc = _decoded_json(text)
    return doc if doc is not None and doc.get("format") == FORMAT else None


@dataclass(frozen=True)
class _Shared:
    """A shared part, read once however many processes gave it."""

    #: (thread name, frames as they came, cut, main) per thread.
    threads: tuple[tuple[str, tuple[Any, ...], bool, bool], ...]
    counters: tuple[_Counters, ...]


def _read_shared(data: bytes, made: dict[tuple[Any, ...], tuple[Frame, ...]]) -> _Shared | None:
    doc = decode_shared(data)
    if doc is None:
        return None
    try:
        threads = tuple(
            (str(t["thread"]), tuple(map(tuple, t["frames"])), bool(t.get("cut")), bool(t.get("main")))
            for t in doc["threads"]
        )
        for _, raw, _, _ in threads:
            if raw not in made:
                made[raw] = _frames(raw)  # checks each frame's shape, once per distinct stack
        return _Shared(threads, tuple(_counters(doc.get("comms"))))
    except (KeyError, TypeError, ValueError):
        return None


def fold(
    answers: dict[Addr, Answer],
    peers: Iterable[PeerInfo],
    live: Iterable[Addr],
    collection_time: float,
    all_threads: bool,
    ranks: frozenset[int] | None = None,
) -> Stacks:
    """Fold the answers of a STACKS gather. ``live``: the processes expected to answer; ``ranks``: keep only these
    ranks (None: all)."""
    by_addr = {p.addr: p for p in peers}
    # Each distinct shared part is read and judged once, and its processes join its groups together (the folding
    # of 4,096 processes' stacks, bench/README.md); a Frame is made once per distinct stack.
    made: dict[tuple[Any, ...], tuple[Frame, ...]] = {}
    shared: dict[bytes, _Shared | None] = {}
    #: Per distinct shared part: its processes, those of the ranks asked about, and the longest any of those stood
    #: inside an operation.
    procs_of: dict[bytes, list[Proc]] = {}
    asked_of: dict[bytes, list[Proc]] = {}
    stood_of: dict[bytes, float] = {}
    seen: dict[tuple[str, int], tuple[tuple[Frame, ...], float]] = {}
    phases: list[Phase] = []
    unreadable = set()
    answered = 0
    for addr, (part, own_part) in answers.items():
        if part not in shared:
            shared[part] = _read_shared(part, made)
        doc = decode_own(own_part) if shared[part] is not None else None
        if doc is None:
            unreadable.add(addr)
            continue
        try:
            proc = Proc(str(doc["host"]), int(doc["pid"]), int(doc["rank"]))
            stood_s = float(doc.get("stood_s", 0.0))
            for s in doc.get("last_seen", ()):
                key = (str(s["host"]), int(s["pid"]))
                age = float(s["age_s"])
                if key not in seen or age < seen[key][1]:
                    seen[key] = (_frames(s["frames"]), age)
            declared = doc.get("phase")
            phase = (
                Phase(proc, str(declared["name"]), float(declared["seconds"]), float(declared["limit"]))
                if declared
                else None
            )
        except (KeyError, TypeError, ValueError):
            unreadable.add(addr)
            continue
        procs_of.setdefault(part, []).append(proc)
        if ranks is not None and proc.rank not in ranks:
            continue
        answered += 1  # of the processes asked about, as ``missing`` counts them
        asked_of.setdefault(part, []).append(proc)
        stood_of[part] = max(stood_of.get(part, 0.0), stood_s)
        if phase is not None:
            phases.append(phase)
    # Where each communicator's operations stand across the job (every rank that answered, asked about or not: the
    # one rank asked about is named as not in an operation the others are inside): the most launched of each type,
    # and who is inside.
    frontier: dict[tuple[str, int], int] = {}
    inside: dict[tuple[str, str, int], list[Proc]] = {}
    for part, procs in procs_of.items():
        held = shared[part]
        assert held is not None
        for c in held.counters:
            for op, launched, completed in c.ops:
                key = (c.comm, op)
                if launched > frontier.get(key, 0):
                    frontier[key] = launched
                if launched > completed and c.stood:
                    inside.setdefault((c.comm, OP_TYPES[op], completed + 1), []).extend(procs)
    types_of: dict[str, list[int]] = {}
    for comm, op in sorted(frontier):
        types_of.setdefault(comm, []).append(op)
    types = {comm: tuple(ops) for comm, ops in types_of.items()}
    # Most ranks' counters are alike (a job's ranks run the same collectives): each distinct set is judged once.
    judged: dict[tuple[Any, ...], tuple[Collective, ...]] = {}
    groups: dict[tuple[Any, ...], Group] = {}
    for part, procs in asked_of.items():
        held = shared[part]
        assert held is not None
        alike = tuple((c.comm, c.ops, c.stood) for c in held.counters)
        if alike not in judged:
            judged[alike] = _collectives(held.counters, frontier, inside, types)
        collectives = judged[alike]
        for name, raw, cut, main in held.threads:
            folded = (raw, collectives) if main else (raw, ())
            group = groups.get(folded)
            if group is None:
                group = groups[folded] = Group(made[raw], collectives=collectives if main else ())
            group.threads += [(proc, name) for proc in procs]
            group.cut = group.cut or cut
            if main:
                group.collective_s = max(group.collective_s, stood_of[part])
    missing = []
    for addr in live:
        if addr in answers and addr not in unreadable:
            continue
        peer = by_addr.get(addr)
        if peer is None or (ranks is not None and peer.rank not in ranks):
            continue
        proc = Proc(peer.hostname, peer.pid, peer.rank)
        last = seen.get((peer.hostname, peer.pid))
        missing.append(Missing(proc, *last) if last is not None else Missing(proc))
    ordered = sorted((g for g in groups.values() if g.threads), key=lambda g: (-len(g.threads), _order(g.procs[0])))
    missing.sort(key=lambda m: _order(m.proc))
    phases.sort(key=lambda p: _order(p.proc))
    within = {key: tuple(sorted(procs, key=_order)) for key, procs in inside.items()}
    return Stacks(tuple(ordered), tuple(missing), answered, collection_time, all_threads, tuple(phases), within)


def _who(procs: Sequence[Proc]) -> str:
    """``ranks 0,1,3`` (``rank 2``), or processes by host:pid where ranks are unknown; at most ``NAMED`` named."""
    ranked = [p.rank for p in procs if p.rank >= 0]
    other = [f"{p.host}:{p.pid}" for p in procs if p.rank < 0]
    parts = []
    if ranked:
        shown = ",".join(str(r) for r in ranked[:NAMED]) + (",..." if len(ranked) > NAMED else "")
        parts.append(("rank " if len(ranked) == 1 else "ranks ") + shown)
    if other:
        parts.append(", ".join(other[:NAMED]) + (", ..." if len(other) > NAMED else ""))
    return "; ".join(parts)


def heading(group: Group) -> str:
    procs = group.procs
    hosts = sorted({p.host for p in procs})
    where = f"{len(procs)} process{'es' if len(procs) != 1 else ''} on {', '.join(hosts[:4])}"
    if len(hosts) > 4:
        where += f" and {len(hosts) - 4} more hosts"
    if len(procs) == 1:
        where = f"{procs[0].host}:{procs[0].pid}"
    threads = sorted({name for _, name in group.threads})
    thread = f", thread {threads[0]}" if len(threads) == 1 else f", threads {', '.join(threads[:4])}"
    return f"{_who(procs)} ({where}{thread})"


def render_text(stacks: Stacks) -> str:
    """Each group: its heading, then its frames outermost first (as a traceback, the innermost last)."""
    what = "every thread" if stacks.all_threads else "main threads"
    expected = stacks.answered + len(stacks.missing)
    lines = [
        f"Stacks of {stacks.answered} of {expected} processes ({what}), gathered in "
        f"{stacks.collection_time * 1000:.1f} ms; identical stacks folded",
        "",
    ]
    for group in stacks.groups:
        lines.append(heading(group) + ":")
        for collective in group.collectives:
            inside = stacks.inside.get((collective.comm, collective.op, collective.number), ())
            lines.append("    " + collective.text(group.collective_s, inside))
        if group.cut:
            lines.append("    ... (outermost frames left out)")
        lines += [f"    {frame}" for frame in group.frames] or ["    (no Python frames)"]
        lines.append("")
    if stacks.phases:
        lines.append("In a phase their code declared (rasd.phase):")
        for ph in stacks.phases:
            limit = f"limit {ph.limit:.0f} s" if ph.limit else "the busy limit"
            lines.append(f"    {ph.proc.name}: {ph.name}, for {ph.seconds:.1f} s ({limit})")
        lines.append("")
    if stacks.missing:
        lines.append("Not answering (stopped, its RAS thread starved by a GIL hog, or dead and not yet known):")
        for m in stacks.missing:
            if m.frames and m.age_s is not None:
                lines.append(f"    {m.proc.name}: last seen {m.age_s:.1f} s before, in {position_text(m.frames)}")
            else:
                lines.append(f"    {m.proc.name}: no position seen")
        lines.append("")
    return "\n".join(lines)


def render_json(stacks: Stacks, host: str, pid: int, timestamp: float) -> str:
    def frames(fs: Sequence[Frame]) -> list[dict[str, Any]]:
        return [{"file": f.file, "line": f.line, "function": f.function} for f in fs]

    doc = {
        "stacks": {
            "host": host,
            "pid": pid,
            "timestamp": timestamp,
            "collection_time_sec": round(stacks.collection_time, 6),
            "all_threads": stacks.all_threads,
            "answered_count": stacks.answered,
            "groups": [
                {
                    "processes": [{"host": p.host, "pid": p.pid, "rank": p.rank} for p in g.procs],
                    "threads": sorted({name for _, name in g.threads}),
                    "cut": g.cut,
                    "collectives": [
                        {
                            "state": c.state,
                            "communicator": c.comm,
                            "op": c.op,
                            "operation": c.number,
                            "seconds": round(g.collective_s, 3) if c.state == INSIDE else None,
                            "inside_ranks": [p.rank for p in stacks.inside.get((c.comm, c.op, c.number), ())],
                        }
                        for c in g.collectives
                    ],
                    "frames": frames(g.frames),
                }
                for g in stacks.groups
            ],
            "phases": [
                {
                    "host": ph.proc.host,
                    "pid": ph.proc.pid,
                    "rank": ph.proc.rank,
                    "name": ph.name,
                    "seconds": round(ph.seconds, 3),
                    "limit_sec": ph.limit,
                }
                for ph in stacks.phases
            ],
            "missing": [
                {
                    "host": m.proc.host,
                    "pid": m.proc.pid,
                    "rank": m.proc.rank,
                    "last_seen": None
                    if m.age_s is None
                    else {"age_sec": round(m.age_s, 3), "frames": frames(m.frames)},
                }
                for m in stacks.missing
            ],
        }
    }
    return json.dumps(doc, indent=2) + "\n"
