"""STACKS on a swarm of 64 real processes (issue 28): every member answers within the gather's limit, the 64 identical
main threads fold into one stack, and a stopped member is listed as not answering while the others still answer."""

from __future__ import annotations

import json
import re

import pytest

from ras_client import ask, base_port, wait_for_report
from rasd.swarm import Swarm

pytestmark = pytest.mark.slow  # 64 processes

MEMBERS = 64
#: The client's gather timeout: a member that does not answer is given up on after this (plus the hard extra).
TIMEOUT_S = 3


def test_sixty_four_members_answer_stacks_within_the_limit_and_a_stopped_one_is_named(port_env):
    with Swarm(MEMBERS, env=port_env) as sw:
        port = base_port(port_env)
        wait_for_report(port, lambda r: "RUNNING      OK" in r, 120)
        text = ask(port, f"TIMEOUT {TIMEOUT_S}\nSTACKS\n".encode(), timeout=60)
        assert text.startswith(f"OK\nStacks of {MEMBERS} of {MEMBERS} processes (main threads)"), text
        assert re.search(rf"^ranks 0,1,2,.*\.\.\. \({MEMBERS} processes on ", text, re.MULTILINE), text
        # Every member answered within the gather's limit: a leg that timed out would leave its members unanswered.
        assert "Not answering" not in text

        doc = json.loads(ask(port, b"SET FORMAT json\nSTACKS ALL RANKS 5-7\n", timeout=60).removeprefix("OK\n"))
        groups = doc["stacks"]["groups"]
        assert {p["rank"] for g in groups for p in g["processes"]} == {5, 6, 7}
        assert any("MainThread" in g["threads"] for g in groups) and any(
            "torchras-rasd" in g["threads"] for g in groups
        )

        victim = sw.members[40]
        sw.pause(victim.index)
        try:
            text = ask(port, f"TIMEOUT {TIMEOUT_S}\nSTACKS\n".encode(), timeout=60, handshake_timeout=0.5)
            assert f"Stacks of {MEMBERS - 1} of {MEMBERS} processes" in text, text
            assert re.search(rf"^    rank 40 \(\S+:{victim.pid}\): ", text, re.MULTILINE), text
        finally:
            sw.resume(victim.index)
