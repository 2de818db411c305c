"""Joining a job through a key-value store: the job's secret, and a seed or two to connect to.

Any object with torch.distributed.Store's ``set``/``get``/``add``/``wait`` works (a TCPStore, ``FileStore`` below).
Each process does at most eight store operations, so the whole job does O(N), never O(N²):

* **secret**: ``add(claim)``; the process that gets 1 draws a random secret and ``set``s it, the others ``wait``
  and ``get`` it. ``TORCHRAS_SECRET`` in the environment skips the store.
* **seeds**: ``add(joined)`` gives the process a join index i (1, 2, ...); it ``set``s its own peer entry under
  ``peer/i`` and reads the entries of processes ``i // 2`` and ``i - 1``. Connecting to them puts it in the mesh,
  and gossip brings it the rest of the table, while the join indices form a tree that spreads the load.

Keys live under ``torchras/<attempt>/`` where the attempt is torchrun's restart count, so a restarted job never
reads the previous attempt's entries.
"""

from __future__ import annotations

import datetime
import fcntl
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from rasd.core import wire
from rasd.core.peers import PeerInfo

log = logging.getLogger("rasd")


def default_prefix() -> str:
    return f"torchras/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


class StoreBootstrap:
    def __init__(self, store: Any, prefix: str | None = None, timeout: float = 120.0) -> None:
        self.store = store
        self.prefix = prefix or default_prefix()
        self.timeout = timeout

    def _wait_get(self, key: str) -> bytes:
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.timeout))
        except TypeError:
            self.store.wait([key])
        value = self.store.get(key)
        return value.encode() if isinstance(value, str) else bytes(value)

    def secret(self) -> bytes:
        env = os.environ.get("TORCHRAS_SECRET")
        if env:
            return env.encode()
        key = f"{self.prefix}/secret"
        if self.store.add(f"{self.prefix}/secret_claim", 1) == 1:
            value = secrets.token_hex(32).encode()
            self.store.set(key, value)
            return value
        return self._wait_get(key)

    def seeds(self, me: PeerInfo) -> list[PeerInfo]:
        index = self.store.add(f"{self.prefix}/joined", 1)
        self.store.set(f"{self.prefix}/peer/{index}", wire.encode_peer(me))
        out = []
        for seed in sorted({index // 2, index - 1} - {0, index}):
            try:
                out.append(wire.decode_peer(self._wait_get(f"{self.prefix}/peer/{seed}")))
            except (wire.ProtocolError, RuntimeError, OSError) as e:
                log.warning("rasd: could not read bootstrap seed %d: %s", seed, e)
        return out


class FileStore:
    """A small store in a directory, for jobs without torch (``rasd swarm``). Same calls as torch's Store."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> Path:
        return self.path / key.replace("/", "%")

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else value
        tmp = self._file(key).with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, self._file(key))

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self._file(key).read_bytes()

    def add(self, key: str, amount: int) -> int:
        with open(self.path / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            f = self._file(key)
            value = int(f.read_bytes() or b"0") if f.exists() else 0
            value += amount
            self.set(key, str(value))
            return value

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        deadline = time.monotonic() + (timeout.total_seconds() if timeout else 300.0)
        while not all(self._file(k).exists() for k in keys):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {keys}")
            time.sleep(0.01)
