"""The collective behind ``State.sync()``: agree on the most advanced rank, then broadcast its state from it.

Two steps over a process group (docs/elastic.md, section 2):

1. one ``all_reduce(MAX)`` of four int64 numbers per rank::

       [commits * world + (world - 1 - rank),  -commits,  lineage,  -lineage]

   The first maximum names the source: the most commits, the lowest rank among equals. The others give the
   fewest commits and the lowest lineage: when every rank holds the same commit count of the same lineage,
   every rank already holds the same state and nothing is broadcast (the common case of a restart where every
   survivor restored the same commit).
2. otherwise the source sends its live state: the skeleton (the tree with tensors replaced by slots, and every
   plain value) with ``broadcast_object_list``, then one flat buffer per dtype with ``broadcast``: a 100 MB model
   is one collective, not one per parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from . import snapshot


@dataclasses.dataclass(frozen=True)
class Agreement:
    source: int  # rank in the group
    broadcast: bool
    serial: int
    lineage: int


def agree_and_broadcast(
    group: Any, serial: int, lineage: int, capture: Callable[[], Any], receive: Callable[[Any], None]
) -> Agreement:
    """Run the two steps; ``capture()`` gives the live tree on the source, ``receive(tree)`` loads it elsewhere."""
    if not (dist.is_available() and dist.is_initialized()):
        return Agreement(0, False, serial, lineage)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1:
        return Agreement(rank, False, serial, lineage)
    device = communication_device(group)
    numbers = torch.tensor(
        [serial * world + (world - 1 - rank), -serial, lineage, -lineage], dtype=torch.int64, device=device
    )
    dist.all_reduce(numbers, op=dist.ReduceOp.MAX, group=group)
    best, fewest, highest_lineage, lowest_lineage = (int(value) for value in numbers.tolist())
    source = world - 1 - best % world
    most = best // world
    if most == -fewest and highest_lineage == -lowest_lineage:
        return Agreement(source, False, serial, lineage)
    source_global = source if group is None else dist.get_global_rank(group, source)
    if rank == source:
        skeleton, tensors = snapshot.split_tree(capture())
        header: list[Any] = [skeleton, serial, lineage]
    else:
        tensors = {}
        header = [None, None, None]
    dist.broadcast_object_list(header, src=source_global, group=group, device=device)
    skeleton, source_serial, source_lineage = header
    buffers = {}
    for name, size in sorted(snapshot.buffer_sizes(skeleton).items()):
        if rank == source:
            flat = snapshot.flatten(tensors[name], device)
        else:
            flat = torch.empty(size, dtype=snapshot.dtype_named(name), device=device)
        if size:
            dist.broadcast(flat, src=source_global, group=group)
        buffers[name] = flat
    if rank != source:
        receive(snapshot.join_tree(skeleton, buffers))
    return Agreement(source, True, int(source_serial), int(source_lineage))


def communication_device(group: Any) -> torch.device:
    """Where the collectives' tensors live: the current CUDA device for NCCL, the CPU otherwise."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
