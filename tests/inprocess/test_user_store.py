"""inprocess.user_store: the wrapped function's store connection is cut at a restart, so that a thread blocked in a
C++ store wait on it (gloo connecting a new group, waiting for a dead peer's address) returns at once; the next
iteration gets a fresh connection; the Wrapper's other connections are untouched."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

from inprocess.user_store import UserStoreConnection
from inprocess_jobs import free_ports

pytestmark = pytest.mark.slow


class Client:
    """A TCPStore client with ``user_store`` (what ``CallWrapper``'s connections offer)."""

    def __init__(self, port: int) -> None:
        self.store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))

    def user_store(self, iteration: int) -> dist.Store:
        return dist.PrefixStore(f"user{iteration}", self.store)


def test_a_wait_on_the_cut_connection_fails_at_once_and_the_next_iteration_reconnects() -> None:
    (port,) = free_ports(1)
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    other = Client(port)  # the Wrapper's own connection, made before
    user = UserStoreConnection(lambda: Client(port))
    store = user.store(0)
    failed: list[BaseException] = []

    def wait_for_a_key_nobody_sets() -> None:
        try:
            store.wait(["dead peer's address"], datetime.timedelta(seconds=60))
        except BaseException as error:  # noqa: BLE001 - what the blocked thread sees is the point
            failed.append(error)

    blocked = threading.Thread(target=wait_for_a_key_nobody_sets)
    blocked.start()
    time.sleep(0.5)
    assert blocked.is_alive() and not failed
    started = time.monotonic()
    assert user.cut_now() >= 1
    blocked.join(10)
    assert not blocked.is_alive() and failed, "the wait did not end when its connection was cut"
    assert time.monotonic() - started < 10
    # The next iteration's store works, on a new connection; the Wrapper's connection was never touched.
    fresh = user.store(1)
    fresh.set("k", "v")
    assert fresh.get("k") == b"v"
    other.store.set("mine", "1")
    assert other.store.get("mine") == b"1"
    del server
