"""Python's cyclic collector paused around one burst of short-lived objects on the RAS thread.

A STATUS report at the root makes an object per communicator and per host, and temporaries per process: about
700,000 allocations at 100,000 processes (bench/report_cost.py). With the collector on, that burst sets off full
collections of the whole process's heap, the training's objects included, on the RAS thread and holding the GIL:
in the benchmark's heap two of them during one report, 0.1 to 0.2 s each, and more in a training process whose heap
holds torch's objects. Paused for the burst, the report's objects are freed by reference counting as it ends and
never reach the old generation; the collector's counts carry over, so whatever collection was due runs at the next
allocation after it resumes (docs/architecture.md §11).

Two bursts are paused: the client port's building and rendering of a report, and the node's handling of what a
mesh connection brings (``runtime._MeshProtocol``), where the root of a STATUS decodes a leg's fold of tens of
thousands of processes at once (0.48 s with the collector on at 100,000 processes, 0.26 s paused).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the collector for the ``with`` block, if it runs; never turn on a collector the training turned off."""
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
