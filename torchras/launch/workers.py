"""The worker processes: starting one, its end, and whether (and when) its local rank gets a replacement.

One *slot* per local rank; a slot runs one worker process at a time, and after the worker's end maybe a
replacement (a *respawn*). Each worker is a new session (``start_new_session``, as torchrun's), so a Ctrl+C on the
terminal reaches the launcher only, which passes it on to every worker's process group, and a worker's own
children (a data loader's processes) end with it.

When a worker ends, ``decide`` says what happens to its slot. The rules, first match wins:

========================================================  ==============================  ===================
the worker                                                its slot                        why
========================================================  ==============================  ===================
its Wrapper gave up (``gave_up``), whatever its exit      done, and the job ends          no restart healed
                                                                                          it: a replacement
                                                                                          would meet the same
exited 0                                                  done                            it finished
ended while the launcher stops (a signal)                 done                            the job is stopping
was a replacement the job refused (it had completed)      done                            nothing to join
ended after the job completed (its Wrapper said so; a     done                            the job completed
plain script: a worker exited 0)
ended after the job gave up (another worker's Wrapper)     done                            the job ended
was a replacement no round admitted in its join timeout   done, the job goes on smaller   it would wait again
ended, ``--max-respawns 0``                               done, the job goes on smaller   the user said so
ended, and no worker of the job said its Wrapper joins    done, the job goes on smaller   nothing could admit
                                                                                          a replacement
ended ``--max-respawns`` times already                    done, the job goes on smaller   it keeps dying
ended otherwise                                           a replacement, after a back-off heal to full size
========================================================  ==============================  ===================

The back-off: the first replacement of a slot starts at once (a kill -9 heals as fast as a process can start),
the second after ``--respawn-backoff`` seconds, each later one after twice the one before, so a worker that keeps
dying (a bad GPU, a broken node) costs little before ``--max-respawns`` stops it.

"A worker of the job said its Wrapper joins": the Wrapper announces, through ``inprocess.launch_events``, whether
it admits newcomers (``inprocess.elastic.Joining``, on by default under rasd launch). A plain script, or a Wrapper
whose joining the user turned off, cannot take a replacement: its dead worker stays dead and the others go on, as
nvidia-resiliency-ext's Wrapper wants its launcher to do.

"The Wrapper gave up": its ``initialize`` raised ``RestartAbort`` (``RetryController``'s limits, a check of the
user's own such as ``rasd demo``'s for a fault that repeats), and it announced ``gave_up``. That ends the job, not
only the worker: the Wrapper decided that no restart heals what it met, so a replacement would meet it too (and,
with every rank gone, would wait for a job that has ended). The launcher respawns nothing any more, on any local
rank, lets the workers still running end by themselves (under the Wrapper they give up at the same iteration) but
for a replacement still waiting to be admitted (``Worker.waiting_to_join``: nothing will admit it, so it is asked
to leave), and its status is not 0 (``torchras.launch.status``).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from .output import Console, Destination, Stream


@dataclasses.dataclass(frozen=True)
class Decision:
    """What happens to a slot after its worker's end."""

    respawn: bool
    delay: float
    reason: str


def backoff(respawns_done: int, base: float) -> float:
    """Seconds before the next replacement of a slot that has had ``respawns_done`` already: 0, base, 2 base..."""
    return 0.0 if respawns_done == 0 else base * 2 ** (respawns_done - 1)


def decide(
    returncode: int,
    *,
    respawns_done: int,
    max_respawns: int,
    respawn_backoff: float,
    stopping: bool,
    refused: bool,
    completed: bool,
    heals: bool,
    gave_up: bool = False,
    job_gave_up: bool = False,
    join_timed_out: bool = False,
    excluded: bool = False,
) -> Decision:
    """The table in this module's docstring. ``gave_up``: this worker's Wrapper gave up; ``job_gave_up``: a worker's
    Wrapper of this job gave up (this one or another)."""
    if gave_up:
        return Decision(False, 0.0, "not respawned: its Wrapper gave up")
    if returncode == 0 and not excluded:
        return Decision(False, 0.0, "it finished")
    if stopping:
        return Decision(False, 0.0, "the launcher is stopping")
    if refused:
        return Decision(False, 0.0, "the job had completed when it asked to join")
    if completed:
        return Decision(False, 0.0, "the job has completed")
    if job_gave_up:
        return Decision(False, 0.0, "not respawned: the job gave up")
    if join_timed_out:
        return Decision(
            False,
            0.0,
            "not respawned: it waited its join timeout and no round admitted it (a replacement would wait as long); "
            "the job goes on without it",
        )
    if max_respawns == 0:
        return Decision(False, 0.0, "not respawned (--max-respawns 0): the job goes on without it")
    if not heals:
        return Decision(
            False,
            0.0,
            "not respawned: no worker of this job runs under inprocess.Wrapper with joining, so nothing could admit "
            "a replacement; the others go on without it",
        )
    if respawns_done >= max_respawns:
        return Decision(
            False,
            0.0,
            f"not respawned again: its local rank was respawned {respawns_done} time(s) already (--max-respawns "
            f"{max_respawns}); the job goes on without it",
        )
    delay = backoff(respawns_done, respawn_backoff)
    return Decision(True, delay, f"respawning it ({respawns_done + 1} of {max_respawns})")


class Worker:
    """One worker process and the pipes the launcher reads its output from."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        streams: dict[int, Stream],
        newcomer: bool,
        started: float,
    ) -> None:
        self.process = process
        self.pid = process.pid
        self.streams = streams  # pipe read end -> its stream
        self.newcomer = newcomer
        self.started = started
        self.returncode: int | None = None
        self.ended: float | None = None
        self.refused = False  # a replacement that the job turned away (inprocess.launch_events: join_failed)
        self.completed = False  # its Wrapper said the wrapped call completed (inprocess.launch_events)
        self.gave_up = False  # its Wrapper gave up (inprocess.launch_events: gave_up)
        self.joined = False  # a replacement its Wrapper says was admitted (inprocess.launch_events: joined)
        self.join_timed_out = False  # a replacement no round admitted within its join timeout (join_failed)
        self.iteration: int | None = None  # the last iteration its Wrapper said it runs (inprocess.launch_events)
        self.kill_at: float | None = None  # monotonic time it gets SIGKILL, if it was asked to leave
        #: The launcher ended it itself (a start-up restart of the group; no longer part of the job): its end is
        #: never the job's failure (``torchras.launch.status``).
        self.by_launcher = False
        #: The launcher ended it because the job's latest iteration trains without it (a hung worker the Wrapper
        #: excluded): it is respawned however it ends, a clean exit included (a hung rank that resumes leaves with 0).
        self.excluded = False
        #: What the launcher saw of it before the job's first round (``observe``; ``torchras.launch.startup``): since
        #: when it has been stopped (SIGSTOP), its CPU seconds and bytes read and written, and since when those stand.
        self.stopped_since: float | None = None
        self.activity: tuple[float, int] | None = None
        self.active_at = 0.0

    def observe(self, now: float) -> None:
        """Read its state and activity (``observed``): when it changed last, and since when it is stopped."""
        stopped, activity = observed(self.pid)
        if not stopped:
            self.stopped_since = None
        elif self.stopped_since is None:
            self.stopped_since = now
        if activity is None or activity != self.activity:
            self.activity = activity
            self.active_at = now

    def stopped_for(self, now: float) -> float:
        return 0.0 if self.stopped_since is None else now - self.stopped_since

    def idle_for(self, now: float) -> float:
        return 0.0 if self.activity is None else now - self.active_at

    def forget_activity(self) -> None:
        self.stopped_since, self.activity, self.active_at = None, None, time.monotonic()

    @property
    def waiting_to_join(self) -> bool:
        """A replacement (or a relaunched node's worker) still running that its Wrapper has not said was admitted."""
        return self.newcomer and not self.joined and self.returncode is None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.process.poll()
            if code is not None:
                self.returncode = code
                self.ended = time.time()
        return self.returncode

    def signal_group(self, signum: int) -> None:
        """``signum`` to the worker's process group (it and its children), if any of it is left."""
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def spawn(
    command: Sequence[str],
    env: Mapping[str, str],
    destinations: Mapping[int, Destination],
    console: Console,
    line_prefix: bytes,
    newcomer: bool,
    separator: bytes | None = None,
) -> Worker:
    """Start one worker in a session of its own, its streams wired as ``destinations`` say.

    ``separator``: a line written first to the log files of a replacement, which appends to its rank's files.
    """
    handles: dict[int, int | BinaryIO] = {}
    readers: dict[int, int] = {}
    files: list[BinaryIO] = []
    streams: dict[int, Stream] = {}
    try:
        for stream, destination in destinations.items():
            file: BinaryIO | None = None
            if destination.file is not None:
                os.makedirs(os.path.dirname(destination.file), exist_ok=True)
                file = open(destination.file, "ab")  # noqa: SIM115 - held by the Stream, or closed below
                if separator is not None:
                    file.write(separator + b"\n")
                    file.flush()
                files.append(file)
            if destination.pipe:
                read_end, write_end = os.pipe()
                os.set_blocking(read_end, False)
                readers[stream] = read_end
                handles[stream] = write_end
                streams[read_end] = Stream(console, stream, line_prefix, file)
            elif file is not None:
                handles[stream] = file
            else:
                handles[stream] = subprocess.DEVNULL
        process = subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=handles[1],
            stderr=handles[2],
            start_new_session=True,
        )
    except BaseException:
        for read_end in readers.values():
            os.close(read_end)
        for file in files:
            file.close()
        raise
    finally:
        for stream in readers:
            handle = handles[stream]
            assert isinstance(handle, int)
            os.close(handle)
    for file in files:
        if all(s.file is not file for s in streams.values()):
            file.close()  # the worker writes it directly; the launcher needs no handle of its own
    return Worker(process, streams, newcomer, time.time())


@dataclasses.dataclass
class Slot:
    """One local rank: the worker that runs it now, and its history."""

    local_rank: int
    rank: int  # node_rank * nproc_per_node + local_rank
    worker: Worker | None = None
    respawns: int = 0
    respawn_at: float | None = None  # monotonic time a replacement is due, if one is
    events_offset: int = 0  # how far the launcher has read its events file
    pids: list[int] = dataclasses.field(default_factory=list)  # every worker it has run, in order

    @property
    def alive(self) -> bool:
        return self.worker is not None and self.worker.returncode is None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def observed(pid: int) -> tuple[bool, tuple[float, int] | None]:
    """Whether the process is stopped by a signal (SIGSTOP, SIGTSTP: state ``T``; not traced by a debugger), and
    what it has done so far: CPU seconds (user and system) and bytes read and written through any descriptor
    (``read_chars``, ``write_chars``: files, pipes and sockets alike). ``(False, None)`` when it cannot be read."""
    import psutil

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            stopped = process.status() == psutil.STATUS_STOPPED
            cpu = process.cpu_times()
            io = process.io_counters()
        chars = int(getattr(io, "read_chars", io.read_bytes)) + int(getattr(io, "write_chars", io.write_bytes))
        return stopped, (cpu.user + cpu.system, chars)
    except (psutil.Error, OSError):
        return False, None
