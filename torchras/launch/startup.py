"""A worker lost before the job's first round: the group restarts, so that the job starts at full size.

Why not a replacement. A replacement joins a *running* job: it finds the Wrapper's running call in the store and
waits to be admitted at a round of the others. Before the first round there is nothing to join: the initial ranks
wait in the Wrapper's start-up barrier (or in ``init_process_group``) for every rank of the world the launcher
decided, the dead one included, and nobody would ever admit a newcomer. A fresh process in the dead one's own rank is
not safe either: the dead one may already have taken its place in the store (its call number, its barrier
arrival), which the fresh one would take a second time. So the launcher does what torchrun does for every failure,
but only here, where it costs nothing (no step was trained, no state is lost): it stops every worker of the node,
ends what they left (monitor processes, the Wrapper's store server: ``torchras.launch.reaper``), and starts the
whole group again with ``TORCHELASTIC_RESTART_COUNT`` one higher, so that the new group's Wrapper works in store
namespaces of its own (``inprocess.store.launch_attempt``).

When the job has started. A worker's Wrapper announces ``wrapper`` once it has passed its start-up barrier, that
is once every initial rank of the world has reached it (``inprocess.launch_events``). From then on a lost worker is
a fault of a running job: the Wrapper restarts the survivors and the launcher respawns the dead one as a newcomer
(``torchras.launch.workers``).

Which jobs. Only a job whose workers run ``inprocess.Wrapper`` (a worker announced ``wrapper_starting``, as the
Wrapper does when its call starts, before its barrier) on one node, with respawns on (``--max-respawns`` > 0). A plain
script keeps torchrun's ``--max-restarts 0`` semantics (the others go on: the script's own lookout); on several
nodes one launcher cannot restart the other nodes' workers, so a start-up loss there is not healed (docs).

A worker stuck at start-up. Before the job's first round no RAS node watches a worker, and the others wait for it
in the Wrapper's start-up barrier until its timeout (120 s). So the launcher kills (``stuck``) a worker stopped by a
signal (SIGSTOP, the state ``T``; not a debugger's tracing stop) for ``STOPPED_S``, and one that is idle (no CPU time,
no byte read or written, ``IDLE_S``) while another worker already waits in the barrier: its loss is then a start-up
loss like any other. From the first round on, such a worker is the mesh's (PEER_HUNG for a stopped one, COMM_STUCK
for an idle one: the Wrapper restarts without it, and the launcher replaces it).

Waiting for the verdict. A worker killed while it imports torch dies before any worker has said whether it runs the
Wrapper. The launcher then waits, at most ``VERDICT_S`` seconds, for another worker of the node to say so; it
decides at once when the others have all ended (nobody is left to say it). The verdict ``classify`` returns:

=============================================================  ==========================
what the launcher knows when a worker is lost (non-zero end)    verdict
=============================================================  ==========================
the job has started, or the loss is not eligible (above)       ``NOT_STARTUP``: the usual rules
a worker said it builds an inprocess.Wrapper                   ``RESTART``: the group restarts
nobody said so yet, others still run, before the deadline      ``WAIT``
nobody said so, and the others have ended or the deadline      ``PLAIN``: the usual rules (a plain script)
=============================================================  ==========================

The group restarts at most ``--max-respawns`` times in a job (the same bound as a local rank's respawns), after the
same back-off; past that the job cannot start at full size, and the launcher stops it with that cause.
"""

from __future__ import annotations

import enum
import os

#: How long the launcher waits for the workers to say whether they run inprocess.Wrapper after a start-up loss.
VERDICT_S = float(os.environ.get("TORCHRAS_LAUNCH_STARTUP_VERDICT_S", "60"))
#: A worker stopped (SIGSTOP) this long before the job's first round is killed, which makes it a start-up loss: it
#: has no RAS node yet for the mesh to find it hung (the mesh's hang limit is as long), and the others would wait
#: for it in the Wrapper's start-up barrier until its timeout (120 s), then fail.
STOPPED_S = 10.0
#: A worker that has not reached the start-up barrier, and has used no CPU time and read or written no byte (files,
#: pipes, sockets) for this long while another worker waits in the barrier, is stuck: killed, a start-up loss. A
#: worker that imports, loads, downloads or computes moves one of those; one blocked idle in a call (a sleep, a
#: lock, a read that gets nothing) moves none, as the mesh's idle rule reads a rank behind (docs/architecture.md 4.2).
IDLE_S = float(os.environ.get("TORCHRAS_LAUNCH_STARTUP_IDLE_S", "30"))


def stuck(*, stopped_for: float, idle_for: float, others_wait: bool) -> str | None:
    """Why a worker that has not reached the Wrapper's start-up barrier is stuck there, or None."""
    if stopped_for >= STOPPED_S:
        return f"has been stopped (SIGSTOP) for {stopped_for:.0f} s"
    if others_wait and idle_for >= IDLE_S:
        return (
            f"has used no CPU and read or written nothing for {idle_for:.0f} s while the others wait for it in the "
            "Wrapper's start-up barrier"
        )
    return None


class Verdict(enum.Enum):
    NOT_STARTUP = "not a start-up loss"
    RESTART = "restart the group"
    WAIT = "wait for the workers to say whether they run the Wrapper"
    PLAIN = "a plain script: the usual rules"


def eligible(*, started: bool, nnodes: int, max_respawns: int, newcomer: bool, ending: bool) -> bool:
    """Whether a lost worker may be a start-up loss at all: the job has not started, one node, respawns on, an
    initial member (not a replacement), the launcher not stopping or ending the job."""
    return not started and nnodes == 1 and max_respawns > 0 and not newcomer and not ending


def classify(*, wrapper_built: bool, others_alive: bool, deadline_passed: bool) -> Verdict:
    """The table of this module's docstring, for an eligible loss."""
    if wrapper_built:
        return Verdict.RESTART
    if others_alive and not deadline_passed:
        return Verdict.WAIT
    return Verdict.PLAIN
