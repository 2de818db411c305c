"""Sort keys shared by the report: hosts, processes and addresses.

NCCL orders listed processes by host IP (IPv4 before IPv6, then the address bytes) and then by pid, never by port:
the port is an ephemeral number that means nothing to a user. These keys do the same, and also accept a host that
is not a numeric IP (it sorts after every IP, by its text) so that a malformed entry can never make a report raise.

Parsing an IP is the slow part of these keys, and a job has several processes per host: ``by_process`` sorts a
listing with each host parsed once (``host_key_memo``), as ``rasd.core.snapshot.by_address`` sorts the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from rasd.core.peers import PeerInfo, addr_order, host_order

#: Order of hosts: IPv4, then IPv6, then anything else; within a family, by address bytes (one rule, in the core).
host_key = host_order
#: Order of the peer table: host, then port.
addr_key = addr_order

T = TypeVar("T")


def process_key(peer: PeerInfo) -> tuple[int, bytes, int]:
    """Order of process listings in the report: host, then pid."""
    return (*host_key(peer.host), peer.pid)


def host_key_memo() -> Callable[[str], tuple[int, bytes]]:
    """``host_key``, each host worked out once per key function made here."""
    hosts: dict[str, tuple[int, bytes]] = {}

    def key(host: str) -> tuple[int, bytes]:
        known = hosts.get(host)
        if known is None:
            known = hosts[host] = host_key(host)
        return known

    return key


def by_process(items: Iterable[T], peer: Callable[[T], PeerInfo]) -> list[T]:
    """``items`` sorted by ``process_key`` of ``peer(item)`` (stable, as ``sorted``)."""
    host = host_key_memo()

    def key(item: T) -> tuple[int, bytes, int]:
        p = peer(item)
        h = host(p.host)
        return (h[0], h[1], p.pid)

    return sorted(items, key=key)


def processes(peers: Iterable[PeerInfo]) -> tuple[PeerInfo, ...]:
    """``peers`` in process-listing order (``process_key``)."""
    return tuple(by_process(peers, _itself))


def _itself(peer: PeerInfo) -> PeerInfo:
    return peer
