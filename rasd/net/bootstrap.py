"""Joining a job through a key-value store: the job's secret, and a seed or two to connect to.

Any object with torch.distributed.Store's ``set``/``get``/``add``/``wait`` works (a TCPStore, ``FileStore`` below);
``compare_set`` is used where the store has it. Each process does at most six store operations, so the whole job
does O(N), never O(N²) (``bench/store_rate.py`` counts them and measures what they cost a TCPStore and etcd):

* **secret**: every process draws a random secret and offers it with ``compare_set(secret, "", offer)``, which
  stores the first offer and answers every process with the stored one: one operation, no waiting. A store without
  ``compare_set`` falls back to ``add(claim)``: the process that gets 1 ``set``s its secret, the others ``wait``
  and ``get`` it. ``TORCHRAS_SECRET`` in the environment skips the store.
* **seeds**: ``add(joined)`` gives the process a join index i (1, 2, ...); it ``set``s its own peer entry under
  ``peer/i``, ``wait``s (one call, up to the bootstrap's timeout) for the entries of processes ``i // 2`` and
  ``i - 1`` and ``get``s them. Connecting to them puts it in the mesh, and gossip brings it the rest of the table,
  while the join indices form a tree that spreads the load.

The ``wait`` stays although torch's ``get`` waits for a missing key too: ``get`` waits up to the *store's* timeout
(a TCPStore's is what it was created with, up to 30 minutes under ``init_process_group``), the ``wait`` up to the
bootstrap's, so a seed that never writes its entry costs a process ``timeout`` seconds, not the store's.

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

    def _wait(self, keys: list[str], seconds: float) -> None:
        try:
            self.store.wait(keys, datetime.timedelta(seconds=seconds))
        except TypeError:
            self.store.wait(keys)

    def _get(self, key: str) -> bytes:
        value = self.store.get(key)
        return value.encode() if isinstance(value, str) else bytes(value)

    def secret(self) -> bytes:
        env = os.environ.get("TORCHRAS_SECRET")
        if env:
            return env.encode()
        key = f"{self.prefix}/secret"
        offer = secrets.token_hex(32).encode()
        compare_set = getattr(self.store, "compare_set", None)
        if compare_set is not None:
            try:
                value = compare_set(key, b"", offer)
            except (NotImplementedError, RuntimeError) as e:
                # A torch Store subclass without compare_set says "Not implemented" (a RuntimeError); any other
                # failure is the store's, and is raised: the offer may have been stored.
                if not isinstance(e, NotImplementedError) and "Not implemented" not in str(e):
                    raise
            else:
                return value.encode() if isinstance(value, str) else bytes(value)
        if self.store.add(f"{self.prefix}/secret_claim", 1) == 1:
            self.store.set(key, offer)
            return offer
        self._wait([key], self.timeout)
        return self._get(key)

    def seeds(self, me: PeerInfo) -> list[PeerInfo]:
        index = self.store.add(f"{self.prefix}/joined", 1)
        self.store.set(f"{self.prefix}/peer/{index}", wire.encode_peer(me))
        keys = {seed: f"{self.prefix}/peer/{seed}" for seed in sorted({index // 2, index - 1} - {0, index})}
        if not keys:
            return []
        late: Exception | None = None
        try:
            self._wait(list(keys.values()), self.timeout)
        except (RuntimeError, OSError) as e:
            late = e  # one of them (at least) is missing: read those that are there
        out = []
        for seed, key in keys.items():
            try:
                if late is not None:
                    try:
                        self._wait([key], min(1.0, self.timeout))  # at once if this one is there
                    except (RuntimeError, OSError):
                        raise late from None
                out.append(wire.decode_peer(self._get(key)))
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

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        """As torch's TCPStore: a missing key is created only when ``expected`` is empty; returns the value."""
        want = expected.encode() if isinstance(expected, str) else expected
        with open(self.path / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            f = self._file(key)
            if not f.exists():
                if want:
                    return want
            elif (current := f.read_bytes()) != want:
                return current
            self.set(key, desired)
            return desired.encode() if isinstance(desired, str) else desired

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        deadline = time.monotonic() + (timeout.total_seconds() if timeout is not None else 300.0)
        while not all(self._file(k).exists() for k in keys):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {keys}")
            time.sleep(0.01)
