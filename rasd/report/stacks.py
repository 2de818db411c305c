"""The STACKS report: every process's stacks, identical ones folded together (docs/protocol.md §2.6).

A STACKS gather (``wire.Ask.STACKS`` or ``STACKS_ALL``) brings the root one answer per process (made by
``rasd.net.thread_stacks``). ``fold`` groups the threads whose frames are identical, as py-spy's and torch's stack dumps
do, so that 1,000 ranks inside one all-reduce are one stack and the one rank elsewhere stands out; a process that
did not answer is listed with the last position the mesh saw of it, when one was seen. ``render_text`` writes the
groups, largest first (the stragglers last, beside the missing); ``render_json`` the same as data.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rasd.core.frames import Frame, position_text
from rasd.core.peers import Addr, PeerInfo

#: The version of a STACKS answer's format: a JSON object (``rasd.net.thread_stacks.answer`` writes it), compressed with
#: zlib. Stacks repeat themselves (paths, library frames): compressed, an answer is about a quarter of its size, which
#: is what the relays of a gather of thousands of processes carry (bench/README.md, "STATUS and STACKS latency").
FORMAT = 2
#: An answer's JSON is at most this long once decompressed (a small compressed answer can expand without bound).
MAX_DECODED = 1 << 20
#: A group names at most this many processes in its heading.
NAMED = 16


@dataclass(frozen=True)
class Proc:
    host: str
    pid: int
    rank: int  # -1: unknown

    @property
    def name(self) -> str:
        return f"rank {self.rank} ({self.host}:{self.pid})" if self.rank >= 0 else f"{self.host}:{self.pid}"


@dataclass
class Group:
    """Threads with identical frames, in processes listed by rank."""

    frames: tuple[Frame, ...]
    threads: list[tuple[Proc, str]] = field(default_factory=list)  # (process, thread name)
    cut: bool = False  # some thread's outermost frames were left out to fit the answer

    @property
    def procs(self) -> list[Proc]:
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


def _order(p: Proc) -> tuple[int, int, str, int]:
    return (0, p.rank, "", 0) if p.rank >= 0 else (1, 0, p.host, p.pid)


def _frames(raw: Any) -> tuple[Frame, ...]:
    return tuple(Frame(str(f), int(line), str(fn)) for f, line, fn in raw)


def encode(doc: dict[str, Any]) -> tuple[bytes, int]:
    """An answer's bytes, and the length of its JSON before compression (``decode`` refuses past MAX_DECODED)."""
    text = json.dumps(doc, separators=(",", ":")).encode()
    return zlib.compress(text, 1), len(text)


def decode(data: bytes) -> dict[str, Any] | None:
    """The answer's object, or None for an empty, malformed, oversized or foreign one."""
    try:
        inflate = zlib.decompressobj()
        text = inflate.decompress(data, MAX_DECODED)
        if inflate.unconsumed_tail or not inflate.eof:
            return None
        doc = json.loads(text)
    except (zlib.error, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    return doc


def fold(
    answers: dict[Addr, bytes],
    peers: Iterable[PeerInfo],
    live: Iterable[Addr],
    collection_time: float,
    all_threads: bool,
    ranks: frozenset[int] | None = None,
) -> Stacks:
    """Fold the answers of a STACKS gather. ``live``: the processes expected to answer; ``ranks``: keep only these
    ranks (None: all)."""
    by_addr = {p.addr: p for p in peers}
    # Keyed by the frames as they arrived (tuples of plain values): a Frame is made once per distinct stack, not
    # once per frame of every process (the folding of 4,096 processes' stacks, bench/README.md).
    groups: dict[tuple[tuple[Any, ...], ...], Group] = {}
    seen: dict[tuple[str, int], tuple[tuple[Frame, ...], float]] = {}
    phases: list[Phase] = []
    answered = 0
    unreadable = set()
    for addr, data in answers.items():
        doc = decode(data)
        if doc is None:
            unreadable.add(addr)
            continue
        try:
            proc = Proc(str(doc["host"]), int(doc["pid"]), int(doc["rank"]))
            threads = [(str(t["thread"]), tuple(map(tuple, t["frames"])), bool(t.get("cut"))) for t in doc["threads"]]
            for _, raw, _ in threads:
                if raw not in groups:
                    groups[raw] = Group(_frames(raw))  # checks each frame's shape, once per distinct stack
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
        if ranks is not None and proc.rank not in ranks:
            continue
        if phase is not None:
            phases.append(phase)
        answered += 1  # of the processes asked about, as ``missing`` counts them
        for name, raw, cut in threads:
            group = groups[raw]
            group.threads.append((proc, name))
            group.cut = group.cut or cut
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
    return Stacks(tuple(ordered), tuple(missing), answered, collection_time, all_threads, tuple(phases))


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
