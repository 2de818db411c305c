"""Fixtures of the rascli tests (the helpers live in ``rascli_helpers``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from rascli_fake_server import FakeServer, Script


@pytest.fixture
def serve() -> Iterator[Callable[..., FakeServer]]:
    """``serve(report=..., ...)`` starts a fake server with that script; all are stopped at the end."""
    servers: list[FakeServer] = []

    def start(host: str = "127.0.0.1", **script: object) -> FakeServer:
        server = FakeServer(Script(**script), host)  # type: ignore[arg-type]
        servers.append(server)
        return server.__enter__()

    yield start
    for server in servers:
        server.stop()
