"""Fixed port ranges for tests that need a client port below Linux's ephemeral ports (32768 on), one range per
pytest-xdist worker: the suite runs in two workers (pyproject.toml), and two tests that took ports from the same
range at once would meet each other's jobs. Worker ``gwN`` shifts every range down by ``N × WORKER_SPAN``; without
xdist (``-n 0``) the ranges are as written. The shifted ranges stay clear of the default
client port's search range (28028-28043) and NCCL's moved port (28128): the suite's ranges start at 29300."""

from __future__ import annotations

import os

#: How far apart two workers' ranges are: more than any test file walks from its base.
WORKER_SPAN = 5000


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw1`` -> 1), 0 outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def shifted(port: int) -> int:
    """``port`` in this worker's range."""
    return port - WORKER_SPAN * worker_index()
