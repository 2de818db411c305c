"""A Wrapper that gives up tells its launcher (``inprocess.launch_events``: ``gave_up``).

An ``initialize`` that raises ``RestartAbort`` (``RetryController``, ``rasd demo``'s check for a fault that repeats)
ends the call: no restart would heal what it met, so a launcher must not respawn the worker into a job that ended
(``rasd launch`` reads it: ``torchras.launch.workers``). One real call in this process, world size 1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import inprocess
from inprocess.launch_events import ENVIRONMENT
from inprocess_jobs import free_ports
from test_inprocess_call import fast

pytestmark = pytest.mark.slow  # a real call: the Wrapper's store server and monitor process

HERE = Path(__file__).parent


def test_restart_abort_is_announced_to_the_launcher(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(ENVIRONMENT, str(events))

    @inprocess.Wrapper(
        store_kwargs={"port": free_ports(1)[0]},
        initialize=inprocess.initialize.RetryController(max_iterations=2),
        **fast(),
    )
    def train() -> None:
        raise ValueError("always")

    with pytest.raises(inprocess.exception.RestartAbort):
        train()
    announced = [json.loads(line) for line in events.read_text().splitlines()]
    gave_up = [event for event in announced if event["event"] == "gave_up"]
    assert len(gave_up) == 1, announced
    assert gave_up[0]["reason"].startswith("RestartAbort: state.iteration=2 self.max_iterations=2"), gave_up
    assert gave_up[0]["pid"] == os.getpid()
    assert [event["event"] for event in announced].count("completed") == 0, announced
