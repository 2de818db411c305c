"""Busy is not hung: the evidence that holds the Wrapper's soft and hard timeouts while a rank works.

nvidia-resiliency-ext's soft timeout restarts every rank after 60 s without a progress stamp, and its hard timeout
kills the rank at 90 s: a checkpoint of two minutes that does not ping is restarted halfway, at every checkpoint.
The rasd mesh tells a rank that works (its process's CPU or I/O moving, measured by the RAS node twice a second)
from one idle in a call (docs/architecture.md §4.2). The Wrapper's timeouts use the same evidence, through
``rasd.work_state()``:

* **working**: this process worked within ``WORKING_WINDOW`` (or four of the node's measurements, where they are
  further apart): rank 0 writing the checkpoint;
* **waiting for a working peer**: its rank is among the ranks inside the operation of a communicator the mesh holds
  SLOW: the other ranks, idle in ``dist.barrier()`` while rank 0 writes. By the verdict's global ranks and the
  rank the process's node was started with: after a restart that renumbered the ranks (a shrunk world), a rank
  whose number changed is not recognised, and its timeouts are the reference's.

Either postpones the soft and hard timeouts, for at most the busy limit (``TORCHRAS_BUSY_LIMIT``, 300 s) without a
progress stamp; the monitor process applies it (``inprocess.monitor_process``). A rank idle in a call with neither
(a sleep, a lock, a read that moves no bytes) times out exactly as before, a little later (the window). Without a
RAS node (``TORCHRAS_ENABLE=0``) there is no evidence, and the timeouts are the reference's.

The progress watchdog's thread reads it (``current``) at most every ``EVERY`` seconds and sends it with its stamps
as a deadline, ``until``: the evidence holds until then unless renewed, so a trainer that stops sending it (its
main thread holding the GIL in C, the watchdog itself stuck) loses the postponement by itself.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

#: A process that worked this recently is working: a few of the node's half-second measurements, so that a
#: window of little work between two busy ones (a checkpoint's serialisation between two writes) is no pause.
WORKING_WINDOW = 2.0
#: How often the watchdog reads the evidence (its own interval may be a millisecond: each read costs CPU, which
#: the node would count as this process's work).
EVERY = 0.25
#: Slack on the evidence's deadline for a watchdog turn that comes late on a loaded machine.
SLACK = 2.0

WORKING = "working"
WAITING = "waiting"


@dataclasses.dataclass(frozen=True)
class Excuse:
    """Why this rank's timeouts wait: ``WORKING`` or ``WAITING``; and the busy limit that bounds it, in seconds."""

    why: str
    busy_limit: float


def judge(state: Any) -> Excuse | None:
    """The excuse a ``rasd.WorkState`` (or None: no RAS node) gives; None when it gives none."""
    if state is None:
        return None
    window = max(WORKING_WINDOW, 4 * float(state.interval))
    if state.idle is not None and state.idle <= window:
        return Excuse(WORKING, float(state.busy_limit))
    if state.slow:
        return Excuse(WAITING, float(state.busy_limit))
    return None


def current() -> Excuse | None:
    """This process's excuse now: None without rasd loaded (the Wrapper never imports it for this) or a node.
    Never raises."""
    rasd = sys.modules.get("rasd")
    read = getattr(rasd, "work_state", None) if rasd is not None else None
    if read is None:
        return None
    try:
        return judge(read())
    except Exception:  # noqa: BLE001 - evidence, never a reason to fail the watchdog
        return None


def describe(why: str, rank: int) -> str:
    """The sentence of the monitor's INFO line: why rank ``rank``'s timeouts wait."""
    if why == WAITING:
        return (
            f"rank {rank} waits in a collective for a peer that works (the mesh holds the communicator SLOW), not hung"
        )
    return f"rank {rank}'s process is working (CPU or I/O), not hung"
