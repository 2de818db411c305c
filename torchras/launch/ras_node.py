"""A RAS node in every Python worker of ``rasd launch``, by default: how the worker's command line and environment
change for it.

A Python worker (a script, or ``-m module``) runs as ``python -u -m torchras.launch.worker_main [-m] PROGRAM
ARGS...`` instead of ``python -u [-m] PROGRAM ARGS...``: ``python -m rasd.run``'s way, the program unchanged
(``torchras.launch.worker_main``). Its first ``init_process_group`` starts the node; ``rascli -v`` answers from the
job's first step.

No node (the command torchrun would run, unchanged): ``--no-rasd``; ``TORCHRAS_ENABLE=0`` (or another off switch) in
the launcher's environment; ``--no-python`` (not a Python program); ``PYTHON_EXEC`` naming another interpreter (it
may not have torchras: one WARNING).

The verdict journal. A worker with a node keeps its verdict journal (``TORCHRAS_JOURNAL_DIR``): the user's folder
when set, else ``<log folder>/journal``, one per attempt of the group. The launcher reads it for the verdicts that
restart a job without the Wrapper (``torchras.launch.restarts``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence

from .args import Plan

log = logging.getLogger("torchras.launch")

MODULE = "torchras.launch.worker_main"
JOURNAL = "TORCHRAS_JOURNAL_DIR"


def _switched_off(environ: Mapping[str, str]) -> bool:
    return environ.get("TORCHRAS_ENABLE", "1").strip().lower() in ("0", "false", "no", "off")


def wanted(plan: Plan, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the workers get a RAS node from the launcher (one WARNING when the interpreter is not ours)."""
    if not plan.ras_node or _switched_off(environ):
        return False
    command = plan.command
    if len(command) < 2 or command[1] != "-u":  # --no-python: an executable, not python -u ...
        return False
    if command[0] != sys.executable:
        log.warning(
            "PYTHON_EXEC=%s is not the launcher's interpreter: the workers start no RAS node (rasd.install() in the "
            "script, or -m rasd.run, gives them one)",
            command[0],
        )
        return False
    return True


def command(plan_command: Sequence[str]) -> tuple[str, ...]:
    """``python -u [-m] PROGRAM ARGS`` -> ``python -u -m torchras.launch.worker_main [-m] PROGRAM ARGS``."""
    return (plan_command[0], "-u", "-m", MODULE, *plan_command[2:])


def journal_folder(environ: Mapping[str, str], attempt_folder: str) -> tuple[str, bool]:
    """The workers' journal folder and whether it is the launcher's own (the user did not choose one)."""
    chosen = environ.get(JOURNAL, "").strip()
    if chosen:
        return os.path.abspath(chosen), False
    return os.path.join(attempt_folder, "journal"), True
