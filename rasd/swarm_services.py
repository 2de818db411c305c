"""What a ``rasd swarm`` member adds to its RAS node: the client port and a synthetic job's communicators.

Each member holds one rank of a job-wide communicator (``world``, N ranks) and of a two-rank communicator with its
neighbour in index order (``pair``). Their AllReduce counts advance together, one step every
``TORCHRAS_SWARM_STEP_S`` seconds (default 1; 0 freezes them) counted from the swarm's shared start time, so a
healthy swarm reports equal counts. The counts are a fiction under SIGSTOP: a stopped member's peers count on as if
it took part, where a real all-reduce would wait for it, so the witness (rasd/core/witness.py) withholds PEER_HUNG
about it; a test that stops a member and expects that verdict freezes the counts (0). Control commands make a
member misbehave (see ``obey``):

    lag K            this member is K operations behind on world
    freeze           this member stops counting (the others go on)
    stuck            this member launched one more operation than it completed (stuck inside it)
    leave-comm NAME  this member leaves world or pair (the others see NOCOMM)
    error CODE       an asynchronous error on world
    abort | finalize set that status on world
    heal             undo lag, freeze and stuck
    restart N [RANKS [SECONDS [CAUSE...]]]
                     training restarted in place to iteration N (what inprocess.Wrapper reports through
                     rasd.record_restart): RANKS terminated (comma-separated, - for none), SECONDS lost
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from typing import Any

from rasd.api import record_restart
from rasd.core.comms import OP_TYPES
from rasd.core.config import read_number
from rasd.core.registry import CommRegistry, LocalComm
from rasd.services import client_port

log = logging.getLogger("rasd")

ALLREDUCE = OP_TYPES.index("AllReduce")
BROADCAST = OP_TYPES.index("Broadcast")


def _warn(problem: str) -> None:
    log.warning("rasd swarm: %s", problem)


def _hash(name: str) -> int:
    job = os.environ.get("TORCHRAS_SECRET", "")
    return int.from_bytes(hashlib.blake2b(f"{job}|{name}".encode(), digest_size=8).digest(), "big")


class SyntheticJob:
    def __init__(self, index: int, size: int, epoch: float, step_s: float) -> None:
        self.index = index
        self.epoch = epoch
        self.step_s = step_s
        self.lag = 0
        self.frozen_at: int | None = None
        self.stuck = 0
        self.registry = CommRegistry()
        self.world = self.registry.register(LocalComm(_hash("world"), size, index, ((0, size, 1),)))
        pair_first = index - index % 2
        pair_size = min(2, size - pair_first)
        self.pair = self.registry.register(
            LocalComm(_hash(f"pair{pair_first}"), pair_size, index - pair_first, ((pair_first, pair_size, 1),))
        )

    def steps(self) -> int:
        if self.frozen_at is not None:
            return self.frozen_at
        if self.step_s <= 0:
            return 0
        return max(0, math.floor((time.time() - self.epoch) / self.step_s))

    def snapshot(self):
        base = 10 + self.steps()
        world = max(0, base - self.lag)
        self.world.launched[ALLREDUCE] = world + self.stuck
        self.world.completed[ALLREDUCE] = world
        self.world.launched[BROADCAST] = self.world.completed[BROADCAST] = 1
        self.pair.launched[ALLREDUCE] = self.pair.completed[ALLREDUCE] = base
        now = time.monotonic()
        if self.frozen_at is None and self.step_s > 0:
            # The counters moved at the start of the current step: idle_ms must say so, as a real rank's would.
            moved = now - max(0.0, time.time() - (self.epoch + self.steps() * self.step_s))
            self.world.last_change = self.pair.last_change = moved
        return self.registry.snapshot(now)

    def obey(self, words: list[str]) -> bool:
        cmd, args = words[0], words[1:]
        if cmd == "lag":
            self.lag = int(args[0]) if args else 1
        elif cmd == "freeze":
            self.frozen_at = self.steps()
        elif cmd == "stuck":
            self.stuck = 1
        elif cmd == "heal":
            self.lag, self.frozen_at, self.stuck = 0, None, 0
        elif cmd == "leave-comm":
            self.registry.unregister(self.pair if args and args[0] == "pair" else self.world)
        elif cmd == "error":
            self.world.async_error = int(args[0]) if args else 2
        elif cmd == "abort":
            self.world.abort_flag = True
        elif cmd == "finalize":
            self.world.finalize_called = True
        elif cmd == "restart" and args:
            try:
                ranks = () if len(args) < 2 or args[1] == "-" else tuple(int(r) for r in args[1].split(","))
                record_restart(int(args[0]), " ".join(args[3:]), ranks, float(args[2]) if len(args) > 2 else 0.0)
            except ValueError:
                return False
        else:
            return False
        return True


def member_services(index: int) -> dict[str, Any]:
    """The member's services from the settings ``rasd swarm`` passes it; one that cannot be used is its default
    after a WARNING line."""
    size = max(index + 1, int(read_number(os.environ, "TORCHRAS_SWARM_SIZE", index + 1, _warn, minimum=1)))
    epoch = read_number(os.environ, "TORCHRAS_SWARM_EPOCH", 0.0, _warn) or time.time()
    step = read_number(os.environ, "TORCHRAS_SWARM_STEP_S", 1.0, _warn)
    job = SyntheticJob(index, size, epoch, step)
    return {"services": [client_port.serve], "local_data": job.snapshot, "obey": job.obey}
