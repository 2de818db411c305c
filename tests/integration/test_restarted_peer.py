"""A process restarted on its dead predecessor's exact port is a new, live peer (issue 9, item 4).

Real processes on loopback: a 4-member ``rasd swarm``, ``kill -9`` of one member, then a new member process with
the same index bound to the same mesh port (``TORCHRAS_MESH_PORT``), so it has the dead process's exact address.
The job must take it in as a new peer (before this change it was told it was dead and expelled itself), and its
report, asked on the client port, must list it among the live and its predecessor as dead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from polling import wait_for
from ras_client import ask, base_port, json_status
from rasd.swarm import Member, Swarm


def _restart_member(sw: Swarm, i: int) -> Member:
    """Start member ``i`` again, on its dead predecessor's mesh port; wait until it has written its info."""
    old = sw.members[i]
    info = sw.dir / f"member-{i}.json"
    info.unlink()
    (sw.dir / f"events-{i}.jsonl").unlink(missing_ok=True)  # the new process's events only
    env = {**sw.env, "TORCHRAS_MESH_PORT": str(old.port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rasd.swarm", "--dir", str(sw.dir), "--index", str(i)],
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    new = Member(i, proc)
    sw.members[i] = new  # the swarm's close() kills it
    sw.wait_for(lambda: info.exists() or proc.poll() is not None, 30, "the restarted member to start")
    assert proc.poll() is None, "the restarted member could not start"
    data = json.loads(info.read_text())
    new.pid, new.host, new.port = data["pid"], data["host"], data["port"]
    return new


def _report(port: int, predicate, deadline: float = 30.0) -> tuple[str, dict]:
    """The text and the JSON report, asked together until ``predicate(text, doc)`` holds. Asked again: a connection
    that landed on the process being killed, or a torn read."""
    return wait_for(
        lambda: (ask(port, b"VERBOSE STATUS\n"), json_status(port)),
        lambda both: predicate(*both),
        deadline,
        0.2,
        what="the reports",
        retry_on=(ConnectionResetError, ValueError),
    )


def _section(text: str, head: str) -> str:
    """The lines of one Errors/Warnings item, e.g. ``DEAD``, up to the blank line that ends it."""
    lines = text.splitlines()
    if head not in lines:
        return ""
    start = lines.index(head)
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return "\n".join(lines[start:end])


@pytest.mark.slow
def test_a_process_restarted_on_a_dead_predecessors_port_is_alive_and_the_predecessor_dead(port_env):
    env = port_env
    base = base_port(env)
    with Swarm(4, env=env) as sw:
        victim = 2
        old = sw.members[victim]
        survivors = [i for i in range(sw.n) if i != victim]
        sw.kill(victim)
        old.proc.wait(10)
        sw.wait_for(lambda: all(sw.saw(i, "PEER_DEAD", victim) for i in survivors), 15, "PEER_DEAD everywhere")

        new = _restart_member(sw, victim)
        assert (new.host, new.port) == (old.host, old.port) and new.pid != old.pid
        sw.wait_for(
            lambda: all(any(e["pid"] == new.pid for e in sw.events(i, "PEER_NEW")) for i in survivors),
            20,
            "every survivor to meet the new process",
        )

        def settled(text: str, doc: dict) -> bool:
            # Both reports: the text one is asked first, and may come from before the JSON one settled (a suite
            # run saw "Missing communicator data from 3 job processes" in a text report taken just before).
            pids = {r["pid"] for c in doc.get("communicators", []) for r in c["ranks"]}
            doc_settled = doc["ras"]["dead_count"] == 1 and doc["ras"]["missing_processes_count"] == 0
            return new.pid in pids and doc_settled and "Missing communicator data" not in text

        text, doc = _report(base, settled)
        pids = {r["pid"] for c in doc["communicators"] for r in c["ranks"]}
        assert pids == {m.pid for m in sw.members}  # the new process answers for rank 2; the old one is gone
        assert old.pid not in pids
        dead = _section(text, "DEAD")
        assert f"Process {old.pid} on node {old.host}" in dead and str(new.pid) not in dead, text
        assert "Missing communicator data" not in text

        time.sleep(2.5)  # past the unresponsive and hang limits at this factor: nothing turns on the newcomer
        assert sw.alive(victim)
        own = sw.events(victim, "PEER_DEAD")
        assert own and all(e["pid"] == old.pid for e in own), "the new process must hold only its predecessor dead"
        for i in survivors:
            deaths = [e for e in sw.events(i, "PEER_DEAD") if e["addr"] == old.addr]
            assert [e["pid"] for e in deaths] == [old.pid], f"member {i}: {deaths}"
            assert not any(e["pid"] == new.pid for e in sw.events(i, "PEER_HUNG") + sw.events(i, "PEER_LEFT"))
        text, doc = _report(base, settled)
        assert doc["ras"]["dead_count"] == 1
