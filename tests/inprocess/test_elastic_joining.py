"""The rendezvous driven through a store (inprocess/elastic/joining.py): the value in the store, a round at an
iteration boundary that admits a waiting process, the host-update check at commits, join timeout, closing; the
discovery hook (inprocess/elastic/discovery.py) and the processes of a removed host leaving at a round.

One process, one in-memory store, the survivors of a boundary as threads: no sockets, no torch jobs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from inprocess.elastic import rendezvous
from inprocess.elastic.discovery import HOST_ENVIRONMENT, discover, parse, removed
from inprocess.elastic.joining import (
    Admission,
    HostRemoved,
    JoinDriver,
    JoinFailed,
    Joining,
    StoreRendezvous,
    decode,
    encode,
    node_id,
)
from inprocess.store import FAULT_REASONS_KEY, HashStore, NamespaceStore


def job(world_size: int, **settings: object) -> tuple[HashStore, NamespaceStore, list[JoinDriver]]:
    """A job's initial ranks, as their drivers, in the namespace of its call."""
    raw = HashStore()
    store = NamespaceStore("_inprocess_call/:0/1", raw)
    joining = Joining(poll_interval=0.01, **settings)  # type: ignore[arg-type]
    drivers = [JoinDriver.for_initial_rank(joining, raw, store, rank, world_size) for rank in range(world_size)]
    return raw, store, drivers


def newcomer(store: NamespaceStore, **settings: object) -> JoinDriver:
    driver = JoinDriver.for_newcomer(Joining(newcomer=True, poll_interval=0.01, **settings), store)  # type: ignore[arg-type]
    driver.join()
    return driver


def concurrently(calls: list[Callable[[], object]], timeout: float = 30) -> list[object]:
    """Run the calls on threads (processes at a boundary); their results or the exceptions they raised."""
    results: list[object] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except Exception as error:  # noqa: BLE001 - handed to the test
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_the_value_in_the_store_survives_encoding() -> None:
    settings = rendezvous.Settings(2, 3, last_call=5, join_timeout=60)
    state = rendezvous.Rendezvous()
    for event in (
        rendezvous.Join("b", 0),
        rendezvous.Join("a", 1),
        rendezvous.Join("c", 2),
        rendezvous.Join("d", 3),
        rendezvous.Join("e", 4),
        rendezvous.Leave("a", 5),
    ):
        state, _ = rendezvous.step(settings, state, event)
        assert decode(encode(state)) == state


def test_node_ids_sort_as_initial_ranks() -> None:
    assert sorted(node_id(rank) for rank in (10, 2, 9)) == [node_id(2), node_id(9), node_id(10)]


def test_the_launcher_world_is_round_zero_and_a_newcomer_waits_for_the_next_round() -> None:
    _, store, drivers = job(2, max_nodes=3)
    state = StoreRendezvous(store, rendezvous.Settings(1, 3)).read()
    assert state is not None and (state.round, state.complete, state.ranks) == (
        0,
        True,
        ((node_id(0), 0), (node_id(1), 1)),
    )
    late = newcomer(store)
    assert late.initial_rank == 2 and late.node == node_id(2)
    state = StoreRendezvous(store, rendezvous.Settings(1, 3)).read()
    assert state is not None and state.waiting == 1 and state.rank_of(late.node) is None  # exclusivity


def test_a_round_at_the_boundary_admits_the_waiting_process_with_ranks_everyone_agrees_on() -> None:
    _, store, drivers = job(3, max_nodes=3, last_call=0.2)
    late = newcomer(store)
    # Initial rank 1 died: the survivors leave it out, the newcomer takes the last rank (max_nodes: at once).
    results = concurrently(
        [lambda: drivers[0].next_round({1}, 5), lambda: drivers[2].next_round({1}, 5), late.wait_for_admission]
    )
    assert results == [Admission(1, 5, 0, 3), Admission(1, 5, 1, 3), Admission(1, 5, 2, 3)]
    assert drivers[0].members == drivers[2].members == late.members == (node_id(0), node_id(2), node_id(3))


def test_below_max_nodes_a_round_completes_after_the_last_call() -> None:
    _, store, drivers = job(3, max_nodes=4, last_call=0.3)
    started = time.monotonic()
    results = concurrently(
        [
            lambda: drivers[0].next_round(set(), 1),
            lambda: drivers[1].next_round(set(), 1),
            lambda: drivers[2].next_round(set(), 1),
        ]
    )
    assert [(item.rank, item.world_size) for item in results] == [(0, 3), (1, 3), (2, 3)]  # type: ignore[union-attr]
    assert time.monotonic() - started >= 0.3


def test_commits_look_for_waiting_processes_on_rank_zero_every_kth_commit() -> None:
    _, store, drivers = job(2, max_nodes=3, check_every=3)
    assert not drivers[0].check_waiting(0, 0)  # nobody waits
    newcomer(store)
    assert not drivers[1].check_waiting(1, 0) and not drivers[1].check_waiting(1, 0)
    assert not drivers[1].check_waiting(1, 0)  # a third commit, but not rank 0
    assert not drivers[0].check_waiting(0, 0)  # rank 0's second commit
    assert drivers[0].check_waiting(0, 0)  # its third: the iteration ends, terminating nobody
    iteration = store.iteration_store(0)
    assert iteration.is_interrupted() and iteration.get_terminated_ranks() == set()
    assert "JOIN_WAITING: 1 process(es)" in iteration.get(FAULT_REASONS_KEY).decode()


def test_a_join_not_admitted_within_its_timeout_fails_and_is_not_retried() -> None:
    _, store, _ = job(2, max_nodes=3)
    late = newcomer(store, join_timeout=0.2)
    with pytest.raises(JoinFailed, match="join timeout") as failure:
        late.wait_for_admission()
    assert failure.value.reason == "timeout"
    state = StoreRendezvous(store, rendezvous.Settings(1, 3)).read()
    assert state is not None and state.waiting == 0


def test_a_completed_job_is_closed_pending_and_later_joins_fail() -> None:
    _, store, drivers = job(2, max_nodes=3)
    pending = newcomer(store)
    drivers[0].close()
    with pytest.raises(JoinFailed, match="closed"):
        pending.wait_for_admission()
    later = newcomer(store)
    with pytest.raises(JoinFailed, match="closed") as failure:
        later.wait_for_admission()
    assert failure.value.reason == "closed"


def test_a_process_that_leaves_is_not_waited_for() -> None:
    _, store, drivers = job(3, max_nodes=3, last_call=0.1)
    drivers[1].leave()  # it left the wrapper (an exception): its rank is terminated too, and left already
    results = concurrently([lambda: drivers[0].next_round({1}, 2), lambda: drivers[2].next_round({1}, 2)])
    assert [(item.rank, item.world_size) for item in results] == [(0, 2), (1, 2)]  # type: ignore[union-attr]


def test_settings_are_checked_as_torch_does() -> None:
    with pytest.raises(ValueError, match="greater than zero"):
        Joining(min_nodes=0)
    with pytest.raises(ValueError, match="check_every"):
        Joining(check_every=0)
    raw = HashStore()
    with pytest.raises(ValueError, match="exceeds max_nodes"):
        JoinDriver.for_initial_rank(Joining(max_nodes=2), raw, NamespaceStore("call", raw), 0, 3)


# ---- the discovery hook -----------------------------------------------------------------------------------------


def test_discovery_output_is_horovods_host_slots_lines() -> None:
    assert parse("hostA:2\n\n# a comment\nhostB:1\nhostC\n") == {"hostA": 2, "hostB": 1, "hostC": 1}
    with pytest.raises(ValueError, match="line 1"):
        parse("hostA:two\n")


def test_a_removed_host_takes_its_processes_and_a_smaller_host_its_latest_ones() -> None:
    members = {node_id(0): "a", node_id(1): "a", node_id(2): "b", node_id(3): "b"}
    assert removed(members, {"a": 2}) == [node_id(2), node_id(3)]
    assert removed(members, {"a": 1, "b": 2}) == [node_id(1)]
    assert removed(members, {"a": 2, "b": 2, "c": 4}) == []


def test_a_script_is_asked_like_horovods_discovery_script(tmp_path) -> None:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho hostA:2\necho hostB:1\n")
    script.chmod(0o755)
    assert discover(str(script)) == {"hostA": 2, "hostB": 1}


def test_the_processes_of_a_removed_host_leave_at_the_next_round(monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = {"hostA": 2, "hostB": 1}
    raw = HashStore()
    store = NamespaceStore("_inprocess_call/:0/1", raw)
    joining = Joining(
        max_nodes=3, last_call=0.1, poll_interval=0.01, discovery=lambda: dict(hosts), discovery_interval=0
    )
    drivers = []
    for rank, host in enumerate(("hostA", "hostA", "hostB")):
        monkeypatch.setenv(HOST_ENVIRONMENT, host)
        drivers.append(JoinDriver.for_initial_rank(joining, raw, store, rank, 3))
    assert not drivers[0].check_waiting(0, 0)  # every host still listed
    del hosts["hostB"]
    assert drivers[0].check_waiting(0, 0)
    reasons = store.iteration_store(0).get(FAULT_REASONS_KEY).decode()
    assert "HOSTS_UPDATED: the discovery hook removed host(s) hostB; initial ranks 2 leave the job" in reasons
    assert not drivers[0].check_waiting(0, 1)  # recorded once
    results = concurrently(
        [
            lambda: drivers[0].next_round(set(), 1),
            lambda: drivers[1].next_round(set(), 1),
            lambda: drivers[2].next_round(set(), 1),
        ]
    )
    assert results[:2] == [Admission(1, 1, 0, 2), Admission(1, 1, 1, 2)]
    assert isinstance(results[2], HostRemoved) and results[2].host == "hostB"
