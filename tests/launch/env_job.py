"""A plain torchrun script: ``init_process_group("env://")``, one all-reduce, and the environment it was given.

env_job.py OUT_PREFIX      writes OUT_PREFIX<RANK>.json: the variables a launcher sets, and the all-reduce's sum
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

NAMES = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
)

dist.init_process_group("gloo")  # env:// : the store the launcher serves on MASTER_PORT
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
found = {name: os.environ.get(name) for name in NAMES}
found["sum"] = value.item()
found["argv"] = sys.argv[1:]
with open(f"{sys.argv[1]}{os.environ['RANK']}.json", "w") as out:
    json.dump(found, out)
dist.destroy_process_group()
