"""Sort keys shared by the report: hosts, processes and addresses.

NCCL orders listed processes by host IP (IPv4 before IPv6, then the address bytes) and then by pid, never by port:
the port is an ephemeral number that means nothing to a user. These keys do the same, and also accept a host that
is not a numeric IP (it sorts after every IP, by its text) so that a malformed entry can never make a report raise.
"""

from __future__ import annotations

from rasd.core.peers import PeerInfo, addr_order, host_order

#: Order of hosts: IPv4, then IPv6, then anything else; within a family, by address bytes (one rule, in the core).
host_key = host_order
#: Order of the peer table: host, then port.
addr_key = addr_order


def process_key(peer: PeerInfo) -> tuple[int, bytes, int]:
    """Order of process listings in the report: host, then pid."""
    return (*host_key(peer.host), peer.pid)
