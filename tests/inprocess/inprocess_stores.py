"""Store factories for tests; importable by the monitor process (tests/inprocess is put on its PYTHONPATH)."""

from __future__ import annotations

import os
import time

from inprocess.store import TCPStore


class MonitorNeverConnects(TCPStore):
    """A TCPStore whose client in the monitor process never finishes connecting."""

    def __init__(self, **kwargs: object) -> None:
        if os.environ.get("INPROCESS_STORE_CLIENT"):
            time.sleep(3600)
        super().__init__(**kwargs)
