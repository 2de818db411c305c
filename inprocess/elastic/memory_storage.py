"""``torch.distributed.checkpoint`` storage in host memory: what a sharded commit writes and a restore reads.

DCP plans who writes what (each rank its own shards of DTensors, one rank each replicated tensor or object) and,
on load, what each rank of any world reads (the overlaps of its new shards with the saved chunks): that is torch's
resharding, used as it is. Only the storage is ours:

* ``BlobWriter`` lays the items a rank is told to write into one byte buffer (its *blob*, a ``SharedBlob`` that
  the other ranks of its machine can map: ``shared_memory``), each item aligned so that it can be viewed as its
  dtype in place; the location of each item (``Location``: owner rank, offset, size,
  dtype, shape) goes into the checkpoint's metadata, which ``dcp.save`` returns on every rank;
* ``BlobReader`` serves a load from bytes already in this process (this rank's blobs, and the parts of other
  ranks' blobs fetched for it before the load: ``inprocess.elastic.sharded``), with no collective of its own.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import placement
from .shared_memory import SharedBlob


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one saved item lies: in the blob of ``owner`` (a rank of the commit's world), ``size`` bytes from
    ``offset``; a tensor of ``dtype`` and ``shape``, or pickled bytes (``dtype`` None)."""

    owner: int
    offset: int
    size: int
    dtype: str | None
    shape: tuple[int, ...] = ()

    def view(self, raw: torch.Tensor) -> torch.Tensor:
        """The tensor that ``raw`` (this item's bytes, aligned) holds."""
        assert self.dtype is not None
        dtype = getattr(torch, self.dtype)
        return raw.view(dtype).view(self.shape)


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class BlobWriter(StorageWriter):
    """Writes a rank's items into one fresh byte buffer, ``blob`` (never into an earlier commit's: a commit cut
    half-way leaves the committed blobs whole)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.blob = SharedBlob(0)

    def reset(self, checkpoint_id: Any = None) -> None:
        self.blob = SharedBlob(0)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        resolved: list[tuple[Any, torch.Tensor, str | None]] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                resolved.append((item, torch.frombuffer(bytearray(data.getvalue()), dtype=torch.uint8), None))
            else:
                assert isinstance(data, torch.Tensor)
                tensor = data.detach()
                resolved.append((item, tensor, str(tensor.dtype).removeprefix("torch.")))
        sizes = [tensor.numel() * tensor.element_size() for _, tensor, _ in resolved]
        offsets, total = placement.layout(sizes)
        blob = SharedBlob(total)
        for (_, tensor, _), offset in zip(resolved, offsets, strict=True):
            blob.write(offset, tensor)
        blob.seal()  # written once: its bytes never change again (shared_memory)
        results = []
        for (item, tensor, dtype), offset, size in zip(resolved, offsets, sizes, strict=True):
            location = Location(self.rank, offset, size, dtype, tuple(tensor.shape) if dtype is not None else ())
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=location))
        self.blob = blob
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {result.index: result.storage_data for rank in results for result in rank}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class BlobReader(StorageReader):
    """Serves ``dcp.load`` from ``items``: for each owner and offset in a blob, the item's bytes (aligned)."""

    def __init__(self, metadata: Metadata, items: Mapping[tuple[int, int], torch.Tensor]) -> None:
        super().__init__()
        self.metadata = metadata
        self.items = items

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        storage = self.metadata.storage_data
        for item in plan.items:
            location: Location = storage[item.storage_index]
            raw = self.items[(location.owner, location.offset)]
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(raw.numpy().tobytes()))
                continue
            source = narrowed(location.view(raw), item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            target.copy_(source)
            planner.commit_tensor(item, target)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


def narrowed(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    """The part of ``tensor`` that starts at ``offsets`` and spans ``lengths``, dimension by dimension."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        tensor = tensor.narrow(dim, offset, length)
    return tensor


def needed(plan: LoadPlan, metadata: Metadata) -> list[Location]:
    """The saved items (their locations, each once) that a load plan reads."""
    seen: dict[tuple[int, int], Location] = {}
    for item in plan.items:
        location = metadata.storage_data[item.storage_index]
        seen.setdefault((location.owner, location.offset), location)
    return list(seen.values())


__all__ = ["BlobReader", "BlobWriter", "Location", "narrowed", "needed"]
