"""Builders of job snapshots for the report tests: a job laid out node by node, and its communicators.

Conventions (so expected outputs can be written by hand): node k (from 0) has host ``10.0.0.<k+1>``; the processes
of the job are numbered 0.. across nodes; process i has pid ``1000 + i``, port ``40000 + i``, global rank i, and,
with ``gpus`` devices per process, CUDA devices ``j*gpus .. j*gpus+gpus-1`` where j is its index on its node.
"""

from __future__ import annotations

from rasd.core.comms import OP_TYPES, CommRecord, ProcessData, RankRecord, runs_of
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot

VERSION_LINE = "torchras version 0.1.0 with torch 2.13.0+cpu"
RUNTIME_LINE = "gloo backend, no CUDA"


def make_peers(processes_per_node: list[int], gpus: int | list[int] = 1) -> tuple[PeerInfo, ...]:
    peers = []
    i = 0
    for node, count in enumerate(processes_per_node):
        for j in range(count):
            n = gpus[i] if isinstance(gpus, list) else gpus
            peers.append(
                PeerInfo(
                    addr=Addr(f"10.0.0.{node + 1}", 40000 + i),
                    pid=1000 + i,
                    hostname=f"node{node + 1}",
                    incarnation=0xABC000 + i,
                    devices=tuple(range(j * n, j * n + n)),
                    rank=i,
                )
            )
            i += 1
    return tuple(peers)


def launched(**counts: int) -> tuple[int, ...]:
    """Launch counts by op type name, e.g. ``launched(AllReduce=5)``."""
    return tuple(counts.get(op, 0) for op in OP_TYPES)


def rank_record(comm_rank: int, peer: PeerInfo, **fields) -> RankRecord:
    fields.setdefault("device", peer.devices[0] if peer.devices else -1)
    return RankRecord(comm_rank=comm_rank, **fields)


def comm_records(
    peers: tuple[PeerInfo, ...],
    comm_hash: int,
    members: list[int] | None = None,
    holders: list[int] | None = None,
    per_rank: dict[int, dict] | None = None,
) -> dict[Addr, CommRecord]:
    """A communicator over the processes ``members`` (default: all), comm rank r on process ``members[r]``.

    Only processes in ``holders`` (default: all members) report it; ``per_rank`` overrides RankRecord fields.
    """
    members = list(range(len(peers))) if members is None else members
    holders = members if holders is None else holders
    per_rank = per_rank or {}
    rank_map = runs_of(members)
    out = {}
    for comm_rank, process in enumerate(members):
        if process not in holders:
            continue
        record = rank_record(comm_rank, peers[process], **per_rank.get(comm_rank, {}))
        out[peers[process].addr] = CommRecord(
            comm_hash=comm_hash, size=len(members), ranks=(record,), rank_map=rank_map
        )
    return out


def make_snapshot(
    peers: tuple[PeerInfo, ...],
    *comms: dict[Addr, CommRecord],
    dead: list[int] = (),
    left: list[int] = (),
    silent: list[int] = (),
    timeouts: int = 0,
    collection_time: float = 0.001,
) -> JobSnapshot:
    """Every process answers except the dead, left and ``silent`` ones (indices into ``peers``)."""
    quiet = {peers[i].addr for i in [*dead, *left, *silent]}
    responses = {}
    for peer in peers:
        if peer.addr in quiet:
            continue
        held = tuple(c[peer.addr] for c in comms if peer.addr in c)
        responses[peer.addr] = ProcessData(comms=held)
    return JobSnapshot(
        peers=peers,
        dead=frozenset(peers[i].addr for i in dead),
        left=frozenset(peers[i].addr for i in left),
        responses=responses,
        timeouts=timeouts,
        collection_time=collection_time,
    )


def section(text: str, title: str) -> str:
    """The body of the ``Errors`` or ``Warnings`` section of a text report."""
    if title == "Errors":
        return text.split("\nErrors\n======\n\n", 1)[1].split("Warnings\n========\n\n", 1)[0]
    return text.split("Warnings\n========\n\n", 1)[1]
