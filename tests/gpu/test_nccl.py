"""The NCCL backend path, on a machine with a GPU (skipped elsewhere, CI included: it has none).

What gloo cannot show: the hooks count NCCL's asynchronous CUDA work as completed only when it completes, the
report names the GPU instead of "CPU", rasd moves NCCL's own RAS off our port and both answer side by side, and the
Wrapper aborts an NCCL communicator, runs its CUDA health check and restarts in place. Run it where a GPU is:
``python -m pytest tests/gpu -q``; docs/operations.md §4 ("Counting on GPUs") says what it checks, bench/README.md
("NCCL on a GPU") records the last run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the NCCL backend)"),
]

JOB = Path(__file__).with_name("nccl_job.py")
REPOSITORY = JOB.parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_job(mode: str, tmp_path: Path, **extra_env: str) -> dict:
    out = tmp_path / f"{mode}.json"
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        TORCHRAS_ADDR=f"127.0.0.1:{free_port()}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
    )
    env.pop("NCCL_RAS_ADDR", None)
    env.update(extra_env)
    done = subprocess.run(
        [sys.executable, str(JOB), mode, str(out)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_nccl_collectives_are_counted_when_their_cuda_work_completes_and_the_report_names_the_gpu(tmp_path):
    seen = run_job("counters", tmp_path)
    from rasd.core.comms import OP_TYPES

    (world,) = [c for c in seen["counted"].values() if c["launched"][OP_TYPES.index("AllReduce")]]
    all_reduce, barrier = OP_TYPES.index("AllReduce"), OP_TYPES.index("Barrier")
    assert world["launched"][all_reduce] == world["completed"][all_reduce] == 13  # 7 sync, 5 async, 1 behind work
    # Queued behind a second of GPU work, the all-reduce is launched and not completed until the GPU reaches it.
    launched, completed, after = seen["gpu_busy"]
    assert completed == launched - 1 and after < 0.5, seen["gpu_busy"]
    launched, completed, _ = seen["gpu_done"]
    assert completed == launched, seen["gpu_done"]
    assert world["launched"][barrier] == world["completed"][barrier] == 1
    assert world["device"] == 0
    assert "GPU" in seen["ours"] and "managing CPU" not in seen["ours"], seen["ours"]
    for section in ("Job summary", "Communicators", "Errors", "Warnings"):
        assert section in seen["ours"]
    document = json.loads(seen["ours_json"][seen["ours_json"].index("{") :])  # after the handshake and OK lines
    assert document["communicators_count"] >= 1
    # rasd moved NCCL's own RAS off our port before NCCL read it; where this NCCL build has RAS, it answers there.
    assert seen["nccl_ras_addr"] and seen["nccl_ras_addr"] != seen["torchras_addr"]
    if not seen["theirs"].startswith("unreachable"):
        # The same job, described by NCCL's RAS and by ours: identical below the version lines, but for the
        # gather's own duration.
        def body(report: str) -> str:
            text = report[report.index("Job summary") :]
            return re.sub(r"Communicators\.\.\. \(\d+\.\d+s\)", "Communicators... (TIME)", text)

        assert body(seen["ours"]) == body(seen["theirs"])


def test_the_wrapper_aborts_an_nccl_communicator_checks_the_gpu_and_restarts_in_place(tmp_path):
    seen = run_job("restart", tmp_path)
    assert seen["returned"] == 1
    assert [i["iteration"] for i in seen["iterations"]] == [0, 1]
    assert all(i["sum"] == 2.0 * 1024 for i in seen["iterations"])


def test_ddp_buckets_on_nccl_are_counted_from_the_records_and_completed_when_the_gpu_is_done(tmp_path):
    seen = run_job("ddp", tmp_path)
    from rasd.core.comms import OP_TYPES

    last = seen["records"][-1]
    assert sum(last["launched"]) == seen["seq"], seen  # every collective of the group, DDP's C++ ones included
    assert last["launched"][OP_TYPES.index("AllReduce")] >= seen["steps"], seen  # a bucket or more per step
    assert last["completed"] == last["launched"], seen  # NCCL's Flight Recorder state "completed"
    assert "Flight Recorder" in seen["counting"], seen
