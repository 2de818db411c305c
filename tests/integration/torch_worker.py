"""One rank of a real gloo job for tests/integration/test_torch.py, driven by commands on its stdin.

Usage: ``python torch_worker.py OUT_DIR {explicit|plain}`` (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the
environment; the test runs 4 ranks). ``explicit`` calls ``rasd.install()`` before ``init_process_group`` and
forwards the communicator verdicts of a ``rasd.on_event`` subscription; ``plain`` never touches rasd (the script
a user runs unchanged, with or without ``python -m rasd.run``).

Protocol: the test writes one command per line; the worker does it, writes what it observed to
``OUT_DIR/rank<R>.<command>.json`` and prints ``ACK <command>``. Events print as ``EVENT <json>``. Every command
that issues collectives is sent to every rank (gloo blocks until the peers join), except where noted.

Commands:
  snap       nothing: only writes the counters
  setup      two 2-rank groups [0,1] and [2,3] (every rank calls new_group for both)
  ops        every counted op type a known number of times on the world group, one all_reduce on the rank's pair
  lag        one world all_reduce, except rank 2, which skips it and only acks (it "sleeps" before it)
  catchup    rank 2 only: the all_reduce it skipped
  asyncfail  a new group [0,1] with a 2 s timeout; rank 0 issues an async all_reduce that rank 1 never joins
  destroy    ranks 0 and 1 destroy the failed group; rank 3 (only) destroys the group [2,3]
  debugserver  torch's own per-rank debug server (the worker half of ``torch.distributed.debug``'s, port 0)
  exit       barrier, destroy_process_group, exit 0
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from pathlib import Path

OUT = Path(sys.argv[1])
MODE = sys.argv[2]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
_print_lock = threading.Lock()


def say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def write(name: str, data: dict) -> None:
    path = OUT / f"rank{RANK}.{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def registry() -> list[dict]:
    """This process's communicators as the hooks count them (none when rasd is not installed)."""
    package = sys.modules.get("rasd.torch")  # never imported here: a plain run must stay untouched
    hooks = package.installed() if package is not None else None
    if hooks is None:
        return []
    from rasd.core.comms import OP_TYPES

    return [
        {
            "hash": c.comm_hash,
            "size": c.size,
            "rank": c.rank,
            "init_state": c.init_state,
            "async_error": c.async_error,
            "launched": dict(zip(OP_TYPES, c.launched, strict=True)),
            "completed": dict(zip(OP_TYPES, c.completed, strict=True)),
        }
        for c in hooks.registry.comms()
    ]


def forward_event(event) -> None:
    say(
        "EVENT "
        + json.dumps(
            {
                "kind": str(event.kind),
                "details": event.details,
                "ranks": list(event.ranks),
                "comm_hash": event.comm_hash,
                "wall": time.time(),
            }
        )
    )


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor and friends
    import torch

    if MODE == "explicit":
        import rasd

        rasd.install()
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    if MODE == "explicit":
        rasd.on_event(forward_event, kinds={rasd.Kind.COMM_STUCK, rasd.Kind.COMM_RECOVERED}, replay=True)
    groups: dict[str, object] = {}
    say("READY")

    for line in sys.stdin:
        cmd = line.strip()
        if not cmd:
            continue
        data: dict = {}
        if cmd == "snap":
            pass
        elif cmd == "setup":
            groups["g01"] = dist.new_group([0, 1])
            groups["g23"] = dist.new_group([2, 3])
            groups["pair"] = groups["g01"] if RANK < 2 else groups["g23"]
        elif cmd == "ops":
            t = torch.ones(4)
            for _ in range(3):
                dist.all_reduce(t)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            data["after_async_wait"] = registry()
            for _ in range(2):
                dist.broadcast(t, src=1)
            dist.reduce(t, dst=0)
            dist.all_gather([torch.zeros(4) for _ in range(WORLD)], t)
            dist.all_gather_into_tensor(torch.zeros(4 * WORLD), t)
            dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * WORLD))
            dist.all_to_all_single(torch.zeros(WORLD), torch.arange(WORLD, dtype=torch.float))
            dist.gather(t, [torch.zeros(4) for _ in range(WORLD)] if RANK == 0 else None, dst=0)
            dist.scatter(torch.zeros(4), [torch.ones(4) for _ in range(WORLD)] if RANK == 3 else None, src=3)
            dist.barrier()
            # Point-to-point on a ring: isend + recv, then irecv + send: Send 2 and Recv 2 on every rank.
            nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
            w = dist.isend(torch.ones(2), nxt)
            dist.recv(torch.zeros(2), prv)
            w.wait()
            w = dist.irecv(torch.zeros(2), prv)
            dist.send(torch.ones(2), nxt)
            w.wait()
            dist.all_reduce(torch.ones(4), dist.ReduceOp.SUM, groups["pair"])  # the group passed positionally
        elif cmd == "debugserver":
            import torch.distributed.debug  # registers torch's handlers (stacks, Flight Recorder)
            from torch._C._distributed_c10d import _WorkerServer

            groups["debugserver"] = _WorkerServer("::", 0)
            data["port"] = groups["debugserver"].port  # type: ignore[attr-defined]
        elif cmd == "lag":
            if RANK != 2:
                dist.all_reduce(torch.ones(4))
        elif cmd == "catchup":
            dist.all_reduce(torch.ones(4))
        elif cmd == "asyncfail":
            groups["fail"] = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
            if RANK == 0:
                work = dist.all_reduce(torch.ones(4), group=groups["fail"], async_op=True)
                data["before_wait"] = registry()  # rank 1 never joins: it cannot have completed yet
                try:
                    work.wait()
                except Exception as e:  # noqa: BLE001 - the failure is what this command is about
                    data["error"] = f"{type(e).__name__}: {e}"[:500]
                data["after_wait"] = registry()
        elif cmd == "destroy":
            if RANK in (0, 1):
                dist.destroy_process_group(groups.pop("fail"))
            if RANK == 3:
                dist.destroy_process_group(groups.pop("g23"))
        elif cmd == "exit":
            if "debugserver" in groups:
                groups.pop("debugserver").shutdown()  # type: ignore[attr-defined]
            dist.barrier()
            dist.destroy_process_group()
            data["registry"] = registry()
            write(cmd, data)
            say("ACK exit")
            return 0
        else:
            say(f"ERROR unknown command {cmd!r}")
            continue
        data["registry"] = registry()
        data["all_reduce_file"] = dist.all_reduce.__code__.co_filename
        data["modules"] = sorted(m for m in sys.modules if m == "rasd" or m.startswith("rasd."))
        data["threads"] = sorted(t.name for t in threading.enumerate())
        write(cmd, data)
        say(f"ACK {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
