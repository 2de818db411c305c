"""Joining through a store costs each process a handful of store operations: O(N) for the job, never O(N²)."""

from __future__ import annotations

import collections
import threading

import pytest

from rasd.core.peers import Addr, PeerInfo
from rasd.net.bootstrap import FileStore, StoreBootstrap


class CountingStore:
    """Any store with torch's set/get/add/wait, counting every call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = collections.Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def counted(*args, **kwargs):
            with self._lock:
                self.calls[name] += 1
            return fn(*args, **kwargs)

        return counted


def me(i: int) -> PeerInfo:
    return PeerInfo(Addr("10.0.0.1", 20000 + i), pid=i, hostname="h", incarnation=i, rank=i)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_every_process_reads_at_most_two_seeds_and_the_job_shares_one_secret(tmp_path, monkeypatch, n):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    store = CountingStore(FileStore(tmp_path / "store"))
    secrets: list[bytes] = [b""] * n
    seeds: list[list[PeerInfo]] = [[] for _ in range(n)]

    def join(i: int) -> None:
        b = StoreBootstrap(store, prefix="job")
        secrets[i] = b.secret()
        seeds[i] = b.seeds(me(i))

    threads = [threading.Thread(target=join, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(secrets)) == 1 and len(secrets[0]) == 64
    total = sum(store.calls.values())
    assert total <= 9 * n, f"{total} store operations for {n} processes"
    assert all(len(s) <= 2 for s in seeds)
    # Every process but the first reaches an earlier one: the join order forms a connected tree.
    reached = {seed.rank for s in seeds for seed in s}
    assert (n == 1 and not reached) or reached <= set(range(n))
    assert sum(1 for s in seeds if not s) == 1


def test_the_environment_secret_skips_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHRAS_SECRET", "from-the-environment")
    store = CountingStore(FileStore(tmp_path / "store"))
    assert StoreBootstrap(store).secret() == b"from-the-environment"
    assert sum(store.calls.values()) == 0


def test_attempts_of_a_restarted_job_use_different_keys(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert StoreBootstrap(object()).prefix == "torchras/3"
