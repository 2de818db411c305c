"""Whether a process that registered an endpoint file still runs: the staleness test of the endpoint files
(``torchras_formats.endpoint_files``). It lives apart from the format because it needs psutil, and the format's home
imports only the standard library; rasd's registry (``rasd.net.endpoints``) and ``rascli --list`` both pass it as
the format's ``alive``."""

from __future__ import annotations

import psutil

#: How much later than its endpoint's start a process may have been created and still be the same process.
PID_REUSE_SLACK = 2.0


def process_alive(pid: int, started: float) -> bool:
    """Whether ``pid`` still runs the process that registered an endpoint at ``started`` (wall clock).

    A process is gone only on evidence: psutil finds no such process (``NoSuchProcess``, ``ZombieProcess`` included),
    it is a zombie (exited, not yet reaped: it serves nothing), or it was created after ``started`` (the pid now
    belongs to a newer process). A process that exists but cannot be inspected (``AccessDenied``, or any other
    psutil or OS error) is alive. Mistaking a live process for a gone one costs far more than the reverse: its
    file is deleted for good (the process never writes it again), ``--list`` no longer shows its job, and another
    job may then take its port, which mixes two jobs on one port. Mistaking a gone one for a live one costs a row
    in ``--list`` and one port skipped, until the process can be inspected again."""
    if pid <= 0:
        return False  # no process that could register has such a pid (psutil refuses it)
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = process.create_time()
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True
    return created <= started + PID_REUSE_SLACK
