"""A real gloo job started with garbage in every TORCHRAS_* setting trains to the end: rasd says once what each
bad setting was and what it uses instead, and a rank whose mesh address cannot be used trains without RAS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ports import shifted
from ras_client import free_port_from

REPOSITORY = Path(__file__).resolve().parents[2]
STEPS = 20
TRAIN = f"""
import logging
logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
import torch
import torch.distributed as dist
import rasd
rasd.install()
dist.init_process_group("gloo")
t = torch.ones(4)
for step in range({STEPS}):
    dist.all_reduce(t)
dist.barrier()
print("TRAINED", int(t[0]), "with RAS" if rasd.node() is not None else "without RAS", flush=True)
dist.destroy_process_group()
rasd.stop()
import os
os._exit(0)  # skip torch's interpreter teardown: seconds on a loaded machine, and nothing this test looks at
"""
GARBAGE = {
    "TORCHRAS_ENABLE": "perhaps",
    "TORCHRAS_TIMEOUT_FACTOR": "fast",
    "TORCHRAS_HANG_LIMIT": "-10",
    "TORCHRAS_STUCK_LIMIT": "forever",
    "TORCHRAS_FAST_DEATH": "sometimes",
    "TORCHRAS_MESH_PORT": "port",
    "TORCHRAS_ADDR": "localhost",
    "TORCHRAS_SECRET": "",
    "TORCHRAS_MESH_HOST": "the-fast-one",
}


@pytest.mark.slow
def test_a_job_with_garbage_settings_trains(tmp_path: Path) -> None:
    master, client = free_port_from(shifted(29600)), free_port_from(shifted(29650))
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master),
            TORCHRAS_RUN_DIR=str(tmp_path / "endpoints"),
            TORCHRAS_DEFAULT_ADDR=f"localhost:{client}",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
            TORCH_CPP_LOG_LEVEL="ERROR",
            **GARBAGE,
        )
        if rank == 1:
            env["TORCHRAS_MESH_HOST"] = "203.0.113.7"  # TEST-NET-3: no interface of this machine has it
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", TRAIN],
                env=env,
                cwd=REPOSITORY,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    results = []
    try:
        for proc in procs:
            results.append(proc.communicate(timeout=120))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
    (out0, err0), (out1, err1) = results
    assert out0.strip() == f"TRAINED {2**STEPS} with RAS"
    assert out1.strip() == f"TRAINED {2**STEPS} without RAS"
    lines0 = [line for line in err0.splitlines() if line.startswith("rasd WARNING")]
    for name in (
        "TORCHRAS_ENABLE",
        "TORCHRAS_TIMEOUT_FACTOR",
        "TORCHRAS_HANG_LIMIT",
        "TORCHRAS_STUCK_LIMIT",
        "TORCHRAS_FAST_DEATH",
        "TORCHRAS_MESH_PORT",
        "TORCHRAS_ADDR",
        "TORCHRAS_MESH_HOST",
    ):
        assert len([line for line in lines0 if name in line.split(";")[0]]) == 1, (name, err0)
    assert len(lines0) == 8, err0
    without = [line for line in err1.splitlines() if "runs without RAS" in line]
    assert without == [
        "rasd WARNING rasd: cannot listen for the mesh on 203.0.113.7:0, set by TORCHRAS_MESH_HOST "
        "(Cannot assign requested address); this process runs without RAS"
    ], err1
