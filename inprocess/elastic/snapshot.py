"""Copies of nested training state (dicts, lists and tuples whose leaves are tensors or plain Python values).

Pure functions, no torch.distributed: what ``commit``, ``restore`` and ``sync`` (docs/elastic.md, section 2) need
to copy a state tree, and to flatten its tensors into one buffer per dtype for a broadcast.

Why reuse buffers: a commit of a 100 MB model allocating 100 MB each time pays for fresh pages on every call
(page faults, zeroing); copying into the spare buffer of the previous commit is a plain memcpy. The caller
(``inprocess.elastic.state``) keeps two buffers and swaps them only once a copy is complete, so a fault in the
middle of a copy only ever damages the spare one.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch


def copy_tree(live: Any, reuse: Any = None) -> Any:
    """A deep copy of ``live`` whose tensors sit in host memory; tensors of ``reuse`` with the same place in the
    tree, shape and dtype are overwritten instead of allocated. Other leaves are deep-copied."""
    if isinstance(live, torch.Tensor):
        source = live.detach()
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.shape == source.shape
            and reuse.dtype == source.dtype
            and reuse.device.type == "cpu"
            and reuse.is_contiguous()
        ):
            reuse.copy_(source)
            return reuse
        target = torch.empty(source.shape, dtype=source.dtype, device="cpu")
        target.copy_(source)
        return target
    if isinstance(live, dict):
        previous = reuse if isinstance(reuse, dict) else {}
        result = _new_mapping(live)
        for key, value in live.items():
            result[key] = copy_tree(value, previous.get(key))
        return result
    if isinstance(live, (list, tuple)):
        earlier_items = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(live) else [None] * len(live)
        items = [copy_tree(value, earlier) for value, earlier in zip(live, earlier_items, strict=True)]
        return items if isinstance(live, list) else _new_sequence(live, items)
    return copy.deepcopy(live)


def clone_tree(tree: Any) -> Any:
    """A copy of ``tree`` that shares no tensor and no mutable leaf with it (what a restore hands to the live
    objects: ``Optimizer.load_state_dict`` keeps the tensors it is given, so they must not be the committed ones)."""
    return copy_tree(tree)


@dataclasses.dataclass(frozen=True)
class TensorSlot:
    """Stands for a tensor in the skeleton of a tree: its place in the flat buffer of its dtype."""

    dtype: str
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


def split_tree(tree: Any) -> tuple[Any, dict[str, list[torch.Tensor]]]:
    """The skeleton of ``tree`` (tensors replaced by ``TensorSlot``, picklable, small) and its tensors grouped by
    dtype name, in traversal order (each dtype's tensors concatenated form that dtype's flat buffer)."""
    groups: dict[str, list[torch.Tensor]] = {}
    offsets: dict[str, int] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            name = str(node.dtype).removeprefix("torch.")
            offset = offsets.get(name, 0)
            groups.setdefault(name, []).append(node.detach())
            offsets[name] = offset + node.numel()
            return TensorSlot(name, offset, tuple(node.shape))
        if isinstance(node, dict):
            result = _new_mapping(node)
            for key, value in node.items():
                result[key] = walk(value)
            return result
        if isinstance(node, (list, tuple)):
            items = [walk(value) for value in node]
            return items if isinstance(node, list) else _new_sequence(node, items)
        return node

    return walk(tree), groups


def buffer_sizes(skeleton: Any) -> dict[str, int]:
    """Elements per dtype that the flat buffers of ``skeleton`` hold."""
    sizes: dict[str, int] = {}
    for slot in _slots(skeleton):
        sizes[slot.dtype] = max(sizes.get(slot.dtype, 0), slot.offset + slot.numel)
    return sizes


def flatten(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """One contiguous buffer on ``device`` holding ``tensors`` one after the other."""
    if not tensors:
        raise ValueError("nothing to flatten")
    return torch.cat([tensor.reshape(-1).to(device) for tensor in tensors])


def join_tree(skeleton: Any, buffers: dict[str, torch.Tensor]) -> Any:
    """The tree of ``skeleton`` with each slot replaced by its view of the flat buffer of its dtype."""
    if isinstance(skeleton, TensorSlot):
        flat = buffers[skeleton.dtype]
        return flat[skeleton.offset : skeleton.offset + skeleton.numel].view(skeleton.shape)
    if isinstance(skeleton, dict):
        result = _new_mapping(skeleton)
        for key, value in skeleton.items():
            result[key] = join_tree(value, buffers)
        return result
    if isinstance(skeleton, (list, tuple)):
        items = [join_tree(value, buffers) for value in skeleton]
        return items if isinstance(skeleton, list) else _new_sequence(skeleton, items)
    return skeleton


def dtype_named(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _slots(skeleton: Any) -> list[TensorSlot]:
    if isinstance(skeleton, TensorSlot):
        return [skeleton]
    if isinstance(skeleton, dict):
        return [slot for value in skeleton.values() for slot in _slots(value)]
    if isinstance(skeleton, (list, tuple)):
        return [slot for value in skeleton for slot in _slots(value)]
    return []


def _new_mapping(template: dict) -> dict:
    """An empty mapping of the template's type; keeps ``_metadata`` (module versions that ``load_state_dict``
    of some modules, e.g. batch norm, reads)."""
    try:
        result = type(template)()
    except TypeError:
        result = {}
    metadata: Any | None = getattr(template, "_metadata", None)
    if metadata is not None:
        try:
            result._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return result


def _new_sequence(template: tuple, items: list) -> tuple:
    if hasattr(template, "_fields"):  # a named tuple
        return type(template)(*items)
    return tuple(items)
