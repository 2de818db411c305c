"""Sort keys shared by the report: hosts, processes and addresses.

NCCL orders listed processes by host IP (IPv4 before IPv6, then the address bytes) and then by pid, never by port:
the port is an ephemeral number that means nothing to a user. These keys do the same, and also accept a host that
is not a numeric IP (it sorts after every IP, by its text) so that a malformed entry can never make a report raise.
"""

from __future__ import annotations

import ipaddress

from rasd.core.peers import Addr, PeerInfo

#: Sorts hosts that are not numeric IPs after IPv4 (4) and IPv6 (6) ones.
_NOT_AN_IP = 99


def host_key(host: str) -> tuple[int, bytes]:
    """Order of hosts: IPv4, then IPv6, then anything else; within a family, by address bytes."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return (_NOT_AN_IP, host.encode("utf-8", "surrogatepass"))
    return (ip.version, ip.packed)


def addr_key(addr: Addr) -> tuple[int, bytes, int]:
    """Order of the peer table: host, then port."""
    return (*host_key(addr.host), addr.port)


def process_key(peer: PeerInfo) -> tuple[int, bytes, int]:
    """Order of process listings in the report: host, then pid."""
    return (*host_key(peer.host), peer.pid)
