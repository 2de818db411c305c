"""A minimal client of the RAS client port for the integration tests: the handshake, with retries, and a command.

With SO_REUSEPORT the kernel may hand a connection to a stopped process, which never answers; a new connection (a
new source port) lands elsewhere, so a client retries the handshake a few times, as rascli does.

``wait_for_report`` and ``wait_for_json`` ask again until the report says what a test waits for (tests/polling.py).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterable
from typing import Any

from polling import wait_for

#: Asked again: a connection that landed in the backlog of a process being killed (SO_REUSEPORT), or a job whose
#: client port is not open yet.
NOT_YET = (ConnectionResetError, ConnectionRefusedError)


def connect(port: int, attempts: int = 8, handshake_timeout: float = 2.0) -> socket.socket:
    """A connection to a process of the job that answered ``CLIENT PROTOCOL 2``."""
    for _ in range(attempts):
        s = socket.create_connection(("localhost", port), 5)
        s.settimeout(handshake_timeout)
        s.sendall(b"CLIENT PROTOCOL 2\n")
        try:
            if s.recv(64) == b"SERVER PROTOCOL 2\n":
                return s
        except (TimeoutError, ConnectionResetError):
            pass
        s.close()
    raise AssertionError("no process of the job answered the handshake")


def ask(port: int, text: bytes, timeout: float = 30.0, handshake_timeout: float = 2.0) -> str:
    """Send ``text`` after the handshake and read until the server closes (a report ends the connection)."""
    with connect(port, handshake_timeout=handshake_timeout) as s:
        s.sendall(text)
        s.settimeout(timeout)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                return b"".join(chunks).decode()
            chunks.append(data)


def json_status(port: int) -> dict[str, Any]:
    """The JSON STATUS report."""
    doc: dict[str, Any] = json.loads(ask(port, b"SET FORMAT json\nSTATUS\n").removeprefix("OK\n"))
    return doc


def wait_for_report(
    port: int,
    predicate: Callable[[str], object],
    timeout: float = 30.0,
    command: bytes = b"VERBOSE STATUS\n",
    interval: float = 0.2,
) -> str:
    """The text report (``command``'s answer) once ``predicate(report)`` holds; fails with the last one after
    ``timeout`` seconds."""
    return wait_for(
        lambda: ask(port, command), predicate, timeout, interval, what=f"a report on port {port}", retry_on=NOT_YET
    )


def wait_for_json(port: int, predicate: Callable[[dict[str, Any]], object], timeout: float = 30.0) -> dict[str, Any]:
    """The JSON report once ``predicate(doc)`` holds (a process busy for a moment may be left out of one)."""
    return wait_for(
        lambda: json_status(port), predicate, timeout, 0.2, what=f"a JSON report on port {port}", retry_on=NOT_YET
    )


def server_pid(sock: socket.socket, among: Iterable[int] | None = None) -> int:
    """The pid of the process that accepted this client connection. ``among``: the pids it can be (a swarm's
    members): their connections only are read, where the machine's whole table takes seconds on a loaded machine
    (every process's descriptors)."""
    import psutil

    mine = sock.getsockname()[:2]
    if among is not None:
        for pid in among:
            try:
                connections = psutil.Process(pid).net_connections("tcp")
            except psutil.Error:
                continue
            if any(c.raddr and (c.raddr.ip, c.raddr.port) == mine for c in connections):
                return pid
        raise AssertionError(f"none of {sorted(among)} holds the other end")
    for c in psutil.net_connections("tcp"):
        if c.raddr and (c.raddr.ip, c.raddr.port) == mine and c.pid:
            return c.pid
    raise AssertionError("no process holds the other end")


def base_port(env: dict[str, str]) -> int:
    """The client port of a job started with ``env`` (the ``port_env`` fixture, conftest.py)."""
    return int(env["TORCHRAS_DEFAULT_ADDR"].rsplit(":", 1)[1])


def free_port_from(start: int) -> int:
    """The first port from ``start`` on that is free on 127.0.0.1 (a fixed range below Linux's ephemeral ports)."""
    import socket

    for port in range(start, start + 200):
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no free port in {start}..{start + 199}")
