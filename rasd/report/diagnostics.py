"""The DIAGNOSTICS report: every process's configuration, compared, in NCCL 2.31's layout (reference §9.1).

A diagnostics gather (``wire.Ask.DIAGNOSTICS``) brings the root one ``Configuration`` per answering process (made
by ``rasd.net.configuration``). ``check`` compares them and returns the report's lines, each an ``[OK]`` or an
``[INFO]``, in a fixed order: the GPUs, the driver and library versions, the settings by prefix (``NCCL_*``,
``TORCH_*``, ``CUDA_*``, ``TORCHRAS_*``), the clocks and the hosts. As NCCL does, a value is compared against the
lowest rank's, the outliers are named as a rank set (``{0,3,5}``, or the first 8 and ``(N=12)``), and a setting that
differs is listed once per value. NCCL scopes each check to a communicator; the mesh is the whole job, so ours are
scoped to the job's processes. ``render_text`` writes NCCL's lines (``<host>:<pid> NCCL DIAG <tag><message>``);
``render_json`` is ours (NCCL has no JSON form; docs/protocol.md "DIAGNOSTICS").
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rasd.core.answer import Answer
from rasd.core.peers import Addr, PeerInfo

#: The version of the answer's format (``Configuration.encode``); an answer of another version is not compared.
FORMAT = 1
#: The prefixes of the settings compared, each a check of its own, in this order.
SETTING_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "TORCHRAS_")
#: NCCL's fixed-width tags (``RAS_DIAG_TAG_OK`` / ``RAS_DIAG_TAG_INFO``).
OK = "[OK]   "
INFO = "[INFO] "
#: A rank set names at most this many ranks (NCCL's ``RAS_DIAG_RANK_SET_MAX``).
RANK_SET_MAX = 8
#: A clock further than this from the root's is named (time stamps in logs and the journal stop lining up).
CLOCK_TOLERANCE_S = 1.0
#: NCCL cuts a key or value to 255 characters and marks the cut.
VALUE_MAX = 255


@dataclass(frozen=True)
class Configuration:
    """One process's answer to a diagnostics gather. A field is None when the process cannot tell; ``gpu_note``
    then says why its GPU fields are empty (a CPU-only torch, CUDA not started in the process, no torch)."""

    host: str
    pid: int
    rank: int  # the global rank, -1 when the process does not know it
    wall: float  # time.time() when the answer was made, for the clock check
    python: str
    torch: str | None
    torchras: str
    cuda_runtime: str | None = None
    cuda_driver: str | None = None
    nccl: str | None = None
    gpu_count: int | None = None
    gpu_model: str | None = None
    gpu_memory_bytes: int | None = None
    gpu_note: str = ""
    #: The settings compared, by name; a secret's value is replaced by a digest of it (``rasd.net.configuration``).
    settings: dict[str, str] = field(default_factory=dict)
    #: Settings left out to keep the answer within the wire's bound.
    truncated: bool = False

    def encode(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Configuration | None:
        """The configuration in an answer, or None for an empty, malformed or foreign one."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.pop("format", None) != FORMAT:
                return None
            settings = doc.get("settings", {})
            if not isinstance(settings, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in settings.items()
            ):
                return None
            config = cls(**doc)
            if not isinstance(config.host, str) or not isinstance(config.pid, int) or not isinstance(config.rank, int):
                return None
            return config
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Line:
    tag: str  # OK or INFO
    check: str
    message: str  # after "<check>: "

    @property
    def text(self) -> str:
        return f"{self.tag}{self.check}: {self.message}"


@dataclass(frozen=True)
class Diagnostics:
    """What the root makes of a diagnostics gather."""

    lines: tuple[Line, ...]
    #: The configurations compared, in rank order (ranks unknown last, by host and pid).
    configurations: tuple[Configuration, ...]
    #: Live processes of the job that did not answer, or whose answer was empty or unreadable.
    missing: tuple[PeerInfo, ...]
    collection_time: float


def _clean(text: str) -> str:
    """As NCCL prints a key or a value: control characters as ``?``, cut to 255 characters plus ``...``."""
    text = "".join("?" if ord(c) < 32 or ord(c) == 127 else c for c in text)
    return text if len(text) <= VALUE_MAX else text[:VALUE_MAX] + "..."


def _who(config: Configuration) -> str:
    return str(config.rank) if config.rank >= 0 else f"{config.host}:{config.pid}"


def _name(config: Configuration) -> str:
    """``rank 3``, or ``host:pid`` for a process that does not know its rank."""
    return f"rank {config.rank}" if config.rank >= 0 else f"{config.host}:{config.pid}"


def rank_set(configs: Sequence[Configuration]) -> str:
    """``{0,3,5}``, or ``{0,1,2,3,4,5,6,7,...} (N=12)`` past eight (NCCL's ``rasDiagnosticsFormatRankSet``)."""
    names = [_who(c) for c in configs]
    if len(names) <= RANK_SET_MAX:
        return "{" + ",".join(names) + "}"
    return "{" + ",".join(names[:RANK_SET_MAX]) + ",...} (N=" + str(len(names)) + ")"


def _order(config: Configuration) -> tuple[int, int, str, int]:
    return (0, config.rank, "", 0) if config.rank >= 0 else (1, 0, config.host, config.pid)


def _ranks(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


def _same(
    label: str,
    configs: Sequence[Configuration],
    value: Callable[[Configuration], object],
    show: Callable[[object], str] = str,
    why: str = "",
) -> list[Line]:
    """One check of a value every process should share: OK when all agree, else the outliers against the lowest
    rank's value, then each value with its ranks. None (the process cannot tell) is shown as ``unavailable`` and
    ``why``, NCCL's ``[INFO] <check>: unavailable across N ranks``."""
    first = configs[0]
    reference = value(first)
    n = _ranks(len(configs))

    def shown(v: object) -> str:
        return show(v) if v is not None else "unavailable" + (f" ({why})" if why else "")

    outliers = [c for c in configs if value(c) != reference]
    if not outliers:
        if reference is None:
            return [Line(INFO, label, f"{shown(None)} across {n}")]
        return [Line(OK, label, f"{shown(reference)} consistent across {n}")]
    groups: dict[str, list[Configuration]] = defaultdict(list)
    for c in configs:
        groups[shown(value(c))].append(c)
    lines = [
        Line(
            INFO,
            label,
            f"mismatch across {n}, rank(s) {rank_set(outliers)} differ from {_name(first)} ({shown(reference)})",
        )
    ]
    lines += [Line(INFO, label, f"{other} on rank(s) {rank_set(group)}") for other, group in groups.items()]
    return lines


def _gpus(configs: Sequence[Configuration]) -> list[Line]:
    label = "GPU inventory"
    without = [c for c in configs if not c.gpu_count]
    if len(without) == len(configs):
        notes: dict[str, list[Configuration]] = defaultdict(list)
        for c in configs:
            notes[c.gpu_note or "no CUDA device"].append(c)
        if len(notes) == 1:
            return [Line(INFO, label, f"{next(iter(notes))} across {_ranks(len(configs))}")]
        return [Line(INFO, label, f"{note} on rank(s) {rank_set(group)}") for note, group in notes.items()]
    lines = []
    first = configs[0]
    counts = [c for c in configs if c.gpu_count != first.gpu_count]
    models = [c for c in configs if c.gpu_model != first.gpu_model]
    n = _ranks(len(configs))
    if not counts and not models:
        lines.append(Line(OK, label, f"{first.gpu_count}x {first.gpu_model} per node consistent across {n}"))
    if counts:
        lines.append(
            Line(
                INFO,
                label,
                f"count mismatch across {n}, rank(s) {rank_set(counts)} differ from {_name(first)} "
                f"({first.gpu_count or 0})",
            )
        )
    if models:
        lines.append(
            Line(
                INFO,
                label,
                f"model mismatch across {n}, rank(s) {rank_set(models)} differ from {_name(first)} "
                f"({first.gpu_model or 'unavailable'})",
            )
        )
    lines += _same("GPU memory", configs, lambda c: c.gpu_memory_bytes, lambda v: f"{int(str(v)) / 2**30:.1f} GiB")
    return lines


def _settings(prefix: str, configs: Sequence[Configuration]) -> list[Line]:
    """NCCL's ``NCCL environment`` check, for one prefix: every name set anywhere, compared by value (unset is a
    value), one line per value of each name that differs."""
    label = f"{prefix[:-1]} environment"
    names = sorted({name for c in configs for name in c.settings if name.startswith(prefix)})
    n = _ranks(len(configs))
    lines: list[Line] = []
    truncated = [c for c in configs if c.truncated]
    differing = 0
    for name in names:
        groups: dict[str, list[Configuration]] = defaultdict(list)
        for c in configs:
            groups[c.settings.get(name, "(unset)")].append(c)
        if len(groups) == 1:
            continue
        differing += 1
        lines.append(Line(INFO, label, f"mismatch across {n} for {_clean(name)}"))
        lines += [
            Line(INFO, label, f"{_clean(name)}={_clean(value)} on rank(s) {rank_set(group)}")
            for value, group in groups.items()
        ]
    if differing:
        lines.append(Line(INFO, label, f"{differing} {prefix}* env var(s) differ across ranks"))
    else:
        lines.append(Line(OK, label, f"{prefix}* env vars consistent across {n}"))
    if truncated:
        lines.append(
            Line(
                INFO,
                label,
                f"{len(truncated)} rank(s) had more settings than an answer holds; comparison may be partial",
            )
        )
    return lines


def _clocks(configs: Sequence[Configuration], root: Configuration, collection_time: float) -> list[Line]:
    """Each clock against the root's. An answer was made between the gather's start and its end, so an offset is
    known to within the collection time (the bound printed); only offsets beyond it and the tolerance are named."""
    label = "Clock"
    # The root answered at the start of the gather; the others up to ``collection_time`` later.
    offsets = [(c, c.wall - root.wall) for c in configs]
    slack = CLOCK_TOLERANCE_S + collection_time
    off = [(c, o) for c, o in offsets if o > slack or o < -CLOCK_TOLERANCE_S]
    n = _ranks(len(configs))
    if not off:
        largest = max((o for _, o in offsets), key=abs)
        return [
            Line(
                OK,
                label,
                f"within {CLOCK_TOLERANCE_S:g} s of {_name(root)}'s clock across {n} (largest offset {largest:+.3f} s, "
                f"measured to {collection_time * 1000:.1f} ms)",
            )
        ]
    worst, offset = max(off, key=lambda pair: abs(pair[1]))
    return [
        Line(
            INFO,
            label,
            f"rank(s) {rank_set([c for c, _ in off])} more than {CLOCK_TOLERANCE_S:g} s from {_name(root)}'s clock "
            f"across {n} (worst {offset:+.3f} s on {_name(worst)})",
        )
    ]


def _hosts(configs: Sequence[Configuration]) -> list[Line]:
    hosts = sorted({c.host for c in configs})
    shown = ", ".join(hosts[:RANK_SET_MAX]) + (", ..." if len(hosts) > RANK_SET_MAX else "")
    return [Line(OK, "Hosts", f"{_ranks(len(configs))} on {len(hosts)} host(s): {shown}")]


def check(
    answers: dict[Addr, Answer], peers: Iterable[PeerInfo], live: Iterable[Addr], root: Addr, collection_time: float
) -> Diagnostics:
    """Compare the answers of a diagnostics gather rooted at ``root``. ``live``: the processes expected to answer
    (the snapshot's peers less the dead and departed)."""
    by_addr = {p.addr: p for p in peers}
    decoded = {a: Configuration.decode(answer.own) for a, answer in answers.items()}  # all its own part
    configs = sorted((c for c in decoded.values() if c is not None), key=_order)
    missing = tuple(by_addr[a] for a in live if decoded.get(a) is None and a in by_addr)
    lines: list[Line] = []
    if missing:
        who = ", ".join(
            (f"rank {p.rank} " if p.rank >= 0 else "") + f"{p.hostname}:{p.pid}" for p in missing[:RANK_SET_MAX]
        )
        more = f" and {len(missing) - RANK_SET_MAX} more" if len(missing) > RANK_SET_MAX else ""
        lines.append(
            Line(
                INFO,
                "Processes",
                f"diagnostics incomplete, gathered {len(configs)}/{len(configs) + len(missing)} ranks; no answer "
                f"from {who}{more}",
            )
        )
    root_config = decoded.get(root)
    if configs:
        # Why the GPU fields are empty, when every process says the same (a CPU job: once, on each line).
        notes = {c.gpu_note for c in configs}
        why = notes.pop() if len(notes) == 1 else "on some ranks: see GPU inventory"
        lines += _gpus(configs)
        lines += _same("CUDA driver version", configs, lambda c: c.cuda_driver, why=why)
        lines += _same("CUDA runtime version", configs, lambda c: c.cuda_runtime, why=why)
        lines += _same("NCCL version", configs, lambda c: c.nccl, why=why)
        lines += _same("torch version", configs, lambda c: c.torch, why="torch not imported")
        lines += _same("Python version", configs, lambda c: c.python)
        lines += _same("torchras version", configs, lambda c: c.torchras)
        for prefix in SETTING_PREFIXES:
            lines += _settings(prefix, configs)
        if root_config is not None:
            lines += _clocks(configs, root_config, collection_time)
        lines += _hosts(configs)
    return Diagnostics(tuple(lines), tuple(configs), missing, collection_time)


def render_text(diag: Diagnostics, host: str, pid: int) -> str:
    """NCCL's lines: a header, the checks, the completion line, each prefixed ``<host>:<pid> NCCL DIAG ``."""
    prefix = f"{host}:{pid} NCCL DIAG "
    body = ["=== RAS Diagnostics ===", *(line.text for line in diag.lines)]
    body.append(
        f"RAS diagnostics completed in {diag.collection_time * 1000:.1f} ms across {len(diag.configurations)} RAS peers"
    )
    return "".join(f"{prefix}{text}\n" for text in body)


def render_json(diag: Diagnostics, host: str, pid: int, timestamp: float) -> str:
    """Ours: the same checks as objects, and every configuration compared (docs/protocol.md "DIAGNOSTICS")."""
    doc: dict[str, Any] = {
        "diagnostics": {
            "host": host,
            "pid": pid,
            "timestamp": timestamp,
            "collection_time_sec": round(diag.collection_time, 6),
            "peers_count": len(diag.configurations),
            "missing": [{"host": p.hostname, "pid": p.pid, "rank": p.rank} for p in diag.missing],
            "checks": [
                {"tag": line.tag.strip()[1:-1], "check": line.check, "message": line.message} for line in diag.lines
            ],
            "processes": [asdict(c) for c in diag.configurations],
        }
    }
    return json.dumps(doc, indent=2) + "\n"
