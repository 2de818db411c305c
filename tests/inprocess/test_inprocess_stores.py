"""Where the Wrapper's store lives: call namespaces, connection parameters, the store server, etcd.

Logic with in-memory stores first (no processes); then, marked slow, the real store server process and a real
etcd (single member, and a 3-member cluster that loses a member). Jobs that kill rank 0 are in
test_inprocess_no_single_point.py; the multi-host job in test_inprocess_multihost.py.
"""

from __future__ import annotations

import datetime
import signal
import threading
import time

import psutil
import pytest
import torch.distributed

import etcd_cluster
from inprocess import store as store_module, store_server
from inprocess.monitor_process import _factory_by_reference
from inprocess_jobs import free_ports
from polling import wait_until

SECONDS = datetime.timedelta(seconds=1)


# ---- call namespaces (in memory) ------------------------------------------------------------------------------


def test_consecutive_calls_get_their_own_namespace_and_every_rank_agrees():
    shared = store_module.HashStore()
    factory = lambda: shared  # noqa: E731 - every "rank" is a client of the same store

    first = [store_module.open_base_store(factory, {}, 5, initial_rank=rank)[0].prefix for rank in range(3)]
    second = [store_module.open_base_store(factory, {}, 5, initial_rank=rank)[0].prefix for rank in range(3)]
    assert len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]
    namespaced, raw = store_module.open_base_store(factory, {}, 5, initial_rank=3)
    namespaced.set("key", "call-1 of rank 3")  # a late rank's first call is call 1, whatever the others did
    assert namespaced.prefix == first[0] and raw.get(f"{first[0]}/key") == b"call-1 of rank 3"


def test_a_relaunched_job_starts_again_from_call_one(monkeypatch):
    shared = store_module.HashStore()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    before = store_module.open_base_store(lambda: shared, {}, 5)[0].prefix
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    after = store_module.open_base_store(lambda: shared, {}, 5)[0].prefix
    assert before.endswith("/1") and after.endswith("/1") and before != after


def test_the_function_store_is_apart_from_the_wrapper_keys():
    base = store_module.NamespaceStore("_inprocess_call/x/1", store_module.HashStore())
    user = base.user_store(2)
    user.set("world_size", "9")  # a key the wrapper also uses, in its own iteration namespace
    assert not base.iteration_store(2).check(["world_size"])
    assert user.prefix == "_inprocess_user_2" and user.get("world_size") == b"9"


def test_a_local_store_class_is_never_pickled_for_the_monitor():
    class LocalStore(store_module.FileStore):
        pass

    assert _factory_by_reference(LocalStore, {}) is None
    assert _factory_by_reference(store_module.TCPStore, {"port": 1}) is not None


def test_connection_parameters_open_a_client_of_the_same_store(tmp_path):
    class LocalStore(store_module.FileStore):  # defined here: not importable by name
        pass

    trainer = LocalStore(str(tmp_path / "store"), -1)
    parameters = store_module.connection_parameters(trainer)
    other = store_module.open_connection(parameters)
    other.set("from", "the monitor")
    assert trainer.get("from") == b"the monitor" and parameters["kind"] == "file"
    with pytest.raises(TypeError, match="connection_parameters"):
        store_module.connection_parameters(store_module.HashStore())


def test_etcd_endpoints_on_this_host_come_first():
    from inprocess.etcd_store import parse_endpoints

    assert parse_endpoints("198.51.100.1:2379, http://127.0.0.1:2380/,198.51.100.2") == [
        ("127.0.0.1", 2380),
        ("198.51.100.1", 2379),
        ("198.51.100.2", 2379),
    ]
    with pytest.raises(ValueError, match="INPROCESS_ETCD_ENDPOINTS"):
        parse_endpoints("")


# ---- the store server process (real processes) ---------------------------------------------------------------


def server_processes(port: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(part.endswith("store_server.py") for part in cmdline) and str(port) in cmdline:
            found.append(process)
    return found


@pytest.mark.slow
def test_the_store_server_outlives_its_starter_serves_everyone_and_ends_when_idle(monkeypatch):
    monkeypatch.setenv(store_server.LINGER_ENVIRONMENT, "1")
    port = free_ports(1)[0]
    first = store_module.TCPStore("127.0.0.1", port, timeout=60 * SECONDS)
    second = store_module.TCPStore("127.0.0.1", port, timeout=60 * SECONDS)
    assert first.is_host and not second.is_host  # binding the port is the mutex: one server
    assert [process.pid for process in server_processes(port)] == [first.server_pid]
    first.set("from", "first")
    assert second.get("from") == b"first"
    del first  # the starter goes away; the server does not
    assert second.add("counter", 1) == 1
    del second
    wait_until(lambda: not server_processes(port), 60, 0.2, what="the server to end after its last client left")


# ---- etcd (real members) --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etcd():
    cluster = etcd_cluster.single(free_ports(2))
    yield cluster
    cluster.close()


def etcd_store(cluster, **kwargs):
    from inprocess.etcd_store import EtcdStore

    return EtcdStore(cluster.endpoints, prefix=f"/test/{time.monotonic_ns()}", timeout=30 * SECONDS, **kwargs)


@pytest.mark.slow
def test_etcd_store_answers_like_torch_own_store(etcd):
    """The same operations on torch's HashStore (the baseline) and on etcd give the same answers."""
    baseline = torch.distributed.HashStore()
    ours = etcd_store(etcd)

    def script(store):
        store.set("a", "1")
        return [
            store.get("a"),
            store.add("n", 3),
            store.add("n", -1),
            store.add("zero", 0),
            store.check(["a"]),
            store.check(["a", "missing"]),
            store.compare_set("c", "", "v1"),
            store.compare_set("c", "x", "v2"),
            store.compare_set("c", "v1", "v2"),
            store.compare_set("absent", "x", "y"),
            (store.append("l", "a,"), store.append("l", "b,"), store.get("l"))[-1],
            (store.multi_set(["m1", "m2"], ["x", "y"]), store.multi_get(["m1", "m2"]))[-1],
            store.delete_key("a"),
            store.delete_key("a"),
            store.check(["a"]),
        ]

    assert script(ours) == script(baseline)
    namespaced = store_module.NamespaceStore("ns", ours)  # through torch's C++ PrefixStore and the trampoline
    namespaced.append("list", "1,")
    namespaced.append("list", "2,")
    assert namespaced.get("list") == b"1,2," and namespaced.add("count", 2) == 2


@pytest.mark.slow
def test_etcd_adds_from_many_clients_are_counted_once_each(etcd):
    store = etcd_store(etcd)
    results: list[int] = []

    def client() -> None:
        mine = store.new_connection()
        results.extend(mine.add("counter", 1) for _ in range(15))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == list(range(1, 61)) and store.add("counter", 0) == 60


@pytest.mark.slow
def test_etcd_wait_is_woken_by_a_write_and_times_out_like_torch(etcd):
    store = etcd_store(etcd)
    writer = store.new_connection()
    threading.Timer(0.5, lambda: writer.set("late", "here")).start()
    started = time.monotonic()
    store.wait(["late"], 20 * SECONDS)
    assert time.monotonic() - started < 15  # woken by the watch, not by the timeout
    with pytest.raises(torch.distributed.DistStoreError, match="timeout"):
        store.wait(["never"], 0.3 * SECONDS)
    assert store.wait_key("never", 0.2 * SECONDS) is False  # the wrapper's own wait reads that as a timeout


@pytest.mark.slow
def test_etcd_store_fails_over_when_a_member_is_killed():
    ports = free_ports(6)
    members = [etcd_cluster.Member(f"m{i}", "127.0.0.1", ports[2 * i], ports[2 * i + 1]) for i in range(3)]
    cluster = etcd_cluster.start(members)
    try:
        store = etcd_store(cluster, request_timeout=1.0)
        store.set("before", "1")
        cluster.processes[0].send_signal(signal.SIGKILL)  # the member the client talks to first
        cluster.processes[0].wait(10)
        assert store.get("before") == b"1" and store.add("after", 1) == 1
        assert store.endpoints[store._current] != ("127.0.0.1", ports[0])
    finally:
        cluster.close()


@pytest.mark.slow
def test_a_store_factory_defined_inside_a_function_works(monkeypatch, tmp_path):
    """The monitor process (a fresh interpreter) cannot import this class: it gets connection parameters."""
    import inprocess

    class LocalStore(store_module.TCPStore):
        pass

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    calls = []

    @inprocess.Wrapper(
        store_factory=LocalStore,
        store_kwargs={"port": free_ports(1)[0]},
        monitor_process_logfile=str(tmp_path / "monitor.log"),
        monitor_thread_interval=0.1 * SECONDS,
        monitor_process_interval=0.1 * SECONDS,
        progress_watchdog_interval=0.1 * SECONDS,
        last_call_wait=0.05 * SECONDS,
    )
    def train(call_wrapper: inprocess.CallWrapper) -> str:
        calls.append(call_wrapper.iteration)
        if call_wrapper.iteration == 0:
            raise ValueError("restart once")
        call_wrapper.store.set("mine", "ok")  # the function's own store, on the same server
        return call_wrapper.store.get("mine").decode()

    assert train() == "ok" and calls == [0, 1]
    assert "connected to the store" in (tmp_path / "monitor.log").read_text()
