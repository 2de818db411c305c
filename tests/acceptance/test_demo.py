"""The README's main job, run as a user runs it: ``rasd demo`` recovers from faults by itself.

Each test is one demo of 4 gloo processes under ``inprocess.Wrapper``, as ``rasd demo`` starts it:

* the default, torch's ``DistributedDataParallel``: kill -9 of initial rank 0 at step 20 (no rank is special:
  issue 10), then an exception on initial rank 1 at step 45; and, in a second demo, a skipped collective (one
  step under ``no_sync()`` on one rank), which wedges the job until COMM_STUCK restarts every rank;
* ``--model fsdp`` (FSDP2, ``fully_shard`` on a CPU device mesh): a kill -9, after which the 3 ranks left rebuild
  their sharded module from the in-memory commit;
* ``--model manual`` (hand-written all-reduces): an exception.

The progress lines must show each restart and training going on to the last step on the ranks left, the demo
must end successfully, and every line must be whole (the workers share one pipe: no line interleaved with
another's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]

#: Every line the demo writes to its standard output; anything else is two lines run together, or a stray print.
LINES = [
    r"rasd demo: \d+ gloo processes train a small MLP .*Ctrl\+C stops it\.",
    r"step +\d+  world \(\d+ ranks, (DDP|FSDP2|hand-written all-reduces)\): loss \d+\.\d{4}",
    r"step +\d+  pair \d+(-\d+)?: mean loss \d+\.\d{4}",
    r"rank \d+: injecting (exception|kill|stop|skip|stall) at step \d+",
    r"restart \d+ after .*: \d+ ranks continue from step \d+, [\d.]+ s lost",
]
RESTART = re.compile(r"^restart (\d+) after (.*): (\d+) ranks continue from step (\d+), [\d.]+ s lost$", re.MULTILINE)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_demo(*arguments: str) -> str:
    """``rasd demo ARGUMENTS`` at 0.05 s a step, to its end; its standard output once it ended successfully."""
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
            "--step-time",
            "0.05",
            "--addr",
            f"localhost:{free_port()}",
            *arguments,
        ],
        env=env,
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = completed.stdout
    assert completed.returncode == 0, f"{out}\n{completed.stderr[-3000:]}"
    broken = [line for line in out.splitlines() if not any(re.fullmatch(shape, line) for shape in LINES)]
    assert not broken, f"lines that are not whole demo lines: {broken}\n{out}"
    return out


@pytest.mark.slow
def test_the_demo_restarts_ddp_in_place_after_a_kill_of_rank_0_and_an_exception():
    out = run_demo("--steps", "60", "--inject", "kill:rank=0,step=20", "--inject", "exception:rank=1,step=45")
    assert "train a small MLP with DistributedDataParallel" in out, out
    restarts = RESTART.findall(out)
    assert [(count, world) for count, _, world, _ in restarts] == [("1", "3"), ("2", "3")], out
    assert restarts[0][1].startswith("PEER_DEAD of rank 0"), out
    assert restarts[1][1].startswith("RuntimeError on rank 1: injected exception"), out
    # Resumed from the last in-memory commit (every 10 steps) before each fault, never from step 0.
    assert [int(step) for *_, step in restarts] == [10, 40], out
    assert re.search(r"^step    60  world \(3 ranks, DDP\): loss ", out, re.MULTILINE), out


@pytest.mark.slow
def test_a_rank_that_skips_one_ddp_all_reduce_wedges_the_job_until_comm_stuck_restarts_every_rank():
    out = run_demo("--steps", "40", "--inject", "skip:rank=1,step=25")
    restarts = RESTART.findall(out)
    assert [(count, world) for count, _, world, _ in restarts] == [("1", "4")], out
    assert restarts[0][1].startswith("COMM_STUCK on communicator "), out
    assert int(restarts[0][3]) == 20, out
    assert re.search(r"^step    40  world \(4 ranks, DDP\): loss ", out, re.MULTILINE), out


@pytest.mark.slow
def test_fsdp2_trains_and_the_ranks_left_after_a_kill_rebuild_the_sharded_model_from_memory():
    out = run_demo("--model", "fsdp", "--steps", "40", "--inject", "kill:rank=2,step=25")
    assert "train a small MLP with FSDP2 (fully_shard)" in out, out
    restarts = RESTART.findall(out)
    assert [(count, world, step) for count, _, world, step in restarts] == [("1", "3", "20")], out
    assert restarts[0][1].startswith("PEER_DEAD of rank 2"), out
    assert re.search(r"^step    20  world \(4 ranks, FSDP2\): loss ", out, re.MULTILINE), out
    assert re.search(r"^step    40  world \(3 ranks, FSDP2\): loss ", out, re.MULTILINE), out


@pytest.mark.slow
def test_the_manual_model_all_reduces_by_hand_and_restarts_after_an_exception():
    out = run_demo("--model", "manual", "--steps", "30", "--inject", "exception:rank=3,step=15")
    assert "all-reducing the gradients by hand" in out, out
    restarts = RESTART.findall(out)
    assert [(count, world, step) for count, _, world, step in restarts] == [("1", "4", "10")], out
    assert restarts[0][1].startswith("RuntimeError on rank 3: injected exception"), out
    assert re.search(r"^step    30  world \(4 ranks, hand-written all-reduces\): loss ", out, re.MULTILINE), out
