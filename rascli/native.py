"""Native frames on demand (``rascli --stacks --native``): the C and C++ frames of each rank's main thread.

A STACKS report shows where each rank is in its Python code; a rank blocked inside a C call (a GIL-released socket
read, a gloo or NCCL wait, a CUDA synchronisation, a store's ``get``) shows only the Python frame that made the call.
Its native frames come from py-spy (``py-spy dump --native --pid P``, MIT licence, one static binary in its wheel:
``pip install py-spy``, or ``pip install torchras[native]``), which reads the process's memory with ptrace: no code of
ours runs in the training process, which py-spy holds stopped only while it reads the stacks (milliseconds), and
nothing of this runs unless asked. rascli asks the job for the STACKS report as
JSON (who the processes are), then dumps the processes that run on its own host, a few at a time. A process on
another host cannot be read from here (rascli says so, naming the host); a kernel that does not allow ptrace
(``kernel.yama.ptrace_scope`` 1 or more for a process that is not rascli's descendant, a container without
``CAP_SYS_PTRACE``) gets one line that says so and what allows it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

#: Dumps run at once (each is a py-spy process reading one training process's memory).
PARALLEL = 4
#: Seconds one dump may take: a process with torch loaded takes 1-2 s (py-spy reads libtorch's symbols).
DUMP_TIMEOUT_S = 60.0
YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")

#: A frame py-spy could not name: its address, which differs from process to process (ASLR); folded as ``0x...``.
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+(?= \()")
_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')


@dataclasses.dataclass(frozen=True)
class Target:
    """A process of the job, as the STACKS report names it."""

    rank: int
    host: str
    pid: int

    @property
    def name(self) -> str:
        return f"rank {self.rank} ({self.host}:{self.pid})" if self.rank >= 0 else f"{self.host}:{self.pid}"


@dataclasses.dataclass(frozen=True)
class NativeThread:
    """One thread as py-spy dumped it: its id, its state (``idle``, ``active+gil``...), its name when py-spy knows
    it, and its frames outermost first (py-spy lists them innermost first)."""

    tid: int
    state: str
    name: str
    frames: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Dump:
    target: Target
    threads: tuple[NativeThread, ...] = ()
    error: str = ""  # why there are no threads
    seconds: float = 0.0


def find_py_spy() -> str | None:
    """py-spy on the PATH, or beside this Python (a virtual environment not activated)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def targets(report: dict[str, Any]) -> list[Target]:
    """Every answering process of a STACKS report (``SET FORMAT json``), by rank. A report asked for with
    ``--ranks`` holds only those ranks: the job filtered them."""
    found: dict[tuple[str, int], Target] = {}
    for group in report.get("stacks", {}).get("groups", ()):
        for p in group.get("processes", ()):
            target = Target(int(p["rank"]), str(p["host"]), int(p["pid"]))
            found[(target.host, target.pid)] = target
    return sorted(found.values(), key=lambda t: (t.rank < 0, t.rank, t.host, t.pid))


def on_this_host(target: Target) -> bool:
    """Whether the process runs here: its host is this host's name (or a loopback) and its pid lives."""
    names = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"}
    return target.host in names and psutil.pid_exists(target.pid)


def parse(output: str, pid: int, all_threads: bool) -> tuple[NativeThread, ...]:
    """py-spy's ``dump`` text: its threads (the main one only unless ``all_threads``: on Linux the main thread's id
    is the process's)."""
    threads: list[NativeThread] = []
    current: tuple[int, str, str] | None = None
    frames: list[str] = []

    def close() -> None:
        if current is not None:
            threads.append(NativeThread(current[0], current[1], current[2], tuple(reversed(frames))))

    for line in output.splitlines():
        match = _THREAD.match(line)
        if match:
            close()
            tid_text, state, name = match.groups()
            current, frames = (int(tid_text, 0), state, name or ""), []
        elif current is not None and line.startswith("    ") and line.strip():
            frames.append(line.strip())
    close()
    if all_threads:
        return tuple(sorted(threads, key=lambda t: t.tid != pid))
    main = [t for t in threads if t.tid == pid or t.name == "MainThread"]
    return tuple(main[:1])


def explain(returncode: int, stderr: str) -> str:
    """Why py-spy could not dump a process, in one line with what would allow it."""
    text = stderr.strip().splitlines()[-1] if stderr.strip() else f"py-spy exited with status {returncode}"
    lowered = stderr.lower()
    if "permission" in lowered or "not permitted" in lowered:
        scope = ""
        try:
            scope = f"kernel.yama.ptrace_scope is {YAMA.read_text().strip()}; "
        except OSError:
            pass
        return (
            f"ptrace is not allowed ({scope}py-spy: {text}): run rascli as root or as the job's user with "
            "kernel.yama.ptrace_scope=0, or give the container CAP_SYS_PTRACE"
        )
    if "no such process" in lowered or "failed to find" in lowered:
        return f"the process is gone (py-spy: {text})"
    return f"py-spy: {text}"


def dump(py_spy: str, target: Target, all_threads: bool, timeout: float = DUMP_TIMEOUT_S) -> Dump:
    """Dump one process's native frames with py-spy. Never raises."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [py_spy, "dump", "--native", "--pid", str(target.pid)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Dump(target, error=f"py-spy did not finish within {timeout:g} s", seconds=time.monotonic() - started)
    except OSError as err:
        return Dump(target, error=f"cannot run {py_spy}: {err}", seconds=time.monotonic() - started)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        return Dump(target, error=explain(done.returncode, done.stderr), seconds=seconds)
    threads = parse(done.stdout, target.pid, all_threads)
    if not threads:
        return Dump(target, error="py-spy found no main thread in its dump", seconds=seconds)
    return Dump(target, threads, seconds=seconds)


def dump_all(py_spy: str, local: Sequence[Target], all_threads: bool) -> list[Dump]:
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        return list(pool.map(lambda t: dump(py_spy, t, all_threads), local))


def py_spy_version(py_spy: str) -> str:
    try:
        done = subprocess.run([py_spy, "--version"], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() or "py-spy"
    except (OSError, subprocess.TimeoutExpired):
        return "py-spy"


@dataclasses.dataclass(frozen=True)
class NativeReport:
    tool: str  # "py-spy 0.4.3", or "" when py-spy is not there
    dumps: tuple[Dump, ...]
    elsewhere: tuple[Target, ...]  # processes on other hosts
    seconds: float
    missing_tool: bool = False


def collect(report: dict[str, Any], all_threads: bool) -> NativeReport:
    """The native frames of the report's processes on this host."""
    started = time.monotonic()
    everyone = targets(report)
    local = [t for t in everyone if on_this_host(t)]
    elsewhere = tuple(t for t in everyone if t not in local)
    py_spy = find_py_spy()
    if py_spy is None:
        return NativeReport("", (), elsewhere, 0.0, missing_tool=True)
    dumps = dump_all(py_spy, local, all_threads)
    return NativeReport(py_spy_version(py_spy), tuple(dumps), elsewhere, time.monotonic() - started)


def _who(members: Sequence[Target]) -> str:
    ranked = sorted(t.rank for t in members if t.rank >= 0)
    other = [f"{t.host}:{t.pid}" for t in members if t.rank < 0]
    parts = [("rank " if len(ranked) == 1 else "ranks ") + ",".join(map(str, ranked))] if ranked else []
    return "; ".join(parts + other)


def _states(members: Sequence[tuple[Target, NativeThread]]) -> str:
    """The py-spy state of folded threads: the one state they share, else each state with its members."""
    by_state: dict[str, list[Target]] = {}
    for target, thread in members:
        by_state.setdefault(thread.state, []).append(target)
    if len(by_state) == 1:
        return next(iter(by_state))
    return "; ".join(f"{state} on {_who(targets)}" for state, targets in sorted(by_state.items()))


def render_text(native: NativeReport) -> str:
    """The native section printed after the STACKS report: identical native stacks folded (an unnamed frame's
    address aside), each outermost first, as the STACKS report lists frames."""
    if native.missing_tool:
        return (
            "Native frames: py-spy is not installed (pip install py-spy, or pip install torchras[native]); "
            "rascli --stacks --native reads each process's C and C++ frames with it\n"
        )
    lines = [
        f"Native frames of the processes on this host ({native.tool} dump --native; {len(native.dumps)} "
        f"process{'es' if len(native.dumps) != 1 else ''} in {native.seconds:.1f} s), outermost first",
        "",
    ]
    # py-spy's idle/active is a sample of the thread's OS state at the dump's instant: a thread that sleeps in a
    # loop is caught "active" now and then. Identical frames fold whatever the state; the label says each state's
    # members.
    groups: dict[tuple[str, tuple[str, ...]], list[tuple[Target, NativeThread]]] = {}
    for d in native.dumps:
        for thread in d.threads:
            key = (thread.name, tuple(_ADDRESS.sub("0x...", frame) for frame in thread.frames))
            groups.setdefault(key, []).append((d.target, thread))
    for (name, frames), members in sorted(groups.items(), key=lambda item: -len(item[1])):
        called = f', thread "{name}"' if name else ""
        if len(members) == 1:
            ((target, thread),) = members
            who = f"rank {target.rank}" if target.rank >= 0 else "process"
            lines.append(f"{who} ({target.host}:{target.pid}{called}, tid {thread.tid}, {thread.state}):")
        else:
            hosts = ", ".join(sorted({t.host for t, _ in members})[:4])
            lines.append(
                f"{_who([t for t, _ in members])} ({len(members)} processes on {hosts}{called}, {_states(members)}):"
            )
        lines += [f"    {frame}" for frame in frames] or ["    (no frames)"]
        lines.append("")
    failed = [d for d in native.dumps if d.error]
    if failed or native.elsewhere:
        lines.append("Not dumped:")
        lines += [f"    {d.target.name}: {d.error}" for d in failed]
        lines += [f"    {t.name}: on another host; run rascli --stacks --native on {t.host}" for t in native.elsewhere]
        lines.append("")
    return "\n".join(lines)


def as_json(native: NativeReport) -> dict[str, Any]:
    def target(t: Target) -> dict[str, Any]:
        return {"rank": t.rank, "host": t.host, "pid": t.pid}

    return {
        "tool": native.tool or None,
        "seconds": round(native.seconds, 3),
        "processes": [
            {
                **target(d.target),
                "seconds": round(d.seconds, 3),
                "error": d.error or None,
                "threads": [
                    {"tid": t.tid, "state": t.state, "name": t.name, "frames": list(t.frames)} for t in d.threads
                ],
            }
            for d in native.dumps
        ],
        "elsewhere": [target(t) for t in native.elsewhere],
        "error": "py-spy is not installed" if native.missing_tool else None,
    }
