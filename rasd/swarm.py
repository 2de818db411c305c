"""``rasd swarm``: a local job of N lightweight processes (no torch), each running a RAS node.

It is the first thing a new user runs, and the harness of the integration tests and benchmarks. Every member
joins through a ``FileStore`` in the swarm's directory, writes its events as JSON lines to ``events-<i>.jsonl``,
and obeys the commands written to ``control-<i>.<n>`` files, one command per file, in the order of ``n`` (each
command a file of its own: a second command written before the member read the first must not replace it), so a
test can make it misbehave. The harness rings the member's doorbell (a FIFO, ``doorbell-<i>``) after writing one;
between commands the member's main thread waits on that one line, so a stack sample finds every idle member in the
same frame (a polling loop was sometimes caught elsewhere, and split the swarm's stacks into two groups):

    crash            exit at once without a goodbye (like a segfault)
    raise            die of an uncaught exception (a fault: DEAD, not LEFT)
    exit             exit normally (the node says goodbye: LEFT)
    fork             fork a child that lives on (like a DataLoader worker)
    gil SECONDS      hold the GIL in a C call for that long

Signals work as usual: ``kill -9``, ``kill -STOP`` / ``kill -CONT``, ``kill -TERM`` (a clean exit).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.peers import Addr

READY_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------------------------------------------
# The member process


def member_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rasd-swarm-member")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--index", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()
    configure_logging(args.index)
    import rasd
    from rasd.net.bootstrap import FileStore

    work = Path(args.dir)
    events_path = work / f"events-{args.index}.jsonl"
    events = open(events_path, "a", buffering=1)  # noqa: SIM115 - written until the member's last moment

    def record(e: rasd.Event) -> None:
        events.write(json.dumps(event_record(e)) + "\n")

    # A member is local rank I of its host: a metrics port set with TORCHRAS_METRICS_ADDR is the port plus I, as
    # under torchrun (docs/operations.md, "Metrics and alerts").
    os.environ["LOCAL_RANK"] = str(args.index)
    services = _member_services(args.index)
    store = FileStore(os.environ.get("TORCHRAS_SWARM_STORE") or work / "store")
    node = rasd.start(store, rank=args.index, services=services["services"], local_data=services["local_data"])
    if node is None:
        print(f"member {args.index}: could not start its RAS node", file=sys.stderr)
        return 1
    sub = node.on_event(record, replay=True)
    doorbell = _open_doorbell(work / f"doorbell-{args.index}")
    client = node.client_address
    info = work / f"member-{args.index}.json"
    tmp = info.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "index": args.index,
                "pid": os.getpid(),
                "host": node.address.host,
                "port": node.address.port,
                "client_port": client[1] if client else None,
                "metrics_port": node.metrics_address[1] if node.metrics_address else None,
            }
        )
    )
    os.replace(tmp, info)  # the harness polls for the file: it must never see it half written

    def leave(*_: object) -> None:  # SIGTERM: a clean exit, with a goodbye (LEFT)
        rasd.stop()
        sub.close()
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    while True:
        # Rung after each command; the timeout only covers a ring that could not be given (a full pipe).
        if select.select([doorbell], [], [], DOORBELL_TIMEOUT_S)[0]:
            with contextlib.suppress(BlockingIOError):
                os.read(doorbell, 4096)
        for control in sorted(work.glob(f"control-{args.index}.*[0-9]")):  # not the harness's ".tmp" files
            commands = control.read_text().split("\n")
            control.unlink()
            for line in commands:
                _obey(line.split(), services)


#: How long an idle member waits for its doorbell before it looks for commands anyway.
DOORBELL_TIMEOUT_S = 1.0


def _open_doorbell(path: Path) -> int:
    """The member's end of its doorbell FIFO, opened read-write so that it never reads end-of-file when no harness
    holds it open, and non-blocking so that draining it never waits."""
    path.unlink(missing_ok=True)  # a swarm directory used again
    os.mkfifo(path)
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


def configure_logging(index: int) -> None:
    import logging

    level = os.environ.get("TORCHRAS_LOG_LEVEL", "").strip().upper() or "WARNING"
    known = isinstance(logging.getLevelName(level), int)
    logging.basicConfig(
        level=level if known else logging.WARNING,
        stream=sys.stderr,
        format=f"[member {index}] %(levelname)s %(message)s",
    )
    if not known:
        logging.getLogger("rasd").warning(
            "rasd: TORCHRAS_LOG_LEVEL=%r is not a log level (DEBUG, INFO, WARNING, ERROR); using the default, WARNING",
            os.environ["TORCHRAS_LOG_LEVEL"],
        )


def _die_with_parent() -> None:
    """A member must not outlive the swarm that started it (Linux: PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        os._exit(1)


def _member_services(index: int) -> dict[str, Any]:
    """Extra services of a member (the client port, synthetic communicators): filled in by later layers."""
    try:
        from rasd.swarm_services import member_services
    except ImportError:
        from rasd.core.comms import ProcessData

        return {"services": [], "local_data": ProcessData, "obey": lambda words: False}
    return member_services(index)


def _obey(words: list[str], services: dict[str, Any]) -> None:
    if not words:
        return
    cmd = words[0]
    if cmd == "crash":
        os._exit(3)
    elif cmd == "exit":
        sys.exit(0)  # atexit stops the node: a goodbye
    elif cmd == "raise":
        raise RuntimeError("injected exception")
    elif cmd == "fork":
        if os.fork() == 0:
            while True:  # the child lives on, like a DataLoader worker whose parent died
                time.sleep(1)
    elif cmd == "gil":
        # ctypes.PyDLL calls keep the GIL: the RAS thread cannot run for the whole sleep.
        ctypes.PyDLL(None).usleep(int(float(words[1]) * 1_000_000))
    else:
        services["obey"](words)


def event_record(e: Any) -> dict[str, Any]:
    return {
        "wall": time.time() - (time.monotonic() - e.at),
        "kind": str(e.kind),
        "addr": f"{e.addr.host}:{e.addr.port}" if e.addr else None,
        "pid": e.peer.pid if e.peer else None,
        "rank": e.peer.rank if e.peer else None,
        "details": e.details,
    }


# ----------------------------------------------------------------------------------------------------------------
# The harness


#: How long ``leave`` waits for one member to say goodbye before it moves on to the next.
GOODBYE_TIMEOUT_S = 5.0


@dataclass
class Member:
    index: int
    proc: subprocess.Popen
    pid: int = 0
    host: str = ""
    port: int = 0
    #: The client port this member serves (None without one).
    client_port: int | None = None
    #: The port this member serves its Prometheus metrics on (None without: ``TORCHRAS_METRICS_ADDR``).
    metrics_port: int | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


class Swarm:
    """N member processes on this machine. Use as a context manager; ``close`` kills what is left."""

    def __init__(
        self,
        n: int,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        store_dir: str | None = None,
        member_env: dict[int, dict[str, str]] | None = None,
    ) -> None:
        """``env``: added to every member's environment; ``member_env``: more, for some members only (member index
        -> variables), as when one node of a job was started with other settings."""
        self.n = n
        self.member_env = member_env or {}
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="torchras-swarm-")
        self.dir = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("TORCHRAS_SECRET", os.urandom(16).hex())
        self.env["TORCHRAS_SWARM_SIZE"] = str(n)
        self.env.setdefault("TORCHRAS_SWARM_EPOCH", repr(time.time()))
        if store_dir:
            self.env["TORCHRAS_SWARM_STORE"] = store_dir
        self.members: list[Member] = []
        self._commands = 0

    def start(self, wait_mesh: bool = True, timeout: float = READY_TIMEOUT_S) -> Swarm:
        for i in range(self.n):
            proc = subprocess.Popen(
                [sys.executable, "-m", "rasd.swarm", "--dir", str(self.dir), "--index", str(i)],
                env={**self.env, **self.member_env.get(i, {})},
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.members.append(Member(i, proc))
        deadline = time.monotonic() + timeout
        for m in self.members:
            path = self.dir / f"member-{m.index}.json"
            while not path.exists():
                if time.monotonic() > deadline or m.proc.poll() is not None:
                    raise RuntimeError(f"swarm member {m.index} did not start")
                time.sleep(0.02)
            info = json.loads(path.read_text())
            m.pid, m.host, m.port, m.client_port = info["pid"], info["host"], info["port"], info.get("client_port")
            m.metrics_port = info.get("metrics_port")
        if wait_mesh:
            self.wait_for(
                lambda: all(self.peers_known(i) >= self.n for i in range(self.n)),
                timeout=max(1.0, deadline - time.monotonic()),
                what="every member to know every peer",
            )
            left = max(1.0, deadline - time.monotonic())
            self.wait_for(self.ring_connected, timeout=left, what="every member to connect to its ring neighbours")
        return self

    # faults
    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to member ``i``; after SIGKILL, reap it (no zombie is left behind)."""
        os.kill(self.members[i].pid, sig)
        if sig == signal.SIGKILL:
            try:
                self.members[i].proc.wait(5)
            except subprocess.TimeoutExpired:
                pass  # the next ``reap`` collects it

    def pause(self, i: int) -> None:
        self.kill(i, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        self.kill(i, signal.SIGCONT)

    def command(self, i: int, *words: str) -> None:
        """Have member ``i`` obey one command (a file of its own, written whole: the member never reads half)."""
        self._commands += 1
        path = self.dir / f"control-{i}.{self._commands:09d}"
        tmp = path.parent / (path.name + ".tmp")
        tmp.write_text(" ".join(words) + "\n")
        os.replace(tmp, path)
        self._ring(i)

    def _ring(self, i: int) -> None:
        """Wake member ``i`` to read its commands; a member gone, or not yet listening, finds them by its timeout."""
        try:
            fd = os.open(self.dir / f"doorbell-{i}", os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no FIFO yet, or no reader (ENXIO): the member is gone or not started
        try:
            os.write(fd, b"\n")
        except OSError:
            pass  # a full pipe: the member has rings enough waiting
        finally:
            os.close(fd)

    # observation
    def events(self, i: int, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.dir / f"events-{i}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written
            if kind is None or rec["kind"] == kind:
                out.append(rec)
        return out

    def peers_known(self, i: int) -> int:
        return len({e["addr"] for e in self.events(i, "PEER_NEW")})

    def ring_connected(self) -> bool:
        """Every member has connected to both its ring neighbours (the table sorted by address, docs/architecture.md
        §2.3): the mesh has settled. Knowing every peer is not enough: a member whose table has just grown still
        links through a neighbour of the smaller table, and a gather started then may miss a process."""
        if self.n == 1:
            return True
        # The accepting side of a connection logs PEER_CONNECTED (the connecting side, PEER_CONNECTING).
        pairs = {frozenset((m.addr, e["addr"])) for m in self.members for e in self.events(m.index, "PEER_CONNECTED")}
        order = sorted(self.members, key=lambda m: Addr(m.host, m.port).sort_key())
        return all(frozenset((m.addr, order[(pos + 1) % len(order)].addr)) in pairs for pos, m in enumerate(order))

    def saw(self, i: int, kind: str, about: int) -> dict[str, Any] | None:
        addr = self.members[about].addr
        for e in self.events(i, kind):
            if e["addr"] == addr:
                return e
        return None

    def alive(self, i: int) -> bool:
        return self.members[i].proc.poll() is None

    def reap(self) -> None:
        """Collect every member that has exited (killed, crashed, or told to exit), so none lingers as a zombie."""
        for m in self.members:
            m.proc.poll()

    def wait_for(self, cond: Callable[[], bool], timeout: float, what: str = "condition", step: float = 0.02) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(step)

    def leave(self, timeout: float = GOODBYE_TIMEOUT_S) -> None:
        """End every member cleanly: one after the other, each says goodbye (SIGTERM: ``rasd.stop``), and the next
        goes once every member still running has recorded it LEFT. So no member is ever recorded DEAD, and each
        hears every goodbye before its own (a monitor on any of them sees the whole departure). Stopped members
        are continued first; a goodbye not recorded within ``timeout`` seconds is not waited for any longer."""
        for m in self.members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.pid, signal.SIGCONT)
        for m in self.members:
            if m.proc.poll() is not None:
                continue
            try:
                os.kill(m.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            others = [o.index for o in self.members if o is not m and o.proc.poll() is None]
            with contextlib.suppress(TimeoutError):
                self.wait_for(
                    functools.partial(self._all_saw_leave, others, m.index),
                    timeout,
                    what=f"the goodbye of member {m.index}",
                )
        deadline = time.monotonic() + timeout
        for m in self.members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                m.proc.wait(max(0.0, deadline - time.monotonic()))

    def _all_saw_leave(self, others: list[int], leaver: int) -> bool:
        return all(not self.alive(o) or self.saw(o, "PEER_LEFT", leaver) for o in others)

    def close(self) -> None:
        """Kill whatever is left (SIGKILL, its whole process group), reap it, and remove its endpoint files."""
        for m in self.members:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(m.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                m.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        _clean_endpoints(self.env)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Swarm:
        return self if self.members else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clean_endpoints(env: dict[str, str]) -> None:
    """A killed member cannot remove its endpoint file (docs/operations.md §2): the registry drops it now."""
    from rasd.net.endpoints import EndpointRegistry

    directory = env.get("TORCHRAS_RUN_DIR")
    EndpointRegistry(Path(directory) if directory else None).clean()


if __name__ == "__main__":
    sys.exit(member_main(sys.argv[1:]))
