"""Group restarts of a job that is not under ``inprocess.Wrapper``: torchrun's ``--max-restarts``, made fast.

Which jobs. A worker that trains without the Wrapper (its first ``init_process_group`` returned and its Wrapper
never said ``wrapper_starting``: the ``process_group`` note of ``torchras.launch.worker_main``) makes the attempt
*plain*; a worker whose Wrapper announced itself makes it *wrapped*. A wrapped job heals in place, as before
(respawns, ``--max-respawns``); a plain job restarts as a group, as under torchrun; a job whose workers are some of
each is refused (``Mode.mixed``): nobody can heal it, the Wrapper's in-place restarts wait for ranks that a group
restart would kill, and the launcher says so and stops it.

When. ``--max-restarts N`` > 0 on one node, the job not known to be wrapped:

* a worker ends with a non-zero status (torchrun's rule): the group restarts;
* a verdict of the job's RAS mesh (``PEER_DEAD``, ``PEER_HUNG``, ``COMM_STUCK``; never ``COMM_SLOW``, a rank behind
  that works) is in a worker's verdict journal: the group restarts within about a second of it, instead of after
  the backend's timeout (gloo 30 min, NCCL 10 min by default) for a wedged rank, or after the other ranks' own
  failures for a dead one.

Not after a worker of the attempt has exited 0 (the job is finishing, torchrun's rule too), nor while the launcher
stops, nor past the bound: the ``N``-th restart is the last, and a fault after it ends the job with that cause.

How the verdicts reach the launcher. Each worker's node keeps its verdict journal (``TORCHRAS_JOURNAL_DIR``; the
launcher sets it to ``<attempt folder>/journal`` when the user did not): one JSON line per verdict, written by the
node's own writer thread at once (docs/operations.md section 11). The launcher reads the files of its current
workers (their pids are in the file names) at most every ``READ_EVERY_S``, from where it stopped, like the workers'
announcements. Files, not a MONITOR connection to the client port: the launcher finds them without knowing which
port the job serves (the client port may be off, or moved by another job on the host), nothing is held open, a
worker's death cuts nothing, and a journal line is whole or is skipped.

The restart itself is one launcher line (the verdict, the subject, its pid and rank, its details), a metric and a
MONITOR event and a journal entry (``restart``) from the new group's nodes: the launcher runs no RAS node of its
own, so it hands the cause to the new group (``TORCHRAS_LAUNCH_RESTART``), whose nodes record it with
``rasd.record_restart`` as soon as they run (``torchras.launch.worker_main``): a RESTART event on every MONITOR
connection, a ``restart`` record in each journal, ``torchras_restarts_total`` 1, each with the cause.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The verdicts that restart a plain job's group (COMM_SLOW never does: its ranks behind are working).
RESTARTING = frozenset({"PEER_DEAD", "PEER_HUNG", "COMM_STUCK"})
#: The least time between two reads of the journals.
READ_EVERY_S = 0.2
#: A line longer than this is not a verdict the launcher can use whole (the journal's own bound is 64 KiB).
MAX_LINE = 1 << 17
#: Seconds a worker gets between SIGTERM and SIGKILL when the job ends after its last restart (less when
#: --shutdown-timeout is): its peers usually wait inside a collective, where a Python handler of SIGTERM cannot run.
#: A group that restarts gets SIGKILL at once: its state is in the script's checkpoints.
STOP_GRACE_S = 3.0


@dataclasses.dataclass
class Mode:
    """What the workers of the current attempt said they run."""

    wrapped: bool = False  # a worker's Wrapper announced itself
    plain: bool = False  # a worker's first init_process_group returned outside any Wrapper

    @property
    def mixed(self) -> bool:
        return self.wrapped and self.plain


def mixed_message(wrapped: Iterable[int], plain: Iterable[int]) -> str:
    """Why a job mixing both is refused, in one line."""
    return (
        f"the job mixes workers under inprocess.Wrapper (local rank(s) {sorted(set(wrapped))}) with workers that "
        f"train without it (local rank(s) {sorted(set(plain))}): the Wrapper heals in place and waits for every "
        "rank it knows, a plain worker's fault restarts the whole group, and neither can heal such a job. Wrap "
        "the training of every rank (docs/inprocess.md) or of none (docs/frameworks.md)"
    )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A verdict from a worker's journal that restarts a plain job."""

    kind: str
    epoch: float
    cause: str  # one line: the verdict, what it is about, its details
    ranks: tuple[int, ...]  # the global ranks it names (the subject's, or a communicator's ranks behind)
    subject_pid: int | None
    seen_by: int  # pid of the worker whose journal has it


def describe(record: dict[str, Any]) -> tuple[str, tuple[int, ...], int | None]:
    """A journal record as a cause: ``PEER_HUNG of rank 2 (pid 4242 on host): details``."""
    kind = str(record.get("kind"))
    details = str(record.get("details") or "").strip().splitlines()
    detail = f": {details[0][:200]}" if details else ""
    subject = record.get("subject")
    ranks = tuple(int(rank) for rank in record.get("ranks") or () if isinstance(rank, int))
    if isinstance(subject, dict):
        rank = subject.get("rank")
        pid = subject.get("pid")
        if isinstance(rank, int) and rank >= 0:
            ranks = (rank,)
        return (
            f"{kind} of rank {rank} (pid {pid} on {subject.get('host')}){detail}",
            ranks,
            (pid if isinstance(pid, int) else None),
        )
    comm = record.get("comm_hash")
    behind = f", ranks {list(ranks)}" if ranks else ""
    return f"{kind} of communicator {comm}{behind}{detail}", ranks, None


class Journals:
    """The verdict journals of the current workers, read from where the last read stopped."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.read_at = 0.0

    def restarting(self, pids: Iterable[int], since: float) -> list[Verdict]:
        """The new verdicts that restart a plain job, written by the workers ``pids`` after ``since`` (epoch)."""
        now = time.monotonic()
        if now - self.read_at < READ_EVERY_S:
            return []
        self.read_at = now
        found: list[Verdict] = []
        for pid in pids:
            for path in self._files(pid):
                for record in self._new_records(path):
                    if record.get("record") != "verdict" or record.get("kind") not in RESTARTING:
                        continue
                    epoch = float(record.get("epoch") or 0.0)
                    if epoch < since:
                        continue
                    cause, ranks, subject_pid = describe(record)
                    found.append(Verdict(str(record["kind"]), epoch, cause, ranks, subject_pid, pid))
        return sorted(found, key=lambda verdict: verdict.epoch)

    def _files(self, pid: int) -> list[Path]:
        try:
            return [*self.folder.glob(f"journal-*-{pid}.jsonl"), *self.folder.glob(f"journal-*-{pid}-rank*.jsonl")]
        except OSError:
            return []

    def _new_records(self, path: Path) -> list[dict[str, Any]]:
        offset = self.offsets.get(path, 0)
        try:
            size = os.path.getsize(path)
            if size < offset:  # the journal rotated (16 MiB): a new file under the same name
                offset = 0
            with open(path, "rb") as file:
                file.seek(offset)
                data = file.read(max(0, min(size - offset, 16 * MAX_LINE)))
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offsets[path] = offset + len(complete)
        records = []
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


def restart_note(attempt: int, cause: str, ranks: Iterable[int], at: float) -> str:
    """``TORCHRAS_LAUNCH_RESTART`` for the new group (``torchras.launch.worker_main`` reads it)."""
    return json.dumps({"attempt": attempt, "cause": cause, "ranks": list(ranks), "at": at})


def stop_grace(shutdown_timeout: float) -> float:
    return min(STOP_GRACE_S, shutdown_timeout)


def plan_line(max_restarts: int, ras_node: bool, journal_dir: str, nnodes: int) -> str:
    """The launcher's line, after its first, on what a fault of a job without the Wrapper does."""
    node = (
        f"every worker runs a RAS node (rascli -v; verdict journals in {journal_dir})"
        if ras_node
        else "the workers run no RAS node (--no-rasd, TORCHRAS_ENABLE=0, or not Python)"
    )
    if max_restarts and nnodes == 1:
        faults = "a failed worker" + (", or a PEER_DEAD, PEER_HUNG or COMM_STUCK verdict," if ras_node else "")
        return (
            f"{node}; without inprocess.Wrapper, {faults} restarts the group (at most {max_restarts} time(s), "
            "--max-restarts)"
        )
    return node


def unrestarted(max_restarts: int, completed: bool) -> str:
    """Why a verdict about a job without the Wrapper restarts nothing."""
    if completed:
        return "not restarted: a worker has finished (exit 0), the job is ending"
    if max_restarts == 0:
        return "not restarted (--max-restarts 0): the job waits for its backend, as under torchrun"
    return "not restarted: the job is ending"
