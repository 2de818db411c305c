"""One member of a small rasd mesh that bootstraps from a torch TCPStore hosted by member 0 (the old "rank 0").

Usage: ``python mesh_member.py INDEX STORE_PORT COUNT``; prints ``started`` once its node runs, then idles until
killed. tests/inprocess/test_inprocess_mesh_bootstrap.py kills member 0 and queries the survivors.
"""

from __future__ import annotations

import datetime
import logging
import sys
import time

import torch.distributed

import rasd
from rasd.services import client_port

logging.basicConfig(level=logging.WARNING, format="member %(process)d %(name)s %(message)s")

index, port, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = torch.distributed.TCPStore(
    "127.0.0.1", port, count, index == 0, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
)
rasd.start(store, rank=index, services=[client_port.serve])  # the job's client port, as rasd.torch serves it
print("started", flush=True)
while True:
    time.sleep(60)
