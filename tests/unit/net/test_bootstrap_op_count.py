"""The bootstrap's store operations, counted exactly: a store serves every process of the job at start-up, so one
more operation per process is 100,000 more at once for a 100,000-process job (bench/store_rate.py)."""

from __future__ import annotations

import collections
import logging
import threading

from rasd.core.peers import Addr, PeerInfo
from rasd.net.bootstrap import FileStore, StoreBootstrap


class Counting:
    """Forwards to a store, counting the calls by kind; offers only what the store has."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name):
        fn = getattr(self.inner, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return counted


class WithoutCompareSet:
    """A store with only set/get/add/wait, the least the bootstrap accepts."""

    def __init__(self, inner: FileStore) -> None:
        self.set, self.get, self.add, self.wait = inner.set, inner.get, inner.add, inner.wait


def me(i: int) -> PeerInfo:
    return PeerInfo(Addr("10.0.0.1", 20000 + i), pid=i, hostname="h", incarnation=i, rank=i)


def join_in_turn(store, n: int) -> list[tuple[bytes, list[PeerInfo], collections.Counter[str]]]:
    out = []
    for i in range(1, n + 1):
        counting = Counting(store)
        bootstrap = StoreBootstrap(counting, prefix="job", timeout=5.0)
        out.append((bootstrap.secret(), bootstrap.seeds(me(i)), counting.calls))
    return out


SEEDS = {"add": 1, "set": 1}  # every process
READS = {1: {}, 2: {"wait": 1, "get": 1}}  # join index 1 has no seed, 2 has one, the rest two


def expected(index: int, secret: dict[str, int]) -> dict[str, int]:
    calls = collections.Counter(secret) + collections.Counter(SEEDS)
    calls += collections.Counter(READS.get(index, {"wait": 1, "get": 2}))
    return dict(calls)


def test_each_process_does_at_most_six_operations(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    joined = join_in_turn(FileStore(tmp_path), 6)
    for index, (_, seeds, calls) in enumerate(joined, 1):
        assert dict(calls) == expected(index, {"compare_set": 1}), f"join index {index}"
        assert {s.rank for s in seeds} == {index // 2, index - 1} - {0, index}
    assert len({secret for secret, _, _ in joined}) == 1
    assert max(sum(calls.values()) for _, _, calls in joined) == 6


def test_with_the_environment_secret_at_most_five(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHRAS_SECRET", "s")
    for index, (secret, _, calls) in enumerate(join_in_turn(FileStore(tmp_path), 4), 1):
        assert secret == b"s" and dict(calls) == expected(index, {}), f"join index {index}"


def test_a_store_without_compare_set_claims_the_secret_with_add(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    joined = join_in_turn(WithoutCompareSet(FileStore(tmp_path)), 4)
    assert dict(joined[0][2]) == expected(1, {"add": 1, "set": 1})
    for index, (_, _, calls) in enumerate(joined[1:], 2):
        assert dict(calls) == expected(index, {"add": 1, "wait": 1, "get": 1}), f"join index {index}"
    assert len({secret for secret, _, _ in joined}) == 1 and len(joined[0][0]) == 64


class NotImplementedCompareSet(WithoutCompareSet):
    def compare_set(self, key, expected, desired):
        raise RuntimeError("fn INTERNAL ASSERT FAILED at init.cpp: Not implemented.")  # torch's Store base class


def test_a_torch_store_subclass_without_compare_set_falls_back(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    store = NotImplementedCompareSet(FileStore(tmp_path))
    first, second = StoreBootstrap(store, "job").secret(), StoreBootstrap(store, "job").secret()
    assert first == second and len(first) == 64


def test_racing_processes_share_the_first_offer(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHRAS_SECRET", raising=False)
    store = FileStore(tmp_path)
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(StoreBootstrap(store, "job").secret())) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 16 and len(set(got)) == 1


def test_a_seed_that_never_writes_costs_the_timeout_once_and_the_other_seed_is_kept(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHRAS_SECRET", "s")
    store = FileStore(tmp_path)
    for i in (1, 2):
        StoreBootstrap(store, "job").seeds(me(i))
    store.add("job/joined", 2)  # join indices 3 and 4 were taken by processes that died before writing their entry
    with caplog.at_level(logging.WARNING, logger="rasd"):
        seeds = StoreBootstrap(store, "job", timeout=0.3).seeds(me(5))  # index 5: seeds 2 and 4, 4 is missing
    assert [s.rank for s in seeds] == [2]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["rasd"]
    assert "could not read bootstrap seed 4" in caplog.records[0].getMessage()


def test_the_file_store_compare_set_is_torchs(tmp_path):
    store = FileStore(tmp_path)
    assert store.compare_set("k", b"x", b"y") == b"x"  # missing, expected not empty: left missing
    assert store.compare_set("k", b"", b"a") == b"a"
    assert store.compare_set("k", b"", b"b") == b"a"
    assert store.compare_set("k", "a", "c") == b"c" and store.get("k") == b"c"
