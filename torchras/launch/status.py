"""The job's exit status, and how a worker's end reads in one line. Pure functions of what the launcher saw.

The rule (issues 25 and 38): 0 when the job completed its work, whatever died on the way and was healed; the cause
otherwise.

* **The job completed its work**, under ``inprocess.Wrapper``: a worker's wrapped call completed (its Wrapper
  announced ``completed``) and every worker whose call completed, the final world, exited 0. The Wrapper announces
  ``completed`` only after the completion barrier of every rank of that world, so those workers are the final world.
  A failure of any other worker does not count: it was survived (the job went on without it, respawned or smaller,
  and completed), or it came after the end from a process that was no longer part of the job (a hung worker the job
  had excluded, a replacement that waited to join). A rank of the final world that fails after its call completed
  (in its teardown) is the job's failure: the last line names it.
* **No Wrapper** (no worker announced one, ``inprocess.launch_events``): nothing survives a failure in place, so
  every failure is real, as under torchrun, even when the other workers ran to their end.
* **No worker completed**: the first failure is the job's status (a crash, a kill, a hard-timeout kill).
* Never a failure: a replacement refused because the job had completed (``JoinFailed``, closed: it came too late),
  and a worker the launcher ended itself (``by_launcher``: stopped for a start-up restart of the group, or excluded
  from the job and still running when the job completed); the launcher's own line says why.
* **The job gave up** (a worker's Wrapper announced ``gave_up``: it raised ``RestartAbort``): never 0, whatever the
  workers' codes, since training did not finish. The code of the first worker whose Wrapper gave up (1 for a script
  that lets ``RestartAbort`` out, as torchrun's own status for failed workers), or the first failure's if that
  worker exited 0, or 1.
* **A job without the Wrapper that the launcher restarted as a group** (``--max-restarts``): the ends of the
  groups before the last restart were healed by it; the status is the last group's. A job the launcher ended
  itself (``--max-restarts`` used up, a verdict after the last restart; a job mixing workers with and without the
  Wrapper) is never 0: its first failure's code, or 1 when only the launcher ended its workers.
* The launcher stopped by a signal (Ctrl+C, a scheduler's SIGTERM): ``128 + the signal``, as a shell reports a
  command a signal ended, whatever the workers did on the way out.

A failure's code is the worker's exit code, or ``128 + N`` for a worker that signal N ended (``-9`` from
``Popen.returncode`` is 137, as Slurm and the shell print it).
"""

from __future__ import annotations

import dataclasses
import signal


@dataclasses.dataclass(frozen=True)
class Exit:
    """One worker process's end."""

    local_rank: int
    pid: int
    returncode: int  # Popen's: negative for a signal
    time: float
    refused: bool = False  # a replacement the job turned away because it had completed
    completed: bool = False  # its Wrapper said the wrapped call completed (training finished)
    gave_up: bool = False  # its Wrapper gave up (``RestartAbort``): the job ended
    by_launcher: bool = False  # the launcher ended it itself (a start-up restart, excluded from the job)


def shell_code(returncode: int) -> int:
    """A returncode as a shell reports it: ``-N`` (signal N) is ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> str:
    """``exit code 3``, ``killed by SIGKILL``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


def job_status(
    exits: list[Exit],
    interrupted_by: int | None = None,
    wrapped: bool = True,
    gave_up: bool = False,
    ended: bool = False,
) -> int:
    """The launcher's exit status once every worker has exited (``wrapped``: the workers run under the Wrapper;
    ``gave_up``: a worker's Wrapper gave up; ``ended``: the launcher ended the job itself, which could not start,
    ran out of ``--max-restarts``, or mixed workers with and without the Wrapper: never 0)."""
    if interrupted_by is not None:
        return 128 + interrupted_by
    if gave_up:
        failure = gave_up_failure(exits)
        return 1 if failure is None else shell_code(failure.returncode)
    failure = first_real_failure(exits, wrapped)
    if failure is None:
        return 1 if ended else 0
    return shell_code(failure.returncode)


def gave_up_failure(exits: list[Exit]) -> Exit | None:
    """The exit whose code is the status of a job that gave up: the first non-zero one of a worker whose Wrapper
    gave up, else the first non-zero one (None: 1)."""
    ordered = [item for item in sorted(exits, key=lambda item: item.time) if item.returncode != 0 and not item.refused]
    return next((item for item in ordered if item.gave_up), next(iter(ordered), None))


def first_real_failure(exits: list[Exit], wrapped: bool = True) -> Exit | None:
    """The exit that ``job_status`` reports (None when the job completed its work)."""
    ordered = [item for item in sorted(exits, key=lambda item: item.time) if not item.refused]
    failures = [item for item in ordered if item.returncode != 0 and not item.by_launcher]
    if not wrapped:
        return next(iter(failures), None)
    final_world = [item for item in ordered if item.completed]
    if final_world:
        return next((item for item in final_world if item.returncode != 0), None)
    # Nothing completed: the first failure; one the launcher caused only if there is no other (the job did not
    # finish, so its status is not 0).
    return next(iter(failures), next((item for item in ordered if item.returncode != 0), None))
