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

The events' names, their records, the line format and the one writer (``announce``) are
``torchras_formats.launch_events``'s, which the launcher decodes them with and a plain worker's entry point writes
with too; this module is the Wrapper's name for them. The launcher names the file in ``TORCHRAS_LAUNCH_EVENTS`` (one
file per worker process). Without it (plain torchrun, a test) nothing is written, and nothing raises into training.
"""

from __future__ import annotations

from torchras_formats.launch_events import ENVIRONMENT as ENVIRONMENT, announce as announce
