"""The ports a job's launcher and its Wrappers agree on without talking: the Wrapper's store on ``MASTER_PORT + 1``
(nvidia-resiliency-ext's examples, and ours), an application's store on ``MASTER_PORT + 2``, and the range the
kernel hands out to outgoing connections, where neither should lie: a port there can be taken by any connection of
any process between the launcher's check and the Wrapper's bind, seconds later."""

from __future__ import annotations

#: Where the kernel's ports for outgoing connections begin when it does not say (Linux's default).
EPHEMERAL_LOW = 32768


def ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections (``net.ipv4.ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW
