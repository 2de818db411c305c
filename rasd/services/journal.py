"""The verdict journal: every verdict and every restart of this process, with its evidence, appended as one JSON
line to a file of the process's own in ``TORCHRAS_JOURNAL_DIR`` (off when unset). docs/operations.md §11 is the
reference: what a line holds (the contract with ``rascli --journal``), the bounds, and what a failure does.

Belongs here: the setting, the records (``Journal.record_of``: the one writer of the records), their bounds, and the
thread that writes them. The lines themselves (file names, schema version, encoding) are
``torchras_formats.journal_lines``, which ``rascli --journal`` decodes them with. Nothing here raises into the node
or into training.

Three threads touch a journal, each with one job::

    RAS thread      on_event: a verdict or a restart becomes a record (a dict), with the evidence the node holds:
                    its communicators' counts (read at most once per COUNTS_EVERY_S) and which Flight Recorder
                    groups they are. It is put on the queue: no I/O, no wait. A full queue drops it and counts it.
    writer thread   torchras-journal: takes everything queued, adds the Flight Recorder's recent entries (a dump at
                    most once per FR_EVERY_S), encodes each record as one line of at most MAX_LINE_BYTES, appends it
                    with one write(2) (in the kernel from then on: a kill -9 of the process loses nothing written),
                    and rotates the file at MAX_FILE_BYTES (one previous file kept, ``.1``).
    any thread      sync(budget): waits, at most the budget, until everything the node journaled before the call is
                    written; with ``verdict``, first for a verdict that restarts training. inprocess's monitor thread
                    calls it through ``rasd.sync_journal`` before a restart acts (its ``restart:`` line, the abort),
                    so the verdict behind a restart is in the file before the restart's first line, and the restart
                    never waits more than BUDGET_S for the journal, whatever the disk does.

A failure to write (no space left, a directory that is not one or cannot be written, a read-only file system) is
one WARNING per process naming the path and the error; the journal is then off in this process: records are no
longer queued, and every sync returns at once.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rasd.core.comms import OP_TYPES, CommRecord, ProcessData
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.report.model import is_error_code, rank_status
from torchras_formats.journal_lines import SCHEMA, encode, file_name

if TYPE_CHECKING:
    from rasd.net.runtime import Runtime

log = logging.getLogger("rasd")

ENV = "TORCHRAS_JOURNAL_DIR"
#: The most a restart waits for the journal (``sync``): what a stalled disk can add to a restart, at worst.
BUDGET_S = 0.2
#: A file is rotated (renamed to ``<name>.1``, replacing the previous one) before a line would take it past this.
MAX_FILE_BYTES = 16 * 1024 * 1024
#: The longest line: a record whose evidence would make it longer loses evidence until it fits (``truncated``).
MAX_LINE_BYTES = 64 * 1024
#: Records waiting for the writer; beyond this they are dropped and counted (a ``dropped`` line says how many).
MAX_QUEUED = 4096
#: The communicators' counts are read at most this often (seconds); a burst of verdicts shares one reading.
COUNTS_EVERY_S = 1.0
#: The Flight Recorder is dumped at most this often (seconds): a dump holds the GIL about 15 us per entry.
FR_EVERY_S = 5.0
#: The most recent Flight Recorder entries kept per communicator, and the fields kept of each.
FR_ENTRIES = 16
FR_FIELDS = (
    "collective_seq_id",
    "p2p_seq_id",
    "profiling_name",
    "state",
    "retired",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
    "duration_ms",
    "timeout_ms",
    "input_sizes",
    "output_sizes",
)
#: The most communicators whose counts and entries a verdict carries.
MAX_COMMS = 16
#: How long stopping the node waits for the writer to write what is queued.
CLOSE_WAIT_S = 0.2

#: What is journaled: the verdicts (docs/architecture.md §7), their withdrawals, and the restarts.
VERDICTS = frozenset({Kind.PEER_DEAD, Kind.PEER_HUNG, Kind.PEER_LEFT, Kind.COMM_STUCK})
WITHDRAWALS = frozenset({Kind.PEER_RECOVERED, Kind.COMM_RECOVERED})
JOURNALED = VERDICTS | WITHDRAWALS | {Kind.RESTART}
#: The verdicts that restart training (inprocess/mesh_source.py, VERDICT_RULES): they carry evidence, and a restart
#: that an external verdict caused waits (within the budget) for one of them.
CAUSES = frozenset({Kind.PEER_DEAD, Kind.PEER_HUNG, Kind.COMM_STUCK})

# One WARNING per process, whichever journal of the process fails first (a process may run several nodes in turn).
_warned = threading.Event()
# The journal of each running node (rasd.sync_journal finds it here).
_journals: weakref.WeakKeyDictionary[Runtime, Journal] = weakref.WeakKeyDictionary()

#: The Flight Recorder as the writer reads it: its dump, and the group names of each communicator (by hash).
FlightRecorder = tuple[Callable[[], Any], dict[int, tuple[str, ...]]]


def iso_time(epoch: float) -> str:
    """UTC, ISO 8601 with microseconds: ``2026-11-21T11:45:03.123456Z``."""
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Item:
    record: dict[str, Any]
    #: The Flight Recorder to read for this record (writer thread), and the hashes of the communicators it is about.
    flight_recorder: FlightRecorder | None = None
    comms: tuple[int, ...] = ()


class Journal:
    """The journal of one node. ``on_event`` (RAS thread) queues, a thread of its own writes, ``sync`` waits.

    ``iteration`` tells the restart iteration this process runs; ``local_data`` its communicators (the node's, read
    on the RAS thread); ``on_ras_thread`` runs a function on the RAS thread (``Runtime.call``), so that ``sync``
    first lets the node hand over what it emitted before; ``flight_recorder`` finds the Flight Recorder (RAS
    thread). ``write`` is ``os.write``; a test or a benchmark gives a slow one.
    """

    def __init__(
        self,
        directory: str,
        me: PeerInfo,
        *,
        iteration: Callable[[], int] = lambda: 0,
        local_data: Callable[[], ProcessData] | None = None,
        on_ras_thread: Callable[[Callable[[], None]], None] | None = None,
        flight_recorder: Callable[[], FlightRecorder | None] | None = None,
        write: Callable[[int, memoryview], int] = os.write,
        max_file_bytes: int = MAX_FILE_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, file_name(me.hostname, me.pid, me.rank))
        self.me = me
        self._iteration = iteration
        self._local_data = local_data
        self._on_ras_thread = on_ras_thread
        self._flight_recorder = flight_recorder if flight_recorder is not None else process_flight_recorder
        self.write = write
        self.max_file_bytes = max_file_bytes
        self.max_line_bytes = max_line_bytes
        self.max_queued = max_queued
        self._cond = threading.Condition()
        self._queue: collections.deque[_Item] = collections.deque()
        self._enqueued = 0  # records queued so far (a sequence number)
        self._written = 0  # records handled by the writer so far (written, or skipped as unencodable)
        self._dropped = 0  # records dropped since the last ``dropped`` line (a full queue)
        self._cause = False  # a verdict that restarts training was queued since the last sync(verdict=True)
        self._closing = False
        self.off = False  # the journal failed: nothing more is queued, and sync returns at once
        self._fd = -1
        self._size = 0
        self._counts: tuple[float, ProcessData] | None = None  # (read at, monotonic; the node's local data)
        self._fr_read: tuple[float, dict[str, list[dict[str, Any]]]] | None = None  # (read at; entries by group)
        self._thread: threading.Thread | None = None

    # ---- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Queue the ``start`` line and start the writer thread (which opens the file: a failure is its WARNING)."""
        record = self._common("start", time.time())
        record.update(mesh=_addr_text(self.me.addr), incarnation=self.me.incarnation, devices=list(self.me.devices))
        self._put(_Item(record))
        self._thread = threading.Thread(target=self._run, name="torchras-journal", daemon=True)
        self._thread.start()

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """Write what is queued (waiting at most ``wait``) and close the file. Idempotent; never raises."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)

    # ---- RAS thread ---------------------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """An event listener (RAS thread): journal a verdict, a withdrawal or a restart. Never blocks."""
        if self.off or event.kind not in JOURNALED:
            return
        now = time.monotonic()
        epoch = time.time() - max(0.0, now - event.at)  # when the node saw it (the event's clock is monotonic)
        item = _Item(self.record_of(event, epoch))
        if event.kind in CAUSES:
            item.record["evidence"], item.comms = self._evidence(event, now)
            if item.comms:
                try:
                    item.flight_recorder = self._flight_recorder()
                except Exception:  # evidence is a bonus: the verdict is journaled without it
                    log.debug("rasd: journal: cannot find the Flight Recorder", exc_info=True)
        self._put(item, cause=event.kind in CAUSES)

    def record_of(self, event: Event, epoch: float) -> dict[str, Any]:
        """The line of a verdict, a withdrawal or a restart, without evidence (docs/operations.md §11)."""
        if event.kind is Kind.RESTART and event.restart is not None:
            r = event.restart
            record = self._common("restart", epoch, iteration=r.iteration)
            record.update(
                kind=event.kind.value,
                restart={
                    "iteration": r.iteration,
                    "restarts": r.restarts,
                    "cause": r.cause,
                    "terminated": list(r.terminated),
                    "seconds_lost": round(r.seconds_lost, 6),
                },
            )
            return record
        record = self._common("verdict", epoch)
        record.update(
            kind=event.kind.value,
            subject=_subject(event.peer, event.addr),
            details=event.details,
            comm_hash=_hex(event.comm_hash) if event.comm_hash is not None else None,
            ranks=list(event.ranks),
            positions=[
                {"rank": rank, "frames": [{"file": f.file, "line": f.line, "function": f.function} for f in frames]}
                for rank, frames in event.positions
            ],
        )
        return record

    def _common(self, kind: str, epoch: float, iteration: int | None = None) -> dict[str, Any]:
        if iteration is None:
            try:
                iteration = int(self._iteration())
            except Exception:  # noqa: BLE001 - a line without its iteration beats no line
                iteration = 0
        me = self.me
        return {
            "v": SCHEMA,
            "time": iso_time(epoch),
            "epoch": round(epoch, 6),
            "host": me.hostname,
            "pid": me.pid,
            "rank": me.rank,
            "iteration": iteration,
            "record": kind,
        }

    def _evidence(self, event: Event, now: float) -> tuple[dict[str, Any], tuple[int, ...]]:
        """This process's counts of the communicators the verdict is about (RAS thread), and their hashes."""
        if self._local_data is None:
            return {}, ()
        try:
            if self._counts is None or now - self._counts[0] >= COUNTS_EVERY_S:
                self._counts = (now, self._local_data())
            read_at, data = self._counts
            comms = _involved(event, data.comms)[:MAX_COMMS]
        except Exception:  # evidence is a bonus
            log.debug("rasd: journal: cannot read the communicators", exc_info=True)
            return {}, ()
        evidence = {"comms": [_comm_counts(c) for c in comms], "comms_age_s": round(now - read_at, 3)}
        return evidence, tuple(c.comm_hash for c in comms)

    def _put(self, item: _Item, cause: bool = False) -> None:
        with self._cond:
            if self.off or self._closing:
                return
            if len(self._queue) >= self.max_queued:
                self._dropped += 1
                self._cond.notify_all()
                return
            self._enqueued += 1
            self._queue.append(item)
            self._cause = self._cause or cause
            self._cond.notify_all()

    # ---- any thread ---------------------------------------------------------------------------------------------

    def sync(self, budget: float = BUDGET_S, verdict: bool = False) -> bool:
        """Wait, at most ``budget`` seconds, until everything journaled before the call is written; with
        ``verdict``, first until a verdict that restarts training (``CAUSES``) has been queued since the last such
        call, and then until it is written. True when all that holds; False at the budget's end or when the journal
        is off. Never from the RAS thread (it would wait for itself, the whole budget)."""
        deadline = time.monotonic() + max(0.0, budget)
        if self.off:
            return False
        if self._on_ras_thread is not None:
            handed = threading.Event()  # the RAS thread has run everything it was given before this call
            self._on_ras_thread(handed.set)
            handed.wait(max(0.0, deadline - time.monotonic()))
        with self._cond:
            found = True
            if verdict:
                found = self._wait(lambda: self._cause, deadline)
                self._cause = False
            target = self._enqueued
            return self._wait(lambda: self._written >= target, deadline) and found and not self.off

    def _wait(self, condition: Callable[[], bool], deadline: float) -> bool:
        """Under ``_cond``: wait until ``condition()`` or the journal is off or the deadline passed."""
        while not condition():
            left = deadline - time.monotonic()
            if self.off or left <= 0:
                return False
            self._cond.wait(left)
        return True

    # ---- writer thread ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._open()
        except OSError as e:
            self._fail(e)
            return
        while True:
            with self._cond:
                while not self._queue and not self._dropped and not self._closing:
                    self._cond.wait()
                if not self._queue and not self._dropped:
                    break  # closing, and everything is written
                batch = list(self._queue)
                self._queue.clear()
                dropped, self._dropped = self._dropped, 0
                upto = self._enqueued
            lines = [line for line in (self._line(item) for item in batch) if line is not None]
            if dropped:
                record = self._common("dropped", time.time())
                record["count"] = dropped
                lines.append(encode(record))
            try:
                for line in lines:
                    self._append(line)
            except OSError as e:
                self._fail(e)
                return
            with self._cond:
                self._written = upto
                self._cond.notify_all()
        self._close_file()

    def _open(self) -> None:
        try:
            os.makedirs(self.directory, exist_ok=True)
        except FileExistsError:
            pass  # something that is not a directory is in the way: the open says what
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._size = os.fstat(self._fd).st_size

    def _append(self, line: bytes) -> None:
        if self._size and self._size + len(line) > self.max_file_bytes:
            self._rotate()
        view = memoryview(line)
        while view:
            view = view[self.write(self._fd, view) :]
        self._size += len(line)

    def _rotate(self) -> None:
        """The file becomes ``<name>.1`` (replacing the previous one); lines go to a new file."""
        self._close_file()
        os.replace(self.path, self.path + ".1")
        self._open()

    def _close_file(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1

    def _fail(self, error: OSError) -> None:
        with self._cond:
            self.off = True
            self._queue.clear()
            self._cond.notify_all()
        self._close_file()
        why = os.strerror(error.errno) if isinstance(error.errno, int) and error.errno > 0 else str(error)
        if not _warned.is_set():
            _warned.set()
            log.warning("rasd: cannot write the verdict journal %s (%s); this process keeps no journal", self.path, why)
        else:
            log.debug("rasd: cannot write the verdict journal %s (%s)", self.path, why)

    def _line(self, item: _Item) -> bytes | None:
        """The record as one bounded line, with its Flight Recorder entries (writer thread); None if it cannot be
        encoded at all (logged at DEBUG: a journal never stops for one record)."""
        record = item.record
        try:
            if item.flight_recorder is not None:
                entries = self._flight_recorder_entries(item.flight_recorder, item.comms)
                if entries is not None:
                    record["evidence"]["flight_recorder"] = entries
            return self._bounded(record)
        except Exception:  # one record never stops the journal
            log.debug("rasd: journal: cannot encode a %s record", record.get("kind"), exc_info=True)
            return None

    def _flight_recorder_entries(self, recorder: FlightRecorder, comms: Iterable[int]) -> list[dict[str, Any]] | None:
        dump, names = recorder
        now = time.monotonic()
        if self._fr_read is None or now - self._fr_read[0] >= FR_EVERY_S:
            try:
                entries = json.loads(dump()).get("entries", [])
            except Exception:  # no usable dump: the verdict goes without entries
                log.debug("rasd: journal: cannot read the Flight Recorder", exc_info=True)
                return None
            by_group: dict[str, list[dict[str, Any]]] = {}
            for entry in entries:
                group = entry.get("process_group", ["", ""])[0]
                by_group.setdefault(str(group), []).append({k: entry[k] for k in FR_FIELDS if k in entry})
            self._fr_read = (now, {group: kept[-FR_ENTRIES:] for group, kept in by_group.items()})
        read_at, by_group = self._fr_read
        age = round(now - read_at, 3)
        return [
            {"comm_hash": _hex(comm_hash), "group": group, "age_s": age, "entries": by_group.get(group, [])}
            for comm_hash in comms
            for group in names.get(comm_hash, ())
        ]

    def _bounded(self, record: dict[str, Any]) -> bytes:
        """The record as a line of at most ``max_line_bytes``: evidence is given up, largest first, until it fits."""
        line = encode(record)
        if len(line) <= self.max_line_bytes:
            return line
        cut = dict(record, truncated=True)
        for step in ("flight_recorder", "comms", "positions", "details", "everything"):
            if step in ("flight_recorder", "comms"):
                if "evidence" in cut:
                    cut["evidence"] = {k: v for k, v in cut["evidence"].items() if k != step}
            elif step == "positions":
                cut["positions"] = [
                    dict(p, frames=p["frames"][-1:]) for p in cut.get("positions", [])[:8] if isinstance(p, dict)
                ]
            elif step == "details":
                cut["details"] = str(cut.get("details", ""))[:1024]
                if "restart" in cut:
                    cut["restart"] = dict(cut["restart"], cause=str(cut["restart"].get("cause", ""))[:1024])
            else:
                keep = ("v", "time", "epoch", "host", "pid", "rank", "iteration", "record", "kind")
                cut = {k: record[k] for k in keep if k in record}
                cut["truncated"] = True
            line = encode(cut)
            if len(line) <= self.max_line_bytes:
                return line
        return line


def _addr_text(addr: Addr) -> str:
    return f"[{addr.host}]:{addr.port}" if ":" in addr.host else f"{addr.host}:{addr.port}"


def _hex(comm_hash: int) -> str:
    return f"{comm_hash & 0xFFFFFFFFFFFFFFFF:016x}"


def _subject(peer: PeerInfo | None, addr: Addr | None) -> dict[str, Any] | None:
    """The process a verdict is about: who it is, as the mesh knows it."""
    if peer is not None:
        return {
            "host": peer.hostname,
            "addr": _addr_text(peer.addr),
            "pid": peer.pid,
            "rank": peer.rank,
            "incarnation": peer.incarnation,
            "devices": list(peer.devices),
        }
    return {"addr": _addr_text(addr)} if addr is not None else None


def _involved(event: Event, comms: tuple[CommRecord, ...]) -> list[CommRecord]:
    """The communicators a verdict is about: COMM_STUCK's own; for a process, those it is a rank of (all of them when
    its rank is unknown or none says)."""
    if event.kind is Kind.COMM_STUCK:
        return [c for c in comms if c.comm_hash == event.comm_hash] or list(comms)
    rank = event.peer.rank if event.peer is not None else -1
    if rank >= 0:
        members = [c for c in comms if any(c.global_rank(r) == rank for r in range(c.size))]
        if members:
            return members
    return list(comms)


def _comm_counts(comm: CommRecord) -> dict[str, Any]:
    """One communicator's counts as this process holds them: per rank, status, launched and completed by op type
    (the op types that counted anything), and how long they have not moved."""
    ranks = []
    for r in comm.ranks:
        errored = is_error_code(r.init_state) or is_error_code(r.async_error)
        ranks.append(
            {
                "comm_rank": r.comm_rank,
                "global_rank": comm.global_rank(r.comm_rank),
                "status": "ERROR" if errored else rank_status(r).name,
                "launched": {OP_TYPES[i]: n for i, n in enumerate(r.launched) if n},
                "completed": {OP_TYPES[i]: n for i, n in enumerate(r.completed) if n},
                "idle_ms": r.idle_ms,
            }
        )
    return {"comm_hash": _hex(comm.comm_hash), "size": comm.size, "ranks": ranks}


#: Where a journal finds this process's Flight Recorder: handed over by the layer that counts the process groups
#: (``rasd.torch`` on install, ``read_flight_recorder``), which this module does not import: it imports torch.
_flight_recorder_source: Callable[[], FlightRecorder | None] | None = None


def read_flight_recorder(source: Callable[[], FlightRecorder | None]) -> None:
    """From now on the journals of this process read the Flight Recorder with ``source``, which they call on the RAS
    thread (the records' groups are its): its dump and each communicator's group names, or None while it is off."""
    global _flight_recorder_source
    _flight_recorder_source = source


def process_flight_recorder() -> FlightRecorder | None:
    """This process's Flight Recorder, as the source handed to ``read_flight_recorder`` reads it; None when no source
    was handed over (``rasd.torch`` is not installed) or the Flight Recorder is off. RAS thread."""
    source = _flight_recorder_source
    return source() if source is not None else None


def of(runtime: Runtime) -> Journal | None:
    """The journal of a running node, or None (off, or failed to start)."""
    return _journals.get(runtime)


async def serve(runtime: Runtime) -> None:
    """A runtime service (``rasd.start`` adds it to every node): keep the journal where ``TORCHRAS_JOURNAL_DIR``
    says, or do nothing. Never raises: whatever fails is one WARNING, and the node runs on without a journal."""
    directory = os.environ.get(ENV, "").strip()
    if not directory:
        return
    try:
        node = runtime.node

        def iteration() -> int:
            return node.restart.iteration if node.restart is not None else 0

        journal = Journal(
            directory, node.me, iteration=iteration, local_data=node.local_data, on_ras_thread=runtime.call
        )
        journal.start()
    except Exception as e:  # noqa: BLE001 - a journal is an extra, never a reason to stop the node
        log.warning("rasd: cannot keep the verdict journal in %s (%s: %s)", directory, type(e).__name__, e)
        return
    _journals[runtime] = journal
    runtime.event_listeners.append(journal.on_event)
    runtime.on_stop.append(journal.close)
