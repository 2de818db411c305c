"""A job that mixes the two ways to train under ``rasd launch``: local rank 0 trains inside ``inprocess.Wrapper``, the
others call ``init_process_group`` themselves. Neither way can heal it (the Wrapper's ranks wait at their start-up
barrier for ranks that never come, the others inside ``init_process_group`` for ranks that never call it), so the
launcher refuses it at once. ``mixed_job.py``; it never trains."""

from __future__ import annotations

import os
import time

import torch.distributed as dist

if int(os.environ["LOCAL_RANK"]) == 0:
    import inprocess

    @inprocess.Wrapper()
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> None:
        dist.init_process_group("gloo")
        time.sleep(600)

    train()
else:
    dist.init_process_group("gloo")
    time.sleep(600)
