"""What a worker tells the launcher that started it: a few JSON lines in a file the launcher reads.

Why a channel at all. A launcher sees its workers from outside: pids, exit codes, output. What it needs that
only the Wrapper knows:

* that the worker runs the Wrapper at all, before the job's first round (``wrapper_starting``, before the start-up
  barrier) and once every initial rank met (``wrapper``): a worker lost before that restarts the group
  (``torchras.launch.startup``);
* which iteration the worker runs, with which world size (``iteration``): the launcher's "trains at N rank(s)" line,
  and, on one node, a worker still running that the job's world goes on without (a hung worker it excluded);
* whether a replacement could be admitted at all: only a Wrapper with joining (``inprocess.elastic.Joining``) takes
  a process that starts later, so ``rasd launch`` respawns a dead worker only once one of its workers said so;
* when a replacement was admitted, with which rank, into which world: the launcher's "joined" line;
* that a replacement was refused because the job had completed (``JoinFailed``, closed): its exit is the end of the
  job, not a failure to respawn again;
* that the Wrapper gave up (``gave_up``, with its ``reason``: an ``initialize`` raised ``RestartAbort``, as
  ``RetryController`` does, or ``rasd demo``'s check for a fault that repeats): a replacement would meet what the
  restarts met, so the job ends: ``rasd launch`` respawns no worker any more, lets the others end, says why the job
  gave up and exits non-zero (``torchras.launch.workers``).

The events' names, their records and the line format are ``torchras_formats.launch_events``, which the launcher
decodes them with; this module writes them. The launcher names the file in ``TORCHRAS_LAUNCH_EVENTS`` (one file per
worker process). Without it (plain torchrun, a test) nothing is written. A line is written whole with one ``write``
of a file opened for appending, and nothing here raises into training: a full disk or a removed folder costs the
launcher its lines, not the job its step.
"""

from __future__ import annotations

import logging
import os
import time

from torchras_formats.launch_events import ENVIRONMENT as ENVIRONMENT, Record, encode

log = logging.getLogger(__name__)


def announce(record: Record) -> None:
    """Append ``record``'s line to the launcher's file, if a launcher asked for one."""
    path = os.environ.get(ENVIRONMENT)
    if not path:
        return
    try:
        line = encode(record, time.time(), os.getpid())
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
    except Exception as error:  # noqa: BLE001 - the launcher's lines are a courtesy, never a reason to stop training
        log.debug("could not tell the launcher about %s: %s", record.EVENT.value, error)
