"""Talking to a mesh of one in this test process (conftest.py's ``node``): a free port, a client-port query."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(address: tuple[str, int], *commands: str) -> bytes:
    """Everything the client port answers to ``CLIENT PROTOCOL 2`` and ``commands``, until it closes."""
    with socket.create_connection(address, 30) as s:
        s.sendall("".join(f"{c}\n" for c in ("CLIENT PROTOCOL 2", *commands)).encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data
