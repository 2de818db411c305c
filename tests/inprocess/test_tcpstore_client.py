"""The torch-free TCPStore client (inprocess.tcpstore_client) against real torch TCPStore servers, beside torch's.

Differential: the same operation sequence runs through torch's client and through ours on the same server (libuv
and classic backends in this process, and the Wrapper's own store server process), and must give the same results,
the same errors and the same keys. Last, a real monitor process of a TCPStore-backed call never loads torch.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import socket
import threading
import time
from typing import Any

import pytest
import torch.distributed

from inprocess import store as store_module, store_server
from inprocess.attribution import Interruption, InterruptionRecord
from inprocess.monitor_process import MonitorProcess
from inprocess.store_mixin import PrefixedStore, _is_timeout_error, _timeout_errors
from inprocess.tcpstore_client import HandshakeError, TCPStoreClient
from inprocess_jobs import free_ports

TIMEOUT = datetime.timedelta(seconds=2)


@pytest.fixture(params=["libuv", "classic"])
def server(request):
    """A torch TCPStore server in this process (its daemon thread): (host, port, use_libuv)."""
    use_libuv = request.param == "libuv"
    master = torch.distributed.TCPStore(
        "127.0.0.1", 0, None, True, timeout=TIMEOUT, wait_for_workers=False, use_libuv=use_libuv
    )
    yield "127.0.0.1", master.port, use_libuv
    del master


def torch_client(host: str, port: int, use_libuv: bool = True, timeout: datetime.timedelta = TIMEOUT) -> Any:
    return torch.distributed.TCPStore(
        host, port, None, False, timeout=timeout, wait_for_workers=False, use_libuv=use_libuv
    )


def timeout_error(call: Any) -> str:
    """Run ``call``, which must time out as StoreMixin recognises it; the error's message."""
    with pytest.raises(_timeout_errors()) as caught:
        call()
    assert _is_timeout_error(caught.value)
    return str(caught.value)


def sequence(store: Any) -> list:
    """Every operation StoreMixin builds on, with torch's edge cases; the results in order."""
    results: list = []
    store.set("a", "1")
    results.append(store.get("a"))
    store.set("raw", b"\xff\x00bytes")
    results.append(store.get("raw"))
    results += [store.add("n", 5), store.add("n", -2), store.add("n", 0), store.get("n")]
    results += [store.check(["a"]), store.check(["a", "missing"]), store.check([])]
    results += [store.compare_set("new", "", "x"), store.get("new")]  # missing key, empty expected: created
    results += [store.compare_set("absent", "y", "z"), store.check(["absent"])]  # missing key: expected returned
    results += [store.compare_set("a", "wrong", "q"), store.compare_set("a", "1", "q"), store.get("a")]
    store.append("list", "x")
    store.append("list", b"y")
    results.append(store.get("list"))
    store.multi_set(["m1", "m2"], ["u", "v"])
    results.append(store.multi_get(["m1", "m2"]))
    results += [store.delete_key("m1"), store.delete_key("m1"), store.check(["m1"])]
    message = timeout_error(lambda: store.wait(["never"], datetime.timedelta(seconds=0.3)))
    results.append(message.split(",")[0])  # "wait timeout after 300ms"
    store.set("after", "still in step")  # the cancelled wait left the connection usable
    results.append(store.get("after"))
    store.wait(["a", "after"], datetime.timedelta(seconds=1))
    return results


def test_the_same_sequence_gives_the_same_results_through_both_clients(server):
    host, port, use_libuv = server
    theirs = sequence(store_module.NamespaceStore("torch", torch_client(host, port, use_libuv)))
    ours = sequence(PrefixedStore("ours", TCPStoreClient(host, port, TIMEOUT)))
    assert ours == theirs
    assert theirs[-1] == b"still in step" and theirs[2:6] == [5, 3, 3, b"3"]


def test_both_clients_name_the_same_keys(server):
    host, port, use_libuv = server
    theirs = torch_client(host, port, use_libuv)
    ours = TCPStoreClient(host, port, TIMEOUT)
    torch_side = store_module.NamespaceStore("call", theirs).iteration_store(3)
    our_side = PrefixedStore("call", ours).iteration_store(3)
    torch_side.set("from_torch", "t")
    our_side.set("from_ours", "o")
    assert our_side.get("from_torch") == b"t" and torch_side.get("from_ours") == b"o"
    # torch's PrefixStore joins with "/": the raw keys are the same whichever client wrote them
    assert theirs.get("call/_inprocess_3/from_ours") == b"o" and ours.get("call/_inprocess_3/from_torch") == b"t"
    assert ours.multi_get(["call/_inprocess_3/from_torch", "call/_inprocess_3/from_ours"]) == [b"t", b"o"]


def test_a_blocking_get_is_released_by_a_later_set(server):
    host, port, use_libuv = server
    writer = torch_client(host, port, use_libuv)
    for name, reader in (("torch", torch_client(host, port, use_libuv)), ("ours", TCPStoreClient(host, port, TIMEOUT))):
        timer = threading.Timer(0.3, writer.set, (f"late_{name}", "arrived"))
        timer.start()
        started = time.monotonic()
        assert reader.get(f"late_{name}") == b"arrived"
        assert time.monotonic() - started >= 0.25
        timer.join()


def test_get_and_multi_get_of_a_missing_key_time_out_as_torch_does(server):
    host, port, use_libuv = server
    short = datetime.timedelta(milliseconds=500)  # each client waits it out twice: the test's time is 4 of them
    theirs, ours = torch_client(host, port, use_libuv, short), TCPStoreClient(host, port, short)
    for store in (theirs, ours):
        assert timeout_error(lambda store=store: store.get("missing")).startswith("wait timeout after 500ms")
        timeout_error(lambda store=store: store.multi_get(["missing"]))
        assert store.add("usable", 1) >= 1
    assert ours.timeout == theirs.timeout == short


def test_the_vocabulary_works_across_the_two_clients(server):
    host, port, use_libuv = server
    torch_side = store_module.NamespaceStore("call", torch_client(host, port, use_libuv))
    our_side = PrefixedStore("call", TCPStoreClient(host, port, TIMEOUT))
    torch_side.iteration_store(0).set_initial_rank(1, 7)
    assert our_side.iteration_store(0).get_initial_ranks([1]) == [7]
    assert our_side.iteration_store(0).get_rank_of_initial(7) == 1
    assert not our_side.iteration_store(0).wait_key("never", 0.2)  # our timeout error is recognised
    our_side.iteration_store(0).record_terminated_ranks([1])
    our_side.iteration_store(0).record_interrupted([InterruptionRecord(1, Interruption.TERMINATED)], reason="dead")
    assert torch_side.iteration_store(0).get_terminated_ranks() == {1}
    assert torch_side.iteration_store(0).is_interrupted()
    assert torch_side.iteration_store(0).iteration_outcome() == "interrupted"
    assert [r.interruption for r in torch_side.iteration_store(0).get_interruption_records()] == [
        Interruption.TERMINATED
    ]
    our_side.iteration_store(0).iteration_barrier([1], 2, 0)  # a monitor registers its dead rank
    torch_side.iteration_store(0).iteration_barrier([0], 2, 5)  # the survivor passes
    our_side.termination_barrier([7], 8, 0)
    assert int(torch_side.add("barrier:termination:count", 0)) == 1


def test_a_server_that_does_not_echo_the_ping_fails_the_handshake():
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def answer_wrong() -> None:
        connection, _ = listener.accept()
        accepted.append(connection)
        connection.recv(64)
        connection.sendall(b"HTTP")  # four bytes, not the nonce

    thread = threading.Thread(target=answer_wrong, daemon=True)
    thread.start()
    with pytest.raises(HandshakeError):
        TCPStoreClient("127.0.0.1", listener.getsockname()[1], 1.0)
    thread.join(5)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog) and never answers
    with pytest.raises(HandshakeError):
        TCPStoreClient("127.0.0.1", silent.getsockname()[1], 0.3)
    for sock in [listener, silent, *accepted]:
        sock.close()


# ---- the Wrapper's store server process and a real monitor process ----------------------------------------------


@pytest.mark.slow
def test_the_monitor_of_a_tcpstore_call_never_loads_torch(tmp_path, monkeypatch):
    monkeypatch.setenv(store_server.LINGER_ENVIRONMENT, "1")
    port = free_ports(1)[0]
    kwargs = dict(host_name="127.0.0.1", port=port, timeout=datetime.timedelta(seconds=30))
    namespaced, raw = store_module.open_base_store(store_module.TCPStore, kwargs, 30)
    assert sequence(PrefixedStore("ours", TCPStoreClient("127.0.0.1", port, TIMEOUT))) == sequence(
        store_module.NamespaceStore("torch", store_module.TCPStore.client("127.0.0.1", port, None, TIMEOUT, True))
    )
    log = tmp_path / "monitor.log"
    monitor = MonitorProcess(
        rank=0,
        world_size=2,
        soft_timeout=600,
        hard_timeout=600,
        termination_grace_time=1,
        barrier_timeout=60,
        interval=0.1,
        heartbeat_interval=0.1,
        heartbeat_timeout=600,
        log_filename=str(log),
        pid_filename=None,
        store_factory=store_module.TCPStore,  # importable by name: sent by reference, and parameters with it
        store_kwargs=kwargs,
    )
    try:
        monitor.store_ready(namespaced.prefix, raw)
        monitor.wait_ready(60)
        monitor.start_iteration(rank=0, world_size=2, iteration=0, initial_rank=0, initial_world_size=2)
        assert namespaced.iteration_store(0).wait_key("heartbeat_0", 30)  # its writes land in the call's keys
        maps = pathlib.Path(f"/proc/{monitor.pid}/maps").read_text()
        assert "libtorch" not in maps and "torch/lib" not in maps
        assert "connected to the store (client: TCPStoreClient)" in log.read_text()
    finally:
        monitor.shutdown()
    assert monitor.process.returncode == 0, log.read_text()
    assert os.path.getsize(log) > 0
