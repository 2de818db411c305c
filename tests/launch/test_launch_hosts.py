"""Two hosts (network namespaces, tests/netns.py), each under its own ``rasd launch``: each launcher heals its own
workers, and a whole host lost and launched again grows the job back.

Host a runs node 0 (ranks 0, 1) and serves MASTER_PORT's store; host b runs node 1 (ranks 2, 3). Rank 2 kills
itself: host b's launcher respawns it and the replacement joins (4 ranks again). Then every process of host b is
killed at once (launcher, workers, their monitor processes): the job goes on with host a's 2 ranks. A new
``rasd launch --node-rank 1`` on host b finds node 1 started before (node 0's store), starts its workers as
newcomers, and the job is back to 4 ranks, with the same model bytes on every rank, no checkpoint read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launching import HERE, REPOSITORY, Launch, records

sys.path.insert(0, str(REPOSITORY / "tests"))  # the namespace fixture

from netns import Network, require_namespaces

pytestmark = pytest.mark.slow

JOB = str(HERE / "heal_job.py")


def test_each_host_heals_its_own_workers_and_a_lost_host_comes_back(tmp_path: Path) -> None:
    require_namespaces()
    out = tmp_path / "out"
    out.mkdir()
    env = {"GLOO_SOCKET_IFNAME": "eth0", "TORCHRAS_ADDR": "127.0.0.1:28028"}
    with Network(2) as net:
        a, b = net.hosts
        common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", a.ip, "--master-port", "29500"]
        job = [JOB, "--out", str(out), "--kill", "2:8", "--steps", "30"]

        def launch(host, node_rank: int, name: str) -> Launch:
            argv = [*common, "--node-rank", str(node_rank), *job]
            return Launch(tmp_path, *argv, env=env, name=name, spawn=host.popen)

        first, second = launch(a, 0, "a"), launch(b, 1, "b")
        again = None
        try:
            second.wait_for(r"worker 0 \(pid \d+, rank 2\) ended: killed by SIGKILL; respawning it", 300)
            second.wait_for(r"worker 0 \(pid \d+\) joined the job as rank 3 of 4", 300)
            first.wait_for(r"the job trains at 4 rank\(s\) now", 120)
            # host b is lost: every process in it at once
            pids = subprocess.run(["ip", "netns", "pids", b.ns], capture_output=True, text=True).stdout.split()
            subprocess.run(["kill", "-9", *pids], check=False)
            first.wait_for(r"the job trains at 2 rank\(s\) now", 180)
            again = launch(b, 1, "b-again")
            again.wait_for(r"worker 0 started: pid \d+; it joins the running job \(this node came back\)", 120)
            again.wait_for(r"joined the job as rank \d of 4", 300, count=2)
            first.wait_for(r"the job trains at 4 rank\(s\) now", 120, count=2)
            # A few steps at 4 ranks across both hosts: the new workers' steps (pids the launcher named).
            newcomers = set(again.pids())
            first.wait_for_records(
                out, lambda r: r["event"] == "step" and r["world"] == 4 and r["pid"] in newcomers, 6, 120
            )
            (out / "finish").touch()
            assert first.wait(180) == 0, first.tail()
            assert again.wait(180) == 0, again.tail()
        finally:
            for launcher in (first, second, again):
                if launcher is not None:
                    launcher.close()
    done = [r for r in records(out) if r["event"] == "done"]
    assert len(done) == 4 and {r["world"] for r in done} == {4}, done
    assert len({r["hash"] for r in done}) == 1, done
    assert not [r for r in records(out) if r["event"] == "loaded"]
