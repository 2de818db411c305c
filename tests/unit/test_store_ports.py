"""The ports of a job's stores (issue 38, chaos matrix pass 3): ``rasd launch --standalone`` puts its store below
the ports the kernel hands out to outgoing connections, and a Wrapper whose store port is held by a socket that
serves nothing says so at once instead of waiting for a server that never comes."""

from __future__ import annotations

import socket
import time

import pytest

from inprocess import store_server
from torchras.launch import store as launch_store
from torchras_formats import ports


def test_the_kernels_range_for_outgoing_connections_is_read_and_defaults_to_linuxs(monkeypatch):
    low = ports.ephemeral_low()
    assert 1024 <= low < 65536
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(OSError("no /proc")))
    assert ports.ephemeral_low() == ports.EPHEMERAL_LOW == 32768


def test_a_standalone_store_port_lies_below_that_range_with_its_two_neighbours_free():
    for _ in range(5):
        sock = launch_store._free_base_port("")
        try:
            port = sock.getsockname()[1]
            assert launch_store.STANDALONE_LOW <= port < ports.ephemeral_low() - 2
            assert not any(port + step in later for later in launch_store.LATER_BOUND for step in (0, 1, 2))
            assert all(launch_store._bindable("", port + step) for step in (1, 2))
        finally:
            sock.close()


def _held_port() -> socket.socket:
    """A port held as an outgoing connection's would be: bound, not listening (no SO_REUSEADDR)."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    return holder


def test_a_store_port_held_by_a_socket_that_serves_nothing_fails_at_once_and_says_why():
    holder = _held_port()
    port = holder.getsockname()[1]
    try:
        started = time.monotonic()
        with pytest.raises(store_server.ServerStartError, match=f"port {port} .* serves nothing"):
            store_server.serve("127.0.0.1", port, timeout=300)
        assert time.monotonic() - started < store_server.REFUSED_FOR + 2  # not the clients' 300 s
    finally:
        holder.close()


def test_a_port_where_a_server_listens_is_a_client_s_and_a_port_of_another_host_is_not_probed():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        assert store_server.serve("127.0.0.1", listener.getsockname()[1], timeout=5) is None  # another serves it
        assert not store_server.nobody_serves("127.0.0.1", listener.getsockname()[1])
    finally:
        listener.close()
    assert store_server.serve("192.0.2.1", 29500, timeout=5) is None  # TEST-NET-1: not an address of this host
