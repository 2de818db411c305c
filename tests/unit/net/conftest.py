"""A mesh of one in this test process, for the tests of the runtime's services (client port, metrics, restarts)."""

from __future__ import annotations

import pytest

import rasd
from mesh_of_one import free_port
from rasd.services import client_port


@pytest.fixture
def node(monkeypatch, tmp_path, request):
    """This process's node, a mesh of one serving its client port on a free loopback port. A test module's
    ``NODE_ENV`` (name -> value, or None to unset) adds settings."""
    rasd.stop(goodbye=False)  # one node per process: not one an earlier test of the suite left running
    monkeypatch.setenv("TORCHRAS_ADDR", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("TORCHRAS_RUN_DIR", str(tmp_path))
    for name, value in getattr(request.module, "NODE_ENV", {}).items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    handle = rasd.start(secret=b"secret", host="127.0.0.1", services=[client_port.serve])
    assert handle is not None and handle.running
    try:
        yield handle
    finally:
        handle.stop(goodbye=False)
