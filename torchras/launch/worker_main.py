"""What runs first inside every Python worker of ``rasd launch``: ``python -u -m torchras.launch.worker_main [-m]
PROGRAM ARGS...``, which is ``python -m rasd.run`` plus two notes for the launcher.

The RAS node. The program runs as ``python -m rasd.run`` runs it (``rasd.run``): unchanged, as ``__main__``, with
torch.distributed hooked once it imports torch, so its first ``init_process_group`` starts this process's RAS node.
Children (a data loader's workers, forked or spawned) start none, and a program that calls ``rasd.install()`` itself
gets the same node. The launcher does not start this module where the node is off (``TORCHRAS_ENABLE=0``,
``--no-rasd``) or the worker is not Python (``--no-python``).

The notes, through the launcher's events file (``TORCHRAS_LAUNCH_EVENTS``, the file ``inprocess.launch_events``
writes to; the lines are ``torchras_formats.launch_events``'s):

* ``process_group_starting``, as the first ``init_process_group`` of the process is called, and ``process_group``
  once it returns: the launcher learns that the worker trains, and, when its Wrapper did not say
  ``wrapper_starting`` before, that it trains without ``inprocess.Wrapper`` (a job to restart as a group,
  ``torchras.launch.restarts``). The first note matters for a job that mixes both: its Wrapper's ranks wait at
  their start-up barrier and its plain ranks inside ``init_process_group`` for each other, so no first call ever
  returns, and the launcher refuses the job on the notes of the calls;
* after a group restart (``TORCHRAS_LAUNCH_RESTART``, set by the launcher for the new group: the cause, the ranks,
  when), ``rasd.record_restart`` once the node runs: the node emits a RESTART event to its MONITOR clients, writes a
  ``restart`` record into its verdict journal and counts ``torchras_restarts_total``, with the verdict (or the exit)
  that caused the restart. The launcher has no node of its own, so the new group's nodes say it for it.

Nothing here raises into the program: a note that cannot be written is a debug line.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from typing import Any

from rasd import run as rasd_run
from torchras_formats.launch_events import ProcessGroup, ProcessGroupStarting, announce

log = logging.getLogger("torchras.launch")

RESTART = "TORCHRAS_LAUNCH_RESTART"


def restart_note(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, Any] | None:
    """The launcher's ``TORCHRAS_LAUNCH_RESTART``: ``{"attempt", "cause", "ranks", "at"}``, or None."""
    raw = environ.get(RESTART)
    if not raw:
        return None
    try:
        note = json.loads(raw)
        return note if isinstance(note, dict) else None
    except ValueError:
        return None


def _after_first_init() -> None:
    """The first ``init_process_group`` returned: tell the launcher, and record the group restart, if any."""
    try:
        import torch.distributed as dist

        announce(ProcessGroup(rank=dist.get_rank(), world_size=dist.get_world_size()))
        note = restart_note()
        if note is not None:
            import rasd

            seconds = max(0.0, time.time() - float(note.get("at", time.time())))
            ranks = [int(rank) for rank in note.get("ranks", [])]
            rasd.record_restart(int(note.get("attempt", 1)), str(note.get("cause", "a group restart")), ranks, seconds)
    except Exception:  # never into training
        log.debug("could not note the first process group", exc_info=True)


def watch_first_init() -> None:
    """Wrap the (hooked) ``init_process_group`` so that its first successful return calls ``_after_first_init``."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    hooked = c10d.init_process_group
    done = False

    @functools.wraps(hooked)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        if not done:
            announce(ProcessGroupStarting())
        result = hooked(*args, **kwargs)
        if not done:
            done = True
            _after_first_init()
        return result

    for module in (dist, c10d):
        if getattr(module, "init_process_group", None) is hooked:
            setattr(module, "init_process_group", init_process_group)  # noqa: B010 - torch's stubs hide it


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv == ["-m"]:
        print("usage: python -m torchras.launch.worker_main [-m] PROGRAM [ARGS...]", file=sys.stderr)
        sys.exit(2)
    rasd_run.run(argv, lazy=True, then=watch_first_init)


if __name__ == "__main__":
    main()
