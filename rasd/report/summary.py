"""The job summary: how many nodes, processes and devices the job has, and how evenly they are spread.

Built from the peer table alone, so the server can send it before the gather starts. A *node* is a distinct host IP
of the mesh addresses (the port is ignored); the devices of a process are its CUDA devices, so a CPU process has 0.
Dead processes are still counted (a dead process is part of the job, and its absence is the news); processes that
*left* the job cleanly are not: they finished, and the job is now smaller.

Three consistency checks choose one of NCCL's three layouts (docs/protocol.md §3.2)::

    A  devices per process equal on every node      B  devices per process equal job-wide
    C  processes per node equal on every node

    A, B and C        one line of totals                                    (SummaryLayout.UNIFORM)
    A and B, not C    processes-per-node distribution, totals, outliers    (SummaryLayout.UNEVEN_NODES)
    not A or not B    processes-per-node and devices-per-process
                      distributions, totals                                (SummaryLayout.UNEVEN_DEVICES)

Distributions list the most common value first; ties go to the larger value.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import by_address

from .ordering import host_key_memo


class SummaryLayout(enum.Enum):
    UNIFORM = "uniform"
    UNEVEN_NODES = "uneven processes per node"
    UNEVEN_DEVICES = "uneven devices per process"


@dataclass(frozen=True)
class NodeProcesses:
    """One node: its host IP and the pids of its processes, in pid order."""

    host: str
    pids: tuple[int, ...]


@dataclass(frozen=True)
class NodeCountRow:
    """``node_count`` nodes run ``processes_per_node`` processes each (listed in ``nodes``, in host order)."""

    node_count: int
    processes_per_node: int
    nodes: tuple[NodeProcesses, ...]


@dataclass(frozen=True)
class DeviceCountRow:
    """``process_count`` processes manage ``devices_per_process`` devices each."""

    process_count: int
    devices_per_process: int


@dataclass(frozen=True)
class JobSummary:
    node_count: int
    process_count: int
    device_count: int
    #: Values of the first node and the first process (the ones the uniform layout prints).
    processes_per_node: int
    devices_per_process: int
    devices_even_within_nodes: bool  # A
    devices_even_job_wide: bool  # B
    processes_even_per_node: bool  # C
    #: Distributions, most common first (ties: larger value first).
    node_rows: tuple[NodeCountRow, ...]
    device_rows: tuple[DeviceCountRow, ...]

    @property
    def layout(self) -> SummaryLayout:
        if not (self.devices_even_within_nodes and self.devices_even_job_wide):
            return SummaryLayout.UNEVEN_DEVICES
        if not self.processes_even_per_node:
            return SummaryLayout.UNEVEN_NODES
        return SummaryLayout.UNIFORM


def _most_common_first(counts: Counter[int]) -> list[tuple[int, int]]:
    """(value, count) pairs, the largest count first, ties broken by the larger value."""
    return sorted(counts.items(), key=lambda item: (-item[1], -item[0]))


def build_job_summary(
    peers: Iterable[PeerInfo], left: Collection[Addr] = frozenset(), ordered: bool = False
) -> JobSummary:
    """Summarise the peer table; processes whose address is in ``left`` are not part of the job any more.
    ``ordered``: ``peers`` are in address order already (``by_address``'s: a ``PeerTable``'s, a snapshot's
    ``table_order``), and are not sorted again."""
    kept = (p for p in peers if p.addr not in left) if left else peers
    members = list(kept) if ordered else by_address(kept)

    # One pass over the processes (a table of 100,000 is read once): nodes in address order, devices per process.
    nodes: list[list[PeerInfo]] = []
    device_counts: Counter[int] = Counter()
    devices_even_within_nodes = True
    last_host = None
    node: list[PeerInfo] = []
    for peer in members:
        host = peer.addr.host
        held = len(peer.devices)
        device_counts[held] += 1
        if host != last_host:
            node = [peer]
            nodes.append(node)
            last_host = host
        else:
            node.append(peer)
            if held != len(node[0].devices):
                devices_even_within_nodes = False
    devices_even_job_wide = len(device_counts) <= 1
    first_size = len(nodes[0]) if nodes else 0
    processes_even_per_node = all(len(n) == first_size for n in nodes)

    nodes_by_size: dict[int, list[NodeProcesses]] = {}
    host_key = host_key_memo()
    for node in sorted(nodes, key=lambda n: host_key(n[0].host)):
        entry = NodeProcesses(node[0].host, tuple(sorted(p.pid for p in node)))
        nodes_by_size.setdefault(len(node), []).append(entry)
    node_rows = tuple(
        NodeCountRow(count, size, tuple(nodes_by_size[size]))
        for size, count in _most_common_first(Counter(len(node) for node in nodes))
    )
    device_rows = tuple(DeviceCountRow(count, devices) for devices, count in _most_common_first(device_counts))

    return JobSummary(
        node_count=len(nodes),
        process_count=len(members),
        device_count=sum(devices * count for devices, count in device_counts.items()),
        processes_per_node=len(nodes[0]) if nodes else 0,
        devices_per_process=len(members[0].devices) if members else 0,
        devices_even_within_nodes=devices_even_within_nodes,
        devices_even_job_wide=devices_even_job_wide,
        processes_even_per_node=processes_even_per_node,
        node_rows=node_rows,
        device_rows=device_rows,
    )
