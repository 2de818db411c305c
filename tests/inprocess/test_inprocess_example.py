"""The reference's end-to-end example (examples/inprocess_optimal_example.py) under torchrun: 2 gloo ranks, faults
injected at random, restarts in-process, finishes. Its output shows the restarts (docs/inprocess.md, parity)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess_jobs import free_ports

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLE = REPOSITORY / "examples" / "inprocess_optimal_example.py"

pytestmark = pytest.mark.slow


def test_the_reference_example_restarts_and_finishes(tmp_path):
    # 2 ranks x 0.06 per step over 40 steps: about 5 faults, none at all with probability 0.7 %; a checkpoint every
    # 4 steps bounds the work a restart repeats; a small model keeps the steps short on 2 CPU cores.
    (master_port,) = free_ports(1)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(master_port),
        str(EXAMPLE),
        "--device",
        "cpu",
        "--size",
        "16",
        "--layers",
        "2",
        "--total-iterations",
        "40",
        "--fault-prob",
        "0.06",
        "--chkpt-interval",
        "4",
        "--log-interval",
        "4",
        "--path",
        str(tmp_path),
        "--nested-restarter",
    ]
    env = dict(
        os.environ,
        TORCHRAS_ENABLE="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=540, cwd=tmp_path)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]
    faults = re.findall(r"example fault at iteration=\d+ from rank=\d", output)
    restarts = re.findall(r"restart latency: [\d.]+s", output)
    assert faults and restarts, output[-6000:]
    assert "state=handling stage=starting" in output and "state=handling stage=completed" in output
    assert "state=finalized" in output
    assert re.search(r"rank=0 iteration=39 loss=", output), output[-6000:]  # the last step ran
