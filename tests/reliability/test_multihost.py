"""A job across hosts (network namespaces, tests/netns.py) under real network faults (issue 14, item 1).

What each test proves is in docs/reliability.md. Timers are scaled down (``TORCHRAS_TIMEOUT_FACTOR``) so that the
ladder (unresponsive, hang, dead) fits in seconds; deadlines are generous because the machine is shared.
"""

from __future__ import annotations

import time

import pytest

from multihost import HostSwarm, report_view
from netns import PROXY_PORT, Network, require_namespaces
from polling import wait_for, wait_until

pytestmark = pytest.mark.slow

F02 = {"TORCHRAS_TIMEOUT_FACTOR": "0.2", "TORCHRAS_SWARM_STEP_S": "0"}  # hang 2 s, dead 12 s
F01 = {"TORCHRAS_TIMEOUT_FACTOR": "0.1", "TORCHRAS_SWARM_STEP_S": "0"}  # hang 1 s, dead 6 s


@pytest.fixture
def net():
    require_namespaces()
    with Network(3) as network:
        yield network


def no_deaths(sw: HostSwarm) -> None:
    for i in range(sw.n):
        assert not sw.verdicts(i), f"member {i} declared {sw.verdicts(i)} dead"


def wait_for_agreement(sw: HostSwarm, hosts, expected: dict, deadline: float = 30.0) -> list[dict]:
    """Every host's report says ``expected`` (a partial report_view), within the deadline."""
    return wait_for(
        lambda: [report_view(sw.query(h)) for h in hosts],
        lambda views: all(all(v.get(k) == x for k, x in expected.items()) for v in views),
        deadline,
        0.5,
        what=f"the reports to agree on {expected}",
    )


def test_a_lossy_delayed_network_with_a_partition_and_a_pulled_cable_declares_nobody_dead(net: Network):
    h0, h1, h2 = net.hosts
    net.delay(h1, 0.03, jitter=0.02)  # before the job starts: every connection of h1 goes through the proxy
    with HostSwarm(net, 6, env=F02) as sw:
        proxied = h1.run(["ss", "-tnH", "state", "established", f"( sport = :{PROXY_PORT} )"]).stdout
        assert proxied.strip(), "h1's mesh connections should pass the delay proxy"
        net.loss(0.1)  # 10 % of packets lost on every host, for the rest of the test
        cut = net.isolate(h2)  # past the hang limit (2 s), well before the dead limit (12 s)
        sw.wait_for(
            lambda: all(sw.verdicts(i, "PEER_HUNG") >= set(sw.on(h2)) for i in sw.on(h0, h1)),
            20,
            "the partitioned host's members to be HUNG on the other side",
        )
        time.sleep(1.0)  # the partition lasts on under the HUNG verdicts (the heal must end them)
        cut.heal()
        down = net.link_down(h0)  # h0's cable pulled for 3 s
        time.sleep(3.0)
        down.heal()
        wait_for_agreement(sw, net.hosts, {"dead": 0, "missing": 0, "communicators": 4})
        sw.wait_for(
            lambda: all(sw.verdicts(i, "PEER_RECOVERED") >= set(sw.on(h2)) for i in sw.on(h0, h1)),
            20,
            "the partitioned members to recover",
        )
        no_deaths(sw)
        assert all(sw.alive(i) for i in range(sw.n))


def test_a_partition_past_the_dead_limit_gives_each_side_its_own_verdict_and_the_heal_leaves_one_job(net: Network):
    h0, h1, h2 = net.hosts
    with HostSwarm(net, 6, env=F01) as sw:
        majority, minority = sw.on(h0, h1), sw.on(h2)
        cut = net.isolate(h2)
        sw.wait_for(
            lambda: (
                all(sw.verdicts(i) == set(minority) for i in majority)
                and all(sw.verdicts(i) == set(majority) for i in minority)
            ),
            40,
            "each side to declare the other",
        )
        # Each side's report says what it cannot see, and nothing more: no split-brain within a side.
        wait_for_agreement(sw, [h0, h1], {"dead": 2, "missing": 0})
        wait_for_agreement(sw, [h2], {"dead": 4, "missing": 0})
        cut.heal()
        # The sides meet again (a probe of a dead process, rasd/core/reunion.py): the larger side keeps its
        # verdicts, and the smaller side's members learn that it holds them dead and leave the job.
        sw.wait_for(lambda: all(i in sw.verdicts(i) for i in minority), 20, "the smaller side to leave")
        for i in majority:
            assert sw.verdicts(i) == set(minority), "the heal changed the larger side's verdicts"
            assert i not in sw.verdicts(i)
        for i in minority:
            assert sw.verdicts(i) == set(majority) | {i}, "a member of the smaller side declared its own side dead"
        # One job: every host that still has members of it reports the same (h2 has none: its members left, and
        # their client port is closed).
        wait_for_agreement(sw, [h0, h1], {"dead": 2, "missing": 0})
        assert "error" in report_view(sw.query(h2, timeout=3.0))
        assert all(sw.alive(i) for i in range(sw.n))  # leaving the job is not dying: the processes run on


def test_refused_connections_are_a_death_and_the_rest_of_the_job_is_unaffected(net: Network):
    h0, h1, h2 = net.hosts
    with HostSwarm(net, 6, env=F02) as sw:
        majority, minority = sw.on(h0, h1), sw.on(h2)
        net.reject([h2], [h0, h1])
        # A reset on the connection and a refused reconnect is what a process that exited looks like: the
        # fast-death rule declares it at once, long before the dead limit (12 s).
        sw.wait_for(lambda: all(sw.verdicts(i) == set(minority) for i in majority), 20, "the fast death")
        # By the fast-death rule, not by the dead limit: the verdicts that reached the majority give its reason
        # (the first one to reach a member may also be a flood of another member's verdict, which carries none).
        reasons = {event["details"] for i in majority for event in sw.events(i, "PEER_DEAD")}
        assert "connection closed and reconnect refused" in reasons, reasons
        wait_for_agreement(sw, [h0, h1], {"dead": 2, "missing": 0})
        net.heal()
        time.sleep(2.0)  # time for the heal to change a verdict, which it must not
        for i in majority:
            assert sw.verdicts(i) == set(minority), "healing changed the majority's verdicts"
        wait_for_agreement(sw, [h0, h1], {"dead": 2, "missing": 0})
        for i in minority:
            assert not (sw.verdicts(i) & set(minority) - {i}), "the refused side declared its own host dead"


def test_a_gloo_job_across_hosts_survives_a_short_partition_and_every_host_reports_it_healthy(net, tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from multihost import CLIENT_PORT, REPO

    hosts = [net.hosts[0], net.hosts[2]]  # two ranks: each torch import costs seconds on a shared machine
    env = {
        **os.environ,
        **F02,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": net.hosts[0].ip,
        "MASTER_PORT": "29400",
        "GLOO_SOCKET_IFNAME": "eth0",
        "TORCHRAS_ADDR": f"localhost:{CLIENT_PORT}",
        "TORCHRAS_RUN_DIR": str(tmp_path / "endpoints"),
    }
    worker = str(Path(__file__).parent / "gloo_worker.py")
    procs = [
        h.popen(
            [sys.executable, worker, str(tmp_path)],
            env={**env, "RANK": str(r)},
            cwd=str(REPO),
            stdin=subprocess.DEVNULL,
        )
        for r, h in enumerate(hosts)
    ]

    def steps(rank: int) -> int:
        try:
            return json.loads((tmp_path / f"rank{rank}.json").read_text())["steps"]
        except (OSError, ValueError):
            return 0

    def wait(cond, timeout: float, what: str) -> None:
        def holds() -> bool:
            assert all(p.poll() is None for p in procs), f"a rank exited while waiting for {what}"
            return cond()

        wait_until(holds, timeout, what=what)

    wait(lambda: all(steps(r) >= 10 for r in range(2)), 120, "the job to train")
    sw = HostSwarm(net, 3, workdir=str(tmp_path))  # only for its queries and event readers; starts nothing
    with net.isolate(net.hosts[2]):
        time.sleep(3.0)  # past the hang limit (2 s), well before the dead limit (12 s)
        before = [steps(r) for r in range(2)]
    wait(lambda: all(steps(r) >= before[r] + 10 for r in range(2)), 60, "training to go on after the heal")
    wait_for_agreement(sw, hosts, {"dead": 0, "missing": 0})
    for rank in range(2):
        assert not sw.events(rank, "PEER_DEAD"), f"rank {rank} declared a death"
    assert all(p.poll() is None for p in procs)  # the ranks are killed with the network
