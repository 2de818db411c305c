"""Horovod-style host discovery: which hosts, with how many slots (processes), should the job run on.

A discovery hook is either a callable returning ``{host: slots}`` or the path of an executable script that prints
one ``host:slots`` line per host (Horovod's ``--host-discovery-script`` format; a line without ``:slots`` means one
slot). The job asks it at commits (docs/elastic.md section 5); what it answers decides which running processes
must leave at the next round: every process on a host that is no longer listed, and on a listed host the
processes beyond its slots (the latest to join leave first). Adding capacity needs no answer from here: a process
started with ``INPROCESS_JOIN=1`` joins by itself.

Pure functions and one subprocess call; no state.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Mapping

from .. import logs

log = logs.get_logger(__name__)

Discovery = str | Callable[[], Mapping[str, int]]
HOST_ENVIRONMENT = "INPROCESS_HOST"


def this_host() -> str:
    """The host name this process is known by to the discovery hook (``INPROCESS_HOST`` overrides it)."""
    return os.environ.get(HOST_ENVIRONMENT) or socket.gethostname()


def parse(text: str) -> dict[str, int]:
    """Horovod's script output: ``host:slots`` lines (blank lines and ``#`` comments ignored)."""
    hosts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, slots = line.rpartition(":") if ":" in line else (line, "", "1")
        if not host or not slots.strip().isdigit():
            raise ValueError(f"line {number} of the discovery output is not host:slots: {line!r}")
        hosts[host.strip()] = int(slots)
    return hosts


def discover(hook: Discovery, timeout: float = 10.0) -> dict[str, int]:
    """Ask the hook. Raises (``ValueError``, ``OSError``, ``subprocess`` errors) when it cannot answer."""
    if callable(hook):
        return {str(host): int(slots) for host, slots in hook().items()}
    result = subprocess.run([hook], capture_output=True, text=True, timeout=timeout, check=True)
    return parse(result.stdout)


def removed(members: Mapping[str, str], hosts: Mapping[str, int]) -> list[str]:
    """The members (node id -> host) that must leave: hosts not listed, and on each host the members beyond its
    slots, the highest node ids (the latest to join) first::

        members {0: a, 1: a, 2: b, 3: b}, hosts {a: 2}          -> [2, 3]   (host b removed)
        members {0: a, 1: a, 2: b, 3: b}, hosts {a: 1, b: 2}    -> [1]      (host a down to one slot)
    """
    leaving: list[str] = []
    by_host: dict[str, list[str]] = {}
    for node in sorted(members):
        by_host.setdefault(members[node], []).append(node)
    for host, nodes in by_host.items():
        leaving.extend(nodes[max(0, hosts.get(host, 0)) :])
    return sorted(leaving)
