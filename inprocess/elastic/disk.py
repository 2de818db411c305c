"""The disk path of a sharded state: ``torch.distributed.checkpoint`` on a filesystem every rank sees.

A sharded commit in memory survives the loss of up to k ranks (``ShardedState(redundancy=k)``); losing more
loses blobs no survivor holds. For that case ``ShardedState(checkpoint_dir=..., checkpoint_every=M)`` also saves
every M-th commit with ``dcp.save`` (each rank its own shards) into ``<dir>/commit-<count>``, and a restore that
finds the memory incomplete loads the newest checkpoint every rank sees, resharded by DCP to the world that trains
on. A checkpoint is complete once its ``.metadata`` file exists (DCP's coordinator writes it last); a save cut by a
fault leaves a folder without it, which is never loaded and is removed by a later save.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

log = logging.getLogger(__name__)

_NAME = re.compile(r"^commit-(\d{9})$")


class DiskCheckpoints:
    """Every ``every``-th commit of a sharded state on disk under ``directory``; the newest ``keep`` are kept."""

    def __init__(self, directory: str | os.PathLike, every: int, keep: int = 2) -> None:
        if every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        self.directory = Path(directory)
        self.every = every
        self.keep = max(1, keep)

    def due(self, commits: int) -> bool:
        return commits > 0 and commits % self.every == 0

    def path(self, commits: int) -> Path:
        return self.directory / f"commit-{commits:09d}"

    def save(self, state_dict: dict[str, Any], commits: int, group: Any = None) -> None:
        """``dcp.save`` of ``state_dict`` as commit ``commits``. Collective over ``group``."""
        path = self.path(commits)
        dcp.save(state_dict, checkpoint_id=path, process_group=group)
        if dist.get_rank(group) == 0:
            self._prune(commits)

    def latest(self) -> int | None:
        """The commit count of the newest complete checkpoint, or None."""
        complete = [count for count, path in self._folders() if (path / ".metadata").is_file()]
        return max(complete, default=None)

    def load(self, state_dict: dict[str, Any], commits: int, group: Any = None) -> None:
        """``dcp.load`` of checkpoint ``commits`` into ``state_dict`` (in place, resharded). Collective."""
        dcp.load(state_dict, checkpoint_id=self.path(commits), process_group=group)

    def _folders(self) -> list[tuple[int, Path]]:
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match and path.is_dir():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def _prune(self, newest: int) -> None:
        complete = [count for count, path in self._folders() if (path / ".metadata").is_file()]
        kept = set(sorted(complete)[-self.keep :]) | {newest}
        for count, path in self._folders():
            if count not in kept and count < newest:
                shutil.rmtree(path, ignore_errors=True)
                log.debug("removed the older checkpoint %s", path)
