"""What the client-port tests share: a port range and an endpoint registry per test, so that no test sees another
test's job (``port_env``; ``ras_client.base_port`` reads the job's port from it)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ports import shifted

_next_port = [shifted(29300)]


def _free_base() -> int:
    """A base port with a few free ports after it (below Linux's ephemeral ports, 32768 on)."""
    while True:
        _next_port[0] += 8
        base = _next_port[0]
        try:
            for p in range(base, base + 4):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue


@pytest.fixture
def port_env(tmp_path: Path) -> dict[str, str]:
    base = _free_base()
    return {
        "TORCHRAS_DEFAULT_ADDR": f"localhost:{base}",
        "TORCHRAS_RUN_DIR": str(tmp_path / "endpoints"),
        "TORCHRAS_SWARM_STEP_S": "0",
        "TORCHRAS_TIMEOUT_FACTOR": "0.2",
    }
