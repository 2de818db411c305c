"""The ``Restarts`` section of the text report (ours; docs/protocol.md section 3.5).

Printed between the communicator table and ``Errors``, and only once some process of the job has restarted in
place, so the report of a job that never restarted is NCCL's layout unchanged. A restart is what the job did about a
fault, not a fault: it is neither an error nor a warning, and a job that recovered reports healthy::

    Restarts
    ========

      Iteration 5 after 2 restarts
      Last restart: PEER_DEAD of rank 2 (pid 4242); rank 2 terminated, 0.412s lost
      1 job process is at an older iteration
      Process 1003 on node 10.0.0.1 managing GPU 3 at iteration 4

The last two lines appear only when some process reports an older iteration than the job's.
"""

from __future__ import annotations

from .outliers import is_outlier
from .restarts import RestartSummary
from .text_lines import unknown_processes_line

HEADER = "\nRestarts\n========\n\n"


def render_restarts(summary: RestartSummary | None, verbose: bool) -> str:
    """The whole section, header included; empty when no process has restarted."""
    if summary is None:
        return ""
    last = summary.last
    noun = "restart" if summary.restarts == 1 else "restarts"
    cause = " ".join(last.cause.split())  # one line, whatever a peer sent
    out = [
        HEADER,
        f"  Iteration {summary.iteration} after {summary.restarts} {noun}\n",
        f"  Last restart: {cause + '; ' if cause else ''}{last.outcome()}\n",
    ]
    count = summary.behind_count
    if count:
        out.append(f"  {count} job process{' is' if count == 1 else 'es are'} at an older iteration\n")
        if is_outlier(count, verbose, summary.reporting):
            out += [f"  {peer.describe()} at iteration {iteration}\n" for peer, iteration in summary.behind]
            if count > len(summary.behind):
                out.append(unknown_processes_line(count - len(summary.behind)))
    return "".join(out)
