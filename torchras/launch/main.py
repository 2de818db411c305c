"""``rasd launch``: torchrun's command line, a launcher that keeps the survivors and heals the job to full size.

One loop, in one thread, reads top to bottom: wait (for output, a signal, a worker's end, or the next timer), pass
the output on as whole lines, act on signals, collect ended workers and decide about their slots, read what the
workers' Wrappers announced, start the replacements that are due, and stop when no worker is left. Every wait has
a deadline; nothing here raises into the workers, and a worker's end never ends another worker.

Event lines (stderr, ``rasd launch: ...``), one per event: a worker started, ended (with its code or signal and
what happens next), respawned, joined the job (its rank and the world size, from its Wrapper); the job's world
size when it changes; a worker's Wrapper that gave up (the job ends: nothing is respawned any more); the job's end
and its status (``torchras.launch.status``).

When a worker's Wrapper gives up (``gave_up``, ``torchras.launch.workers``), the launcher starts no replacement
any more, cancels those that were due, and lets the workers that run end by themselves, with no deadline (under the
Wrapper they give up at the same iteration; one that trains on is not the launcher's to end), except a replacement
still waiting to be admitted: nothing will admit it, so it gets SIGTERM, and SIGKILL after ``--shutdown-timeout``.
The last line says that the job gave up and why (the Wrapper's reason); the status is not 0.

Signals: the first SIGINT, SIGTERM, SIGHUP or SIGQUIT (``--signals-to-handle``) is passed on to every worker's
process group (with SIGCONT, so a stopped worker sees it too); nothing is respawned any more; workers still there
after ``--shutdown-timeout`` seconds (30) get SIGKILL. A second signal sends SIGKILL at once. The launcher's status
is then 128 + the signal.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchras_formats import launch_events
from torchras_formats.launch_events import LaunchEvent

from . import (
    args as args_module,
    environment,
    output,
    ras_node,
    reaper,
    restarts,
    startup,
    status as status_module,
    workers as workers_module,
)
from .store import LaunchError, LaunchStore, Rendezvous

log = logging.getLogger("torchras.launch")

#: How long the launcher keeps reading an ended worker's pipes for its last lines (a child it left behind may
#: hold them open).
DRAIN_S = 2.0
#: The longest wait of the loop: a worker's end wakes it at once (SIGCHLD), this is the fallback.
MAX_WAIT_S = 0.5
#: How often the launcher reaps what its workers left (orphans it adopted as a subreaper, ``reaper``).
REAP_EVERY_S = 1.0
#: Why a group restart: a worker lost at start-up (``startup``).
STARTUP_WHEN = "before the job's first round (the workers had not all met)"
#: How long what the workers left (monitor processes, the Wrapper's store server) gets after SIGTERM.
LEFTOVER_GRACE_S = 5.0


class _EventLines(logging.Handler):
    """The launcher's log records as whole lines on the console's stderr (never inside a worker's line)."""

    def __init__(self, console: output.Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.line(2, f"rasd launch: {self.format(record)}".encode())
        except Exception:  # noqa: BLE001 - a line that cannot be written must never stop the launcher
            self.handleError(record)


class Launcher:
    """One node's launcher: its workers, their replacements, their output, the job's status."""

    def __init__(
        self, plan: args_module.Plan, console: output.Console | None = None, line_prefixes: bool = True
    ) -> None:
        self.plan = plan
        self.console = console or output.Console()
        #: torchrun's ``[default0]:`` before every worker line on the console (False: the lines as written, for
        #: workers whose lines say who wrote them, as ``rasd demo``'s do; the log files never have prefixes).
        self.line_prefixes = line_prefixes
        self.store = LaunchStore(plan)
        self.selector = selectors.DefaultSelector()
        self.slots: list[workers_module.Slot] = []
        self.exits: list[status_module.Exit] = []
        self.stopping: int | None = None  # the signal that stops the launcher
        self.kill_at: float | None = None
        self.wrapped = False  # a worker said it runs under inprocess.Wrapper
        self.heals = False  # a worker's Wrapper said it admits newcomers
        self.completed = False  # a worker of this node finished
        self.gave_up: str | None = None  # a worker's Wrapper gave up: which one and why, for the last line
        self.world_seen: tuple[int, int] | None = None  # (iteration, world size) last reported
        self.restart_count = 0  # start-up restarts of the group so far (TORCHELASTIC_RESTART_COUNT)
        self.wrapper_built = False  # a worker said it builds an inprocess.Wrapper (before its start-up barrier)
        self.job_started = False  # a worker of this group passed the Wrapper's start-up barrier (``startup``)
        self.startup_losses: dict[int, float] = {}  # local rank -> deadline of a start-up loss's pending verdict
        self.group_restart_at: float | None = None  # when the group starts again, once every worker has ended
        self.ending: str | None = None  # the launcher ends the job itself (it cannot start): why
        self.outsiders_at: float | None = None  # when workers outside the completed job's final world are stopped
        self.subreaper = False
        self.ras_node = False  # the workers run a RAS node (``ras_node``)
        self.journals: restarts.Journals | None = None  # the current attempt's verdict journals
        self.attempt_epoch = 0.0  # when the current attempt started (verdicts before it are the old group's)
        self.restart_note: str | None = None  # the last group restart's cause, for the new group's nodes
        self.said_wrapped_restarts = False  # the line that --max-restarts is not used under the Wrapper, said
        self.said_unrestarted = False  # the line that a verdict restarts nothing (--max-restarts 0), said
        self.wrapper_pids: set[int] = set()  # workers whose Wrapper announced itself
        self.mode = restarts.Mode()
        self.mode_ranks: dict[str, set[int]] = {"wrapped": set(), "plain": set()}  # local ranks, this attempt
        self._reaped_at = 0.0
        self.streams: dict[int, output.Stream] = {}  # pipe read end -> the worker stream it carries
        self.draining: dict[int, float] = {}  # pipe read end of an ended worker -> give up reading it at
        self.rendezvous: Rendezvous | None = None
        self.folder = Path()
        self._wake_read, self._wake_write = os.pipe()
        self._signals: list[int] = []

    # ---- the run ----------------------------------------------------------------------------------------------

    def run(self) -> int:
        plan = self.plan
        for ignored in plan.ignored:
            log.warning("%s: accepted for compatibility with torchrun, not used", ignored)
        warning = environment.omp_warning(os.environ, plan)
        if warning:
            log.warning("%s", warning)
        try:
            self.rendezvous = self.store.meet()
        except LaunchError as error:
            log.error("%s", error)
            return 1
        self.folder = self._log_folder()
        self.ras_node = ras_node.wanted(plan)
        self._new_attempt()
        self.slots = [
            workers_module.Slot(local_rank, self.rendezvous.node_rank * plan.nproc_per_node + local_rank)
            for local_rank in range(plan.nproc_per_node)
        ]
        previous = self._install_signals()
        self.subreaper = reaper.become_subreaper()
        self.job_started = self.rendezvous.relaunched  # its workers join a running job
        try:
            for slot in self.slots:
                self._start(slot, newcomer=self.rendezvous.relaunched)
            self._say_started()
            while not self._finished():
                self._wait()
                self._act_on_signals()
                self._reap()
                self._read_announcements()
                self._read_verdicts()
                self._settle_startup_losses()
                self._kill_stuck_before_start()
                self._check_members()
                self._respawn_due()
                self._flush_partial_lines()
                self._enforce_deadline()
                self._reap_orphans()
        finally:
            self._restore_signals(previous)
            for slot in self.slots:  # never leave a worker behind, whatever happened here
                if slot.alive and slot.worker is not None:
                    slot.worker.signal_group(signal.SIGKILL)
                    slot.worker.process.wait()
            self._end_leftovers()
            self._close_pipes()
            self._stop_store()
        code = status_module.job_status(
            self.exits, self.stopping, self.wrapped, self.gave_up is not None, self.ending is not None
        )
        self._say_ended(code)
        return code

    # ---- starting -------------------------------------------------------------------------------------------

    def _log_folder(self) -> Path:
        """torchrun's layout: ``<log-dir or a temporary folder>/<run id>_<random>/attempt_0`` (``attempt_N`` after
        N start-up restarts of the group)."""
        base = self.plan.log_dir or tempfile.mkdtemp(prefix="torchelastic_")
        os.makedirs(base, exist_ok=True)
        run = tempfile.mkdtemp(prefix=f"{self.plan.run_id}_", dir=base)
        attempt = Path(run) / "attempt_0"
        attempt.mkdir()
        return attempt

    def _start(self, slot: workers_module.Slot, newcomer: bool) -> None:
        plan = self.plan
        assert self.rendezvous is not None
        folder = self.folder / str(slot.local_rank)
        folder.mkdir(exist_ok=True)
        error_file = folder / "error.json"
        error_file.unlink(missing_ok=True)  # an earlier worker's: read when it ended
        env = environment.worker_environment(
            plan,
            os.environ,
            local_rank=slot.local_rank,
            node_rank=self.rendezvous.node_rank,
            master_addr=self.rendezvous.master_addr,
            master_port=self.rendezvous.master_port,
            run_id=plan.run_id,
            error_file=str(error_file),
            events_file=str(folder / "events.jsonl"),
            newcomer=newcomer,
            restart_count=self.restart_count,
        )
        command = plan.command
        if self.ras_node:
            command = ras_node.command(plan.command)
            env[ras_node.JOURNAL] = self.journal_dir
        if self.restart_note is not None:
            env["TORCHRAS_LAUNCH_RESTART"] = self.restart_note
        destinations = output.destinations(
            slot.local_rank, plan.redirects, plan.tee, plan.local_ranks_filter, str(folder)
        )
        separator = None
        if slot.pids:
            separator = f"---- rasd launch: a replacement of local rank {slot.local_rank} starts here ----".encode()
        worker = workers_module.spawn(
            command,
            env,
            destinations,
            self.console,
            output.prefix(plan.role, slot.rank, slot.local_rank) if self.line_prefixes else b"",
            newcomer,
            separator,
        )
        for read_end, stream in worker.streams.items():
            self.streams[read_end] = stream
            self.selector.register(read_end, selectors.EVENT_READ)
        slot.worker = worker
        slot.respawn_at = None
        slot.pids.append(worker.pid)
        if newcomer and len(slot.pids) > 1:
            log.info(
                "worker %s respawned: pid %s; it joins the running job and gets the model from the others' memory",
                slot.local_rank,
                worker.pid,
            )
        elif newcomer:
            log.info(
                "worker %s started: pid %s; it joins the running job (this node came back)", slot.local_rank, worker.pid
            )

    def _say_started(self) -> None:
        plan, rendezvous = self.plan, self.rendezvous
        assert rendezvous is not None
        pids = ", ".join(f"{slot.local_rank}: pid {slot.pids[-1]}" for slot in self.slots)
        first, last = self.slots[0].rank, self.slots[-1].rank
        healing = (
            f"a dead worker is respawned up to {plan.max_respawns} time(s) per local rank and joins the running job"
            if plan.max_respawns
            else "a dead worker is not respawned (--max-respawns 0)"
        )
        log.info(
            "node %s of %s: %s worker(s), ranks %s-%s of %s (%s); MASTER_ADDR=%s MASTER_PORT=%s "
            "TORCHELASTIC_RUN_ID=%s; logs in %s; a worker that exits never ends the others; %s",
            rendezvous.node_rank,
            plan.nnodes,
            plan.nproc_per_node,
            first,
            last,
            plan.world_size,
            pids,
            rendezvous.master_addr,
            rendezvous.master_port,
            plan.run_id,
            self.folder.parent,
            healing,
        )
        line = restarts.plan_line(plan.max_restarts, self.ras_node, self.journal_dir, plan.nnodes)
        if line:
            log.info("%s", line)

    # ---- waiting ----------------------------------------------------------------------------------------------

    def _wait(self) -> None:
        """Until output, a signal (SIGCHLD included: a worker ended), or the next timer."""
        now = time.monotonic()
        deadlines = [slot.respawn_at for slot in self.slots if slot.respawn_at is not None]
        deadlines += list(self.draining.values())
        if self.kill_at is not None:
            deadlines.append(self.kill_at)
        if self.group_restart_at is not None:
            deadlines.append(self.group_restart_at)
        deadlines += list(self.startup_losses.values())
        if self.outsiders_at is not None:
            deadlines.append(self.outsiders_at)
        deadlines += [w.kill_at for slot in self.slots if slot.alive and (w := slot.worker) and w.kill_at is not None]
        deadlines += [due for stream in self.streams.values() if (due := stream.due()) is not None]
        timeout = max(0.0, min([now + MAX_WAIT_S, *deadlines]) - now)
        for key, _ in self.selector.select(timeout):
            if key.fd == self._wake_read:
                try:
                    while os.read(self._wake_read, 512):
                        pass
                except BlockingIOError:
                    pass
            else:
                self._read_pipe(int(key.fd))

    def _read_pipe(self, read_end: int) -> None:
        try:
            data = os.read(read_end, output.READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        stream = self.streams.get(read_end)
        if data and stream is not None:
            stream.feed(data, time.monotonic())
        elif not data:  # EOF: the worker (and every child of it) closed the stream
            self._close_pipe(read_end)

    def _close_pipe(self, read_end: int) -> None:
        stream = self.streams.pop(read_end, None)
        if stream is None:
            return
        stream.close()
        try:
            self.selector.unregister(read_end)
        except (KeyError, ValueError):
            pass
        try:
            os.close(read_end)
        except OSError:
            pass
        self.draining.pop(read_end, None)

    def _close_pipes(self) -> None:
        for read_end in list(self.streams):
            self._drain(read_end)
            self._close_pipe(read_end)

    def _drain(self, read_end: int) -> None:
        """Whatever an ended worker left in its pipe, now."""
        for _ in range(64):
            try:
                data = os.read(read_end, output.READ_SIZE)
            except (BlockingIOError, OSError):
                return
            stream = self.streams.get(read_end)
            if not data or stream is None:
                return
            stream.feed(data, time.monotonic())

    def _flush_partial_lines(self) -> None:
        now = time.monotonic()
        for stream in self.streams.values():
            due = stream.due()
            if due is not None and due <= now:
                stream.flush()

    # ---- signals ----------------------------------------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        """The launcher's handlers: note the signal and wake the loop (``set_wakeup_fd``)."""
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self.selector.register(self._wake_read, selectors.EVENT_READ)
        previous: dict[int, Any] = {}
        try:
            previous[-1] = signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (a test that runs the launcher in a thread): poll instead
            return previous
        for name in self.plan.signals:
            signum = getattr(signal, name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}", None)
            if signum is None:
                log.warning("--signals-to-handle: %s is not a signal here; ignored", name)
                continue
            previous[signum] = signal.signal(signum, self._on_signal)
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)  # a worker's end wakes the loop
        return previous

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            if signum == -1:
                signal.set_wakeup_fd(handler)
            else:
                signal.signal(signum, handler)

    def _act_on_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            name = workers_module.signal_name(signum)
            if self.stopping is None:
                self.stopping = signum
                self.kill_at = time.monotonic() + self.plan.shutdown_timeout
                log.info(
                    "received %s: passing it to every worker; SIGKILL to those still running in %.0f s",
                    name,
                    self.plan.shutdown_timeout,
                )
                if self.group_restart_at is not None:
                    log.info("the group's restart is cancelled: the launcher stops")
                self.group_restart_at = None
                self.startup_losses.clear()
                for slot in self.slots:
                    slot.respawn_at = None
                    if slot.alive and slot.worker is not None:
                        slot.worker.signal_group(signum)
                        slot.worker.signal_group(signal.SIGCONT)
            else:
                log.info("received %s again: SIGKILL to every worker", name)
                self._kill_all()

    def _enforce_deadline(self) -> None:
        now = time.monotonic()
        if self.outsiders_at is not None and now >= self.outsiders_at:
            self.outsiders_at = None
            self._stop_outsiders()
        if self.kill_at is not None and now >= self.kill_at:
            if any(slot.alive for slot in self.slots):
                log.warning("workers still running %.0f s after the signal: SIGKILL", self.plan.shutdown_timeout)
                self._kill_all()
            self.kill_at = None
        for slot in self.slots:
            worker = slot.worker
            if worker is not None and worker.kill_at is not None and now >= worker.kill_at:
                worker.kill_at = None
                if slot.alive:
                    log.warning(
                        "worker %s (pid %s) still running %.0f s after SIGTERM: SIGKILL",
                        slot.local_rank,
                        worker.pid,
                        self.plan.shutdown_timeout,
                    )
                    worker.signal_group(signal.SIGKILL)

    def _kill_all(self) -> None:
        for slot in self.slots:
            slot.respawn_at = None
            if slot.alive and slot.worker is not None:
                slot.worker.signal_group(signal.SIGKILL)

    # ---- workers' ends ----------------------------------------------------------------------------------------

    def _reap(self) -> None:
        for slot in self.slots:
            worker = slot.worker
            if worker is None or worker.ended is not None or worker.poll() is None:
                continue
            assert worker.returncode is not None and worker.ended is not None
            for read_end in worker.streams:
                if read_end in self.streams:
                    self._drain(read_end)
                    self.draining[read_end] = time.monotonic() + DRAIN_S
            self._read_announcements()  # a replacement's refusal, written just before it exited
            if worker.returncode != 0:
                worker.signal_group(signal.SIGKILL)  # what it left behind (a data loader's processes)
            self.exits.append(
                status_module.Exit(
                    slot.local_rank,
                    worker.pid,
                    worker.returncode,
                    worker.ended,
                    worker.refused,
                    worker.completed,
                    worker.gave_up,
                    worker.by_launcher,
                )
            )
            if worker.returncode == 0 and not self.wrapped and not worker.by_launcher:
                self._job_completed()  # a plain script: a worker that finished is the job finishing
            if self.group_restart_at is not None and worker.by_launcher:
                log.info(
                    "worker %s (pid %s, rank %s) ended: %s; stopped for the group's restart",
                    slot.local_rank,
                    worker.pid,
                    slot.rank,
                    status_module.describe(worker.returncode),
                )
                continue
            if worker.returncode != 0 and self._plain_restart(slot, worker):
                continue
            if worker.returncode != 0 and self._startup_loss(slot, worker):
                continue
            decision = workers_module.decide(
                worker.returncode,
                respawns_done=slot.respawns,
                max_respawns=self.plan.max_respawns,
                respawn_backoff=self.plan.respawn_backoff,
                stopping=self.stopping is not None or self.ending is not None,
                refused=worker.refused,
                completed=self.completed,
                heals=self.heals,
                gave_up=worker.gave_up,
                job_gave_up=self.gave_up is not None,
                join_timed_out=worker.join_timed_out,
                excluded=worker.excluded,
            )
            cause = self._root_cause(slot)
            how = status_module.describe(worker.returncode)
            when = f" in {decision.delay:.1f} s" if decision.respawn and decision.delay else ""
            level = logging.INFO if worker.returncode == 0 or self.stopping is not None else logging.WARNING
            log.log(
                level,
                "worker %s (pid %s, rank %s) ended: %s%s; %s%s",
                slot.local_rank,
                worker.pid,
                slot.rank,
                how,
                f" ({cause})" if cause else "",
                decision.reason,
                when,
            )
            if decision.respawn:
                slot.respawns += 1
                slot.respawn_at = time.monotonic() + decision.delay

    def _root_cause(self, slot: workers_module.Slot) -> str:
        """The first line of the exception torch's ``@record`` wrote for the worker, if it wrote one."""
        path = self.folder / str(slot.local_rank) / "error.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return ""
        message = raw.get("message", "") if isinstance(raw, dict) else ""
        if isinstance(message, dict):
            message = message.get("message", "")
        return str(message).strip().splitlines()[0][:300] if str(message).strip() else ""

    # ---- start-up losses and the group's restart (``torchras.launch.startup``) -------------------------------

    def _startup_loss(self, slot: workers_module.Slot, worker: workers_module.Worker) -> bool:
        """A worker lost before the job's first round: the group restarts, or the verdict waits for the others
        to say whether they run the Wrapper. False: not a start-up loss, the usual rules decide."""
        if not startup.eligible(
            started=self.job_started,
            nnodes=self.plan.nnodes,
            max_respawns=self.plan.max_respawns,
            newcomer=worker.newcomer,
            ending=self.stopping is not None or self.gave_up is not None or self.ending is not None,
        ):
            return False
        if worker.by_launcher or worker.returncode is None:
            return False
        how = status_module.describe(worker.returncode)
        verdict = startup.classify(wrapper_built=self.wrapper_built, others_alive=True, deadline_passed=False)
        if verdict is startup.Verdict.RESTART:
            self._restart_group(f"worker {slot.local_rank} (pid {worker.pid}, rank {slot.rank}) ended: {how}")
            return True
        self.startup_losses[slot.local_rank] = time.monotonic() + startup.VERDICT_S
        log.warning(
            "worker %s (pid %s, rank %s) ended: %s, before the job started; waiting up to %.0f s for the other "
            "workers to say whether they run inprocess.Wrapper (then the group restarts) or not",
            slot.local_rank,
            worker.pid,
            slot.rank,
            how,
            startup.VERDICT_S,
        )
        return True

    def _kill_stuck_before_start(self) -> None:
        """A worker stuck before the job's first round (stopped, or idle while others wait in the start-up barrier:
        ``startup.stuck``) is killed: a start-up loss (``torchras.launch.startup``), instead of a 2-minute wait of
        the others in the barrier."""
        if self.job_started or self.stopping is not None or self.gave_up is not None or self.ending is not None:
            return
        now = time.monotonic()
        waiting = {w.pid for slot in self.slots if slot.alive and (w := slot.worker) and w.pid in self.wrapper_pids}
        for slot in self.slots:
            worker = slot.worker
            if worker is None or not slot.alive or worker.newcomer or worker.by_launcher:
                continue
            if worker.pid in self.wrapper_pids:
                continue  # in the barrier, or past it
            worker.observe(now)
            why = startup.stuck(
                stopped_for=worker.stopped_for(now),
                idle_for=worker.idle_for(now),
                others_wait=bool(waiting - {worker.pid}),
            )
            if why is None:
                continue
            log.warning(
                "worker %s (pid %s, rank %s) %s, before the job's first round, where no RAS node watches it yet: "
                "killing it",
                slot.local_rank,
                worker.pid,
                slot.rank,
                why,
            )
            worker.forget_activity()
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _settle_startup_losses(self) -> None:
        """The pending verdicts of start-up losses, once the workers said what they run (or could not)."""
        if not self.startup_losses:
            return
        if self.stopping is not None or self.gave_up is not None or self.ending is not None or self.job_started:
            self.startup_losses.clear()
            return
        now = time.monotonic()
        others_alive = any(slot.alive for slot in self.slots)
        for local_rank, deadline in sorted(self.startup_losses.items()):
            verdict = startup.classify(
                wrapper_built=self.wrapper_built, others_alive=others_alive, deadline_passed=now >= deadline
            )
            if verdict is startup.Verdict.WAIT:
                continue
            slot = self.slots[local_rank]
            worker = slot.worker
            assert worker is not None and worker.returncode is not None
            if verdict is startup.Verdict.RESTART:
                self.startup_losses.clear()
                self._restart_group(
                    f"worker {local_rank} (pid {worker.pid}, rank {slot.rank}) ended: "
                    f"{status_module.describe(worker.returncode)}"
                )
                return
            del self.startup_losses[local_rank]
            why = (
                f"no worker said within {startup.VERDICT_S:.0f} s that it runs inprocess.Wrapper"
                if others_alive
                else "the other workers ended without saying that they run inprocess.Wrapper"
            )
            decision = workers_module.decide(
                worker.returncode,
                respawns_done=slot.respawns,
                max_respawns=self.plan.max_respawns,
                respawn_backoff=self.plan.respawn_backoff,
                stopping=False,
                refused=False,
                completed=False,
                heals=self.heals,
            )
            log.warning("worker %s (pid %s, rank %s): %s; %s", local_rank, worker.pid, slot.rank, why, decision.reason)
            if decision.respawn:
                slot.respawns += 1
                slot.respawn_at = now + decision.delay

    def _restart_group(
        self, cause: str, when: str = STARTUP_WHEN, plain: bool = False, ranks: tuple[int, ...] = ()
    ) -> None:
        """Stop every worker of the node and start the group again: at start-up (``startup``), within
        ``--max-respawns``; a job without the Wrapper (``plain``, ``restarts``), within ``--max-restarts``."""
        plan = self.plan
        if plain:
            self._restart_plain_group(cause, ranks)
            return
        if self.restart_count >= plan.max_respawns:
            self.ending = f"the job could not start: {cause}, after {self.restart_count} restart(s) of the group"
            log.warning(
                "%s, %s; the group was restarted %s time(s) already (--max-respawns %s): "
                "the job cannot start at full size; stopping every worker (SIGTERM, SIGKILL in %.0f s)",
                cause,
                when,
                self.restart_count,
                plan.max_respawns,
                plan.shutdown_timeout,
            )
            self._stop_workers(signal.SIGTERM)
            return
        delay = workers_module.backoff(self.restart_count, plan.respawn_backoff)
        self.restart_count += 1
        self.group_restart_at = time.monotonic() + delay
        for slot in self.slots:
            slot.respawn_at = None
        alive = [slot for slot in self.slots if slot.alive]
        log.warning(
            "%s, %s: the group restarts (%s of %s)%s: %s"
            "every worker of this node is started again as a fresh group, TORCHELASTIC_RESTART_COUNT=%s",
            cause,
            when,
            self.restart_count,
            plan.max_respawns,
            f" in {delay:.1f} s" if delay else "",
            f"SIGKILL to the {len(alive)} other worker(s); " if alive else "",
            self.restart_count,
        )
        self._stop_workers(signal.SIGKILL)

    def _stop_workers(self, signum: int, grace: float | None = None) -> None:
        """``signum`` (and SIGCONT) to every worker still running, which the launcher ends itself; SIGKILL after
        ``grace`` (``--shutdown-timeout``)."""
        for slot in self.slots:
            worker = slot.worker
            if slot.alive and worker is not None:
                worker.by_launcher = True
                if signum != signal.SIGKILL and worker.kill_at is None:
                    worker.kill_at = time.monotonic() + (self.plan.shutdown_timeout if grace is None else grace)
                worker.signal_group(signum)
                worker.signal_group(signal.SIGCONT)

    def _start_group(self) -> None:
        """The group's restart, once every worker of the old one has ended: what they left is ended too (the
        Wrapper's store server must free its port), then every local rank starts as an initial member."""
        self.group_restart_at = None
        self._end_leftovers(at_once=True)
        run = self.folder.parent
        self.folder = run / f"attempt_{self.restart_count}"
        self.folder.mkdir(exist_ok=True)
        self.job_started = False
        self.world_seen = None
        if self.restart_note is not None:  # a job without the Wrapper: a fresh store (``LaunchStore.renew``)
            self.store.renew()
            self.exits = []  # the old group's ends were healed by the restart: the job's status is the new one's
        self._new_attempt()
        for slot in self.slots:
            slot.events_offset = 0
            slot.respawn_at = None
            self._start(slot, newcomer=False)
        log.info(
            "the group started again (attempt %s): %s",
            self.restart_count,
            ", ".join(f"{slot.local_rank}: pid {slot.pids[-1]}" for slot in self.slots),
        )

    # ---- group restarts of a job without the Wrapper (``torchras.launch.restarts``) ---------------------------

    def _new_attempt(self) -> None:
        """The current attempt of the group starts: its journal folder, its verdicts, what its workers run."""
        self.journal_dir, _ = ras_node.journal_folder(os.environ, str(self.folder))
        self.journals = restarts.Journals(Path(self.journal_dir)) if self.ras_node else None
        self.attempt_epoch = time.time()
        self.said_unrestarted = False
        self.mode = restarts.Mode()
        self.mode_ranks = {"wrapped": set(), "plain": set()}

    def _restarts_plain(self) -> bool:
        """Whether a fault now restarts the group: ``--max-restarts``, the job not under the Wrapper, not ending."""
        return (
            self.plan.max_restarts > 0
            and not self.wrapped
            and not self.completed
            and self.stopping is None
            and self.gave_up is None
            and self.ending is None
            and self.group_restart_at is None
        )

    def _plain_restart(self, slot: workers_module.Slot, worker: workers_module.Worker) -> bool:
        """A worker of a job without the Wrapper failed: the group restarts (torchrun's rule). False: not here."""
        if worker.by_launcher or not self._restarts_plain():
            return False
        assert worker.returncode is not None
        root = self._root_cause(slot)
        cause = f"worker {slot.local_rank} (pid {worker.pid}, rank {slot.rank}) ended: "
        cause += status_module.describe(worker.returncode) + (f" ({root})" if root else "")
        self._restart_group(cause, plain=True, ranks=(slot.rank,))
        return True

    def _read_verdicts(self) -> None:
        """The verdicts in the current workers' journals that restart a job without the Wrapper."""
        if self.journals is None or self.wrapped or self.group_restart_at is not None:
            return
        pids = {slot.worker.pid: slot for slot in self.slots if slot.worker is not None}
        for verdict in self.journals.restarting(pids, self.attempt_epoch):
            subject = pids.get(verdict.subject_pid) if verdict.subject_pid is not None else None
            if subject is not None and subject.worker is not None and subject.worker.poll() == 0:
                continue  # it finished: its end is no fault
            if not self._restarts_plain():
                if not self.said_unrestarted and self.stopping is None and self.ending is None:
                    self.said_unrestarted = True
                    log.warning("%s; %s", verdict.cause, restarts.unrestarted(self.plan.max_restarts, self.completed))
                continue
            self._restart_group(f"{verdict.cause} (seen by pid {verdict.seen_by})", plain=True, ranks=verdict.ranks)
            return

    def _restart_plain_group(self, cause: str, ranks: tuple[int, ...]) -> None:
        plan = self.plan
        grace = restarts.stop_grace(plan.shutdown_timeout)
        alive = [slot for slot in self.slots if slot.alive]
        if self.restart_count >= plan.max_restarts:
            self.ending = f"the job failed: {cause}, after {self.restart_count} restart(s) of the group"
            log.warning(
                "%s; the group was restarted %s time(s) already (--max-restarts %s): the job fails; stopping every "
                "worker (SIGTERM, SIGKILL in %.0f s)",
                cause,
                self.restart_count,
                plan.max_restarts,
                grace,
            )
            self._stop_workers(signal.SIGTERM, grace)
            return
        delay = workers_module.backoff(self.restart_count, plan.respawn_backoff)
        self.restart_count += 1
        self.group_restart_at = time.monotonic() + delay
        self.restart_note = restarts.restart_note(self.restart_count, cause, ranks, time.time())
        for slot in self.slots:
            slot.respawn_at = None
        log.warning(
            "%s: the group restarts (%s of %s)%s: %severy worker is started again as a fresh group, with a new store, "
            "TORCHELASTIC_RESTART_COUNT=%s",
            cause,
            self.restart_count,
            plan.max_restarts,
            f" in {delay:.1f} s" if delay else "",
            f"SIGKILL to the {len(alive)} worker(s) left; " if alive else "",
            self.restart_count,
        )
        # Nothing to save (the state is in the script's checkpoints), and the others wait in a collective where a
        # Python handler of SIGTERM cannot run: SIGKILL (and SIGCONT, for a stopped worker's children) at once.
        self._stop_workers(signal.SIGKILL)

    def _worker_mode(self, slot: workers_module.Slot, event: launch_events.Announcement, wrapped: bool) -> None:
        """A worker said that it runs the Wrapper, or that it trains without one: a job that mixes both is refused
        (``restarts.mixed_message``); a Wrapper's job keeps the in-place healing, and --max-restarts is not used."""
        pid = event.get("pid")
        if wrapped:
            self.wrapper_pids.add(int(pid) if isinstance(pid, int) else -1)
            if self.plan.max_restarts and not self.said_wrapped_restarts:
                self.said_wrapped_restarts = True
                log.info("--max-restarts %s is not used: the workers run inprocess.Wrapper", self.plan.max_restarts)
        elif pid in self.wrapper_pids:
            return  # its first process group, inside its Wrapper
        if slot.worker is None or pid != slot.worker.pid:
            return
        self.mode_ranks["wrapped" if wrapped else "plain"].add(slot.local_rank)
        was_mixed = self.mode.mixed
        self.mode.wrapped |= wrapped
        self.mode.plain |= not wrapped
        if self.mode.mixed and not was_mixed and self.ending is None and self.stopping is None:
            self.ending = "the job was refused: it mixes workers with and without inprocess.Wrapper"
            log.error(
                "%s; stopping every worker (SIGTERM, SIGKILL in %.0f s)",
                restarts.mixed_message(self.mode_ranks["wrapped"], self.mode_ranks["plain"]),
                self.plan.shutdown_timeout,
            )
            for each in self.slots:
                each.respawn_at = None
            self.group_restart_at = None
            self._stop_workers(signal.SIGTERM)

    # ---- the job's members ------------------------------------------------------------------------------------

    def _check_members(self) -> None:
        """On one node, where the launcher sees every worker of the job: a job with no member left, and a worker
        that the job's world goes on without."""
        if (
            self.plan.nnodes != 1
            or not self.heals
            or not self.job_started
            or self.completed
            or self.stopping is not None
            or self.gave_up is not None
            or self.ending is not None
            or self.group_restart_at is not None
        ):
            return
        members = [slot for slot in self.slots if slot.alive and slot.worker and not slot.worker.waiting_to_join]
        waiting = [slot for slot in self.slots if slot.alive and slot.worker and slot.worker.waiting_to_join]
        due = [slot for slot in self.slots if slot.respawn_at is not None]
        if not members and (waiting or due):
            self._restart_group(
                f"no member of the job is left ({len(waiting)} replacement(s) waiting to join, {len(due)} due)",
                "so nothing can admit them, and the training state in memory is gone with the members",
            )
            return
        self._stop_excluded()

    def _stop_excluded(self) -> None:
        """A worker still running that the job's latest iteration does without (its world is complete with the
        other workers: a hung worker the Wrapper excluded) is ended (SIGTERM, SIGKILL after the shutdown timeout)
        and respawned like any lost worker, so the world grows back to its size."""
        if self.world_seen is None:
            return
        iteration, world = self.world_seen
        inside = [s for s in self.slots if s.alive and s.worker is not None and s.worker.iteration == iteration]
        if len(inside) < world:
            return
        for slot in self.slots:
            worker = slot.worker
            if (
                not slot.alive
                or worker is None
                or worker.waiting_to_join
                or worker.kill_at is not None
                or worker.iteration is None
                or worker.iteration >= iteration
            ):
                continue
            log.warning(
                "worker %s (pid %s, rank %s) is no longer part of the job: iteration %s trains at %s rank(s) "
                "without it (its last was iteration %s: it hung or left); SIGTERM, SIGKILL in %.0f s, then it is "
                "respawned",
                slot.local_rank,
                worker.pid,
                slot.rank,
                iteration,
                world,
                worker.iteration,
                self.plan.shutdown_timeout,
            )
            worker.by_launcher = worker.excluded = True
            worker.kill_at = time.monotonic() + self.plan.shutdown_timeout
            worker.signal_group(signal.SIGTERM)
            worker.signal_group(signal.SIGCONT)

    def _stop_outsiders(self) -> None:
        """The job completed ``--shutdown-timeout`` ago: a worker still running that was not in its final world (a
        hung worker, a replacement still waiting) has nothing left to do: SIGTERM, SIGKILL after the timeout."""
        for slot in self.slots:
            worker = slot.worker
            if not slot.alive or worker is None or worker.completed or worker.kill_at is not None:
                continue
            log.warning(
                "worker %s (pid %s, rank %s) still running %.0f s after the job completed, outside its final world: "
                "SIGTERM, SIGKILL in %.0f s",
                slot.local_rank,
                worker.pid,
                slot.rank,
                self.plan.shutdown_timeout,
                self.plan.shutdown_timeout,
            )
            worker.by_launcher = True
            worker.kill_at = time.monotonic() + self.plan.shutdown_timeout
            worker.signal_group(signal.SIGTERM)
            worker.signal_group(signal.SIGCONT)

    # ---- what the workers leave behind (``reaper``) --------------------------------------------------------

    def _worker_pids(self) -> set[int]:
        return {pid for slot in self.slots for pid in slot.pids}

    def _reap_orphans(self) -> None:
        """Reap (never end) the orphans the launcher adopted that have exited, at most once per ``REAP_EVERY_S``."""
        now = time.monotonic()
        if self.subreaper and now - self._reaped_at >= REAP_EVERY_S:
            self._reaped_at = now
            reaper.children(self._worker_pids())

    def _end_leftovers(self, at_once: bool = False) -> None:
        """Every worker has ended: end what they left (monitor processes, the Wrapper's store server). On one node,
        or when the launcher stops, at once; on several nodes the store server may serve the other nodes' last
        barriers: what is left gets its linger (``INPROCESS_STORE_LINGER``, 10 s) plus a grace to end by itself."""
        if not self.subreaper:
            return
        left = reaper.children(self._worker_pids())
        if left and not at_once and self.plan.nnodes > 1 and self.stopping is None:
            linger = float(os.environ.get("INPROCESS_STORE_LINGER", "10")) + LEFTOVER_GRACE_S
            deadline = time.monotonic() + linger
            while left and time.monotonic() < deadline:
                time.sleep(0.2)
                left = reaper.children(self._worker_pids())
            if left:
                log.info("process(es) the workers left still running %.0f s after the job's end", linger)
        reaper.end(left, LEFTOVER_GRACE_S, "the workers left (monitor processes, store servers)")

    def _respawn_due(self) -> None:
        now = time.monotonic()
        if (
            self.group_restart_at is not None
            and self.group_restart_at <= now
            and not any(slot.alive for slot in self.slots)
        ):
            try:
                self._start_group()
            except OSError as error:
                log.error("the group could not be started again: %s", error)
                self.ending = f"the job could not start: the group could not be started again: {error}"
            return
        for slot in self.slots:
            if (
                slot.respawn_at is not None
                and slot.respawn_at <= now
                and self.stopping is None
                and self.gave_up is None
                and self.ending is None
                and self.group_restart_at is None
            ):
                try:
                    self._start(slot, newcomer=True)
                except OSError as error:
                    log.error("worker %s could not be respawned: %s", slot.local_rank, error)
                    slot.respawn_at = None

    def _finished(self) -> bool:
        if self.group_restart_at is not None or self.startup_losses:
            return False
        for slot in self.slots:
            if slot.alive or slot.respawn_at is not None:
                return False
        now = time.monotonic()
        for read_end, give_up in list(self.draining.items()):
            if give_up <= now:
                self._close_pipe(read_end)
        return not self.draining

    # ---- what the workers' Wrappers announce (inprocess.launch_events; the lines: torchras_formats.launch_events) --

    def _read_announcements(self) -> None:
        for slot in self.slots:
            path = self.folder / str(slot.local_rank) / "events.jsonl"
            try:
                with open(path, "rb") as file:
                    file.seek(slot.events_offset)
                    data = file.read()
            except OSError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            slot.events_offset += len(complete)
            for line in complete.splitlines():
                event = launch_events.decode(line)
                if event is not None:
                    self._announced(slot, event)
        if self.gave_up is not None:  # after every file is read: a replacement's "joined" may be in a later one
            self._stop_waiting_replacements()

    def _announced(self, slot: workers_module.Slot, event: launch_events.Announcement) -> None:
        kind = event.get("event")
        worker = slot.worker
        current = worker is not None and event.get("pid") == worker.pid
        if kind in (LaunchEvent.WRAPPER, LaunchEvent.WRAPPER_STARTING):
            self.wrapped = True
            self.wrapper_built = True
            self._worker_mode(slot, event, wrapped=True)
        elif kind in (LaunchEvent.PROCESS_GROUP_STARTING, LaunchEvent.PROCESS_GROUP):
            self._worker_mode(slot, event, wrapped=False)
        if kind == LaunchEvent.WRAPPER and current and not event.get("newcomer"):
            self.job_started = True  # its start-up barrier passed: every initial rank met (``startup``)
        if kind == LaunchEvent.WRAPPER and event.get("joining") and not self.heals:
            self.heals = True
            if self.plan.max_respawns:
                log.info("the workers' inprocess.Wrapper admits newcomers: a dead worker is respawned and joins")
        elif kind == LaunchEvent.JOINED:
            if current and worker is not None:
                worker.joined = True
            log.info(
                "worker %s (pid %s) joined the job as rank %s of %s (iteration %s)",
                slot.local_rank,
                event.get("pid"),
                event.get("rank"),
                event.get("world_size"),
                event.get("iteration"),
            )
        elif kind == LaunchEvent.JOIN_FAILED and current and worker is not None:
            worker.refused = event.get("reason") == "closed"
            worker.join_timed_out = event.get("reason") == "timeout"
        elif kind == LaunchEvent.COMPLETED and current and worker is not None:
            worker.completed = True
            self._job_completed()
        elif kind == LaunchEvent.GAVE_UP:
            if current and worker is not None:
                worker.gave_up = True
            self._job_gave_up(slot, event)
        elif kind == LaunchEvent.ITERATION:
            iteration, world = int(event.get("iteration", 0)), int(event.get("world_size", 0))
            if current and worker is not None:
                worker.iteration = iteration
            if self.world_seen is None or iteration > self.world_seen[0]:
                if self.world_seen is not None and world != self.world_seen[1]:
                    log.info("the job trains at %s rank(s) now (iteration %s)", world, iteration)
                self.world_seen = (iteration, world)

    def _job_completed(self) -> None:
        """Training finished: no replacement is started any more (nobody would admit it)."""
        if self.completed:
            return
        self.completed = True
        if self.wrapped:  # the final world exits by itself; what is outside it gets a deadline (_stop_outsiders)
            self.outsiders_at = time.monotonic() + self.plan.shutdown_timeout
        for slot in self.slots:
            if slot.respawn_at is not None:
                slot.respawn_at = None
                log.info("worker %s is not respawned: the job has completed", slot.local_rank)

    def _job_gave_up(self, slot: workers_module.Slot, event: launch_events.Announcement) -> None:
        """A worker's Wrapper gave up: the job ends. Nothing is respawned any more; the workers end by themselves."""
        if self.gave_up is not None:
            return  # said once, for the first; the others' own lines say that their Wrapper gave up too
        reason = str(event.get("reason") or "").strip().splitlines()
        self.gave_up = f"worker {slot.local_rank}'s inprocess.Wrapper, pid {event.get('pid')}" + (
            f": {reason[0][:300]}" if reason else ""
        )
        log.warning(
            "worker %s (pid %s, rank %s): its inprocess.Wrapper gave up: the job ends; no worker is respawned any "
            "more, the others are left to end",
            slot.local_rank,
            event.get("pid"),
            slot.rank,
        )
        for each in self.slots:
            if each.respawn_at is not None:
                each.respawn_at = None
                log.info("worker %s is not respawned: the job gave up", each.local_rank)

    def _stop_waiting_replacements(self) -> None:
        """The job gave up: a replacement still waiting to be admitted never will be (SIGTERM, then SIGKILL)."""
        for slot in self.slots:
            worker = slot.worker
            if worker is None or not worker.waiting_to_join or worker.kill_at is not None:
                continue
            log.info(
                "worker %s (pid %s) was waiting to join the job, which gave up: SIGTERM (SIGKILL in %.0f s)",
                slot.local_rank,
                worker.pid,
                self.plan.shutdown_timeout,
            )
            worker.kill_at = time.monotonic() + self.plan.shutdown_timeout
            worker.signal_group(signal.SIGTERM)
            worker.signal_group(signal.SIGCONT)

    # ---- the end ----------------------------------------------------------------------------------------------

    def _stop_store(self) -> None:
        """Stop serving ``MASTER_PORT``; let the thread that builds the store finish first (a short job can end
        while it still imports torch, and an interpreter must not exit in the middle of that)."""
        if self.store.listener is not None:
            self.store.ready.wait(120)
        self.store.close()

    def _say_ended(self, code: int) -> None:
        if self.stopping is not None:
            log.info("stopped by %s: status %s", workers_module.signal_name(self.stopping), code)
            return
        if self.gave_up is not None:
            log.warning("every worker has exited: the job gave up (%s): status %s", self.gave_up, code)
            return
        if self.ending is not None:
            log.warning("every worker has exited: %s: status %s", self.ending, code)
            return
        failure = status_module.first_real_failure(self.exits, self.wrapped)
        if failure is None:
            left = sum(1 for item in self.exits if item.returncode == 0 and (item.completed or not self.wrapped))
            log.info("every worker has exited: the job finished (%s worker(s) completed): status 0", left)
        else:
            log.warning(
                "every worker has exited: the job failed: worker %s (pid %s) %s first: status %s",
                failure.local_rank,
                failure.pid,
                status_module.describe(failure.returncode),
                code,
            )


def configure_logging(console: output.Console) -> None:
    """stdlib logging for the launcher's lines: ``rasd launch: ...`` on stderr, whole, at INFO."""
    logger = logging.getLogger("torchras")
    if not any(isinstance(handler, _EventLines) for handler in logger.handlers):
        handler = _EventLines(console)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(os.environ.get("TORCHRAS_LAUNCH_LOG_LEVEL", "INFO"))
    logger.propagate = False


def main(argv: Sequence[str] | None = None, *, line_prefixes: bool = True) -> int:
    """``rasd launch ARGV``; ``line_prefixes=False`` (for ``rasd demo``): worker lines without ``[default0]:``."""
    _, plan = args_module.parse(sys.argv[1:] if argv is None else argv)
    console = output.Console()
    configure_logging(console)
    return Launcher(plan, console, line_prefixes).run()
