"""The README's main job, run as a user runs it: ``rasd demo`` recovers from faults by itself.

One demo of 4 gloo processes under ``inprocess.Wrapper``: kill -9 of initial rank 0 at step 20 (no rank is
special: issue 10), then an exception on initial rank 1 at step 45. The progress lines must show both restarts
and training going on to the last step on the 3 ranks left, and the demo must end successfully.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_demo_restarts_in_place_after_a_kill_of_rank_0_and_an_exception():
    env = dict(
        os.environ,
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    env.pop("TORCHRAS_LOG_LEVEL", None)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "rasd.cli",
            "demo",
            "--steps",
            "60",
            "--step-time",
            "0.05",
            "--addr",
            f"localhost:{free_port()}",
            "--inject",
            "kill:rank=0,step=20",
            "--inject",
            "exception:rank=1,step=45",
        ],
        env=env,
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = completed.stdout
    assert completed.returncode == 0, f"{out}\n{completed.stderr[-3000:]}"
    restarts = re.findall(
        r"^restart (\d+) after (.*): (\d+) ranks continue from step (\d+), [\d.]+ s lost$", out, re.MULTILINE
    )
    assert [(count, world) for count, _, world, _ in restarts] == [("1", "3"), ("2", "3")], out
    assert restarts[0][1].startswith("PEER_DEAD of rank 0"), out
    assert restarts[1][1].startswith("RuntimeError on rank 1: injected exception"), out
    # Resumed from the last in-memory commit (every 10 steps) before each fault, never from step 0.
    assert [int(step) for *_, step in restarts] == [10, 40], out
    assert "step    60  world (3 ranks): 60 gradient all-reduces" in out, out
