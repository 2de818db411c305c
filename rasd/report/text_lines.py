"""The small strings every section of the text report is made of (docs/protocol.md §3.2).

A rank is located as ``GPU <n> managed by process <pid> on node <ip>``; a rank on the CPU shows ``CPU`` where NCCL
shows ``GPU <n>``. A missing rank did not report its device, so it shows its process's devices (``GPU 3``,
``GPUs 0,1`` or ``CPU``). A rank whose process the peer table does not know is ``[process information not found]``.
"""

from __future__ import annotations

from rasd.core.peers import PeerInfo, devices_text

from .model import MissingRank, PresentRank

PROCESS_NOT_FOUND = "[process information not found]"


def rank_device_text(device: int) -> str:
    return f"GPU {device}" if device >= 0 else "CPU"


def present_rank_location(rank: PresentRank) -> str | None:
    if rank.process is None:
        return None
    return f"{rank_device_text(rank.record.device)} managed by process {rank.process.pid} on node {rank.process.host}"


def missing_rank_location(rank: MissingRank) -> str | None:
    if rank.process is None:
        return None
    return f"{devices_text(rank.process.devices)} managed by process {rank.process.pid} on node {rank.process.host}"


def rank_line(comm_rank: int, location: str | None, verdict: str | None = None) -> str:
    """``  Rank 5 -- GPU 5 managed by ...`` or, for a group of one, ``  Rank 5 <verdict> -- GPU 5 managed by ...``."""
    subject = f"  Rank {comm_rank} {verdict}" if verdict else f"  Rank {comm_rank}"
    return f"{subject} -- {location or PROCESS_NOT_FOUND}\n"


def process_line(peer: PeerInfo) -> str:
    return f"  {peer.describe()}\n"


def unknown_processes_line(count: int) -> str:
    return f"  [could not find information on {count} process{plural_es(count)}]\n"


def plural_s(count: int) -> str:
    return "s" if count > 1 else ""


def plural_es(count: int) -> str:
    return "es" if count > 1 else ""
