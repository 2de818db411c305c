"""Many hosts, any host: a job over 3 hosts loses the host of rank 0 and trains on.

Hosts are network namespaces on one bridge (tests/netns.py). Each host runs one member of a 3-member etcd
cluster (the Wrapper's store, ``inprocess.etcd_store.EtcdStore``) and 2 ranks of a gloo job whose process groups
are built on ``call_wrapper.store``. The host of initial ranks 0 and 1 is then cut off: every process in it is
killed (trainers, monitor processes, its etcd member) and its link goes down, so the survivors see silence, not
resets. The etcd majority keeps serving, the survivors' monitor processes find the two ranks' heartbeats stopped,
and the 4 remaining ranks restart and finish.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import etcd_cluster
from inprocess_jobs import Job
from polling import wait_until
from test_inprocess_jobs import events, started

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the namespace fixture

from netns import Network, require_namespaces

pytestmark = pytest.mark.slow

JOB_DEADLINE = 300  # seconds: 6 trainers and 6 monitor processes import torch on 2 busy cores
PROBE = (
    "import sys, time; sys.path[:0] = [{path!r}, {path!r} + '/..']; import etcd_cluster; "
    "etcd_cluster.wait_healthy({endpoint!r}, time.monotonic() + 60)"
)


def test_losing_the_host_of_rank_0_leaves_four_ranks_training(tmp_path):
    require_namespaces()
    etcd_cluster.require_etcd()
    with Network(3) as net:
        members = [etcd_cluster.Member(f"m{host.index}", host.ip, 2379, 2380) for host in net.hosts]
        cluster = etcd_cluster.start(members, spawns=[host.popen for host in net.hosts])
        try:
            for host, member in zip(net.hosts, members, strict=True):
                probe = PROBE.format(path=str(Path(__file__).parent), endpoint=member.endpoint)
                host.run([sys.executable, "-c", probe], timeout=90)
            h0, h1, h2 = net.hosts
            job = Job(
                6,
                tmp_path,
                {
                    "steps": 150,  # iteration 0 outlasts the start-up skew, the 1 s below and the kill
                    "restart_steps": 20,  # the survivors' iteration: 20 all-reduces across the two hosts left
                    "step_sleep": 0.05,
                    "step_events": True,
                    "user_store": True,
                    "etcd": {"endpoints": cluster.endpoints, "prefix": f"/multihost/{time.monotonic_ns()}"},
                    "wrapper": {
                        "heartbeat_interval": 0.5,
                        "heartbeat_timeout": 10,
                        "soft_timeout": 15,
                        "hard_timeout": 30,
                        "barrier_timeout": 120,
                    },
                },
                hosts=[h0, h0, h1, h1, h2, h2],
                environment={"GLOO_SOCKET_IFNAME": "eth0"},
            ).start()
            try:
                deadline = time.monotonic() + JOB_DEADLINE

                def trained(rank: int) -> bool:  # a few collectives across all three hosts
                    return any(e["event"] == "step" and e["step"] >= 5 for e in job.events(rank))

                def all_trained() -> bool:
                    assert all(p.poll() is None for p in job.processes), f"a rank died early\n{job.diagnostics()}"
                    return all(trained(rank) for rank in range(6))

                wait_until(all_trained, JOB_DEADLINE, 0.2, what=lambda: f"the job to train\n{job.diagnostics()}")
                net.link_down(h0)
                pids = subprocess.run(["ip", "netns", "pids", h0.ns], capture_output=True, text=True).stdout.split()
                subprocess.run(["kill", "-9", *pids], check=False)
                codes = job.wait(max(1.0, deadline - time.monotonic()), ranks=[2, 3, 4, 5])
                assert codes == [0, 0, 0, 0], f"the survivors did not finish: {codes}\n{job.diagnostics()}"
                restarted = [started(job, rank, 1) for rank in (2, 3, 4, 5)]
                assert [entry["rank"] for entry in restarted] == [0, 1, 2, 3]
                assert {entry["world_size"] for entry in restarted} == {4}
                assert all(events(job, rank, "done")[-1]["world_size"] == 4 for rank in (2, 3, 4, 5))
            finally:
                job.kill()
        finally:
            cluster.close()
