"""Point-to-point byte exchanges between the ranks of a process group, each wait bounded by a deadline.

What a sharded commit uses to hand each blob to its guards, and a restore to fetch the parts of blobs a rank needs
from the ranks that hold them. Every receive and send is posted before any is waited for (``irecv``/``isend``),
so no order of the pairs can deadlock; the messages are CPU ``uint8`` tensors (gloo; a job on NCCL passes a
gloo group of its own, ``ShardedState(group=...)``).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist


class ExchangeTimeout(TimeoutError):
    """A peer did not complete its part of an exchange before the deadline."""


def swap(
    sends: Mapping[int, torch.Tensor],
    receives: Mapping[int, int],
    timeout: float,
    group: Any = None,
    into: Mapping[int, torch.Tensor] | None = None,
) -> dict[int, torch.Tensor]:
    """Send ``sends[rank]`` to each rank and receive ``receives[rank]`` bytes from each (ranks of ``group``), into
    ``into[rank]`` where given (uint8, that size), else into fresh memory; return what was received. Every rank of
    the group calls it with matching sizes; empty messages are skipped."""
    received: dict[int, torch.Tensor] = {}
    works: list[dist.Work] = []
    for source, size in sorted(receives.items()):
        buffer = into[source] if into is not None and source in into else torch.empty(size, dtype=torch.uint8)
        received[source] = buffer
        if size:
            works.append(_posted(dist.irecv(buffer, src=_global(group, source), group=group)))
    for destination, tensor in sorted(sends.items()):
        if tensor.numel():
            works.append(_posted(dist.isend(tensor.contiguous(), dst=_global(group, destination), group=group)))
    deadline = time.monotonic() + timeout
    for work in works:
        left = deadline - time.monotonic()
        if left <= 0 or not work.wait(timeout=datetime.timedelta(seconds=left)):
            raise ExchangeTimeout(f"a peer did not complete a state exchange within {timeout:.0f} s")
    return received


def _posted(work: dist.Work | None) -> dist.Work:
    if work is None:  # torch returns None to a rank outside the group: a caller's mistake
        raise ValueError("this rank is not in the exchange's process group")
    return work


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
