"""gloo's teardown in torch 2.13 can deadlock; rasd's hooks keep it from doing so (rasd/torch/hooks.py, "Keeping
gloo's teardown from deadlocking").

Found at the end of bench/false_verdicts.py's DDP soaks: a rank whose DDP model was dropped after
``destroy_process_group()`` never came back (py-spy: its main thread in ``~ProcessGroupGloo``, joining a gloo
worker that waited for the GIL to free its last work), its RAS node fell silent, and the mesh named it PEER_HUNG
at a job's end. tests/integration/teardown_job.py reproduces it with torch alone: without the hooks, 5 runs of 5
deadlocked within 40 rounds on this machine (bench/README.md, "Gloo's teardown"). With them every round ends.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ROUNDS = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_ddp_job_built_and_dropped_forty_times_never_deadlocks_with_the_hooks() -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / "teardown_job.py"), str(free_port()), str(ROUNDS), "--hooks"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, report
    ended = sorted(re.findall(r"rank (\d): (\d+) rounds", done.stdout))
    assert ended == [("0", str(ROUNDS)), ("1", str(ROUNDS))], report
