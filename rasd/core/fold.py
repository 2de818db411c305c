"""Folded communicator ranks: a gather's ranks grouped by what they hold in common.

A job's ranks mostly report the same thing: one communicator, one rank map, the same status and the same counters
(every rank of a healthy data-parallel group has launched as many all-reduces as the others). What differs from
rank to rank is small: its communicator rank, its device, how long ago its counters moved, and which process holds
it. So a gather carries each communicator's ranks *folded* (docs/architecture.md §4.1 and §11): one ``RankState``
per distinct combination of what ranks share, and per state four integer columns, a rank per row (``Members``). A
relay merges its children's folds into its own without decoding a rank; the root decodes one record per state and
four integers per rank, and the report classifies states instead of ranks. A rank's ``RankRecord`` is made only
where one is printed (``RankState.record``).

Belongs here: the values and the folding of what processes contribute (``ProcessData``) into them. The wire format
of a fold is ``wire.py``'s; the merge of a snapshot's states into communicators is ``snapshot.py``'s.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from .comms import CommRecord, ProcessData, RankRecord, mapped_rank


@dataclass(frozen=True, slots=True)
class RankState:
    """What ranks of one communicator report alike: the communicator (hash, size, rank map) and a rank's status and
    counters, less what each rank has of its own (``Members``)."""

    comm_hash: int
    size: int
    rank_map: tuple[tuple[int, int, int], ...]
    init_state: int
    async_error: int
    finalize_called: bool
    destroy_flag: bool
    abort_flag: bool
    launched: tuple[int, ...]
    completed: tuple[int, ...]

    @classmethod
    def of(cls, comm: CommRecord, rank: RankRecord) -> RankState:
        return cls(
            comm.comm_hash,
            comm.size,
            comm.rank_map,
            rank.init_state,
            rank.async_error,
            rank.finalize_called,
            rank.destroy_flag,
            rank.abort_flag,
            rank.launched,
            rank.completed,
        )

    def record(self, comm_rank: int, device: int, idle_ms: int) -> RankRecord:
        """The record of one rank in this state."""
        return RankRecord(
            comm_rank,
            self.init_state,
            self.async_error,
            self.finalize_called,
            self.destroy_flag,
            self.abort_flag,
            device,
            self.launched,
            self.completed,
            idle_ms,
        )

    def global_rank(self, comm_rank: int) -> int | None:
        """The global rank of ``comm_rank`` by this state's rank map."""
        return mapped_rank(self.rank_map, comm_rank)


def _column() -> array[int]:
    return array("q")


@dataclass(slots=True)
class Members:
    """The ranks in one state, a row each: which process holds it (an index into the processes of the fold or
    snapshot it belongs to), its communicator rank, its device and its idle time in milliseconds."""

    procs: array[int] = field(default_factory=_column)
    comm_ranks: array[int] = field(default_factory=_column)
    devices: array[int] = field(default_factory=_column)
    idle_ms: array[int] = field(default_factory=_column)

    def __len__(self) -> int:
        return len(self.comm_ranks)

    def add(self, proc: int, comm_rank: int, device: int, idle_ms: int) -> None:
        self.procs.append(proc)
        self.comm_ranks.append(comm_rank)
        self.devices.append(device)
        self.idle_ms.append(idle_ms)

    def rows(self) -> Iterable[tuple[int, int, int, int]]:
        """(process, communicator rank, device, idle ms) of each rank, in order."""
        return zip(self.procs, self.comm_ranks, self.devices, self.idle_ms, strict=True)

    def only(self, keep: Iterable[int]) -> Members:
        """The rows at the indices ``keep``, in that order."""
        out = Members()
        for i in keep:
            out.add(self.procs[i], self.comm_ranks[i], self.devices[i], self.idle_ms[i])
        return out


def raised(indices: bytes, offset: int, byteorder: Literal["little", "big"] = sys.byteorder) -> bytes:
    """``indices``, unsigned 32-bit integers in ``byteorder``, each with ``offset`` added: one addition of two
    integers as long as the column (each index a 32-bit lane of it), at C speed where a loop would make an integer
    per row. No lane carries into the next as long as every sum is below 2**32: a fold's or a snapshot's processes
    are its indices' bound (``wire.Fold.decode`` checks each against it), and they are far fewer."""
    lanes = len(indices) // 4
    total = int.from_bytes(indices, byteorder) + int.from_bytes(offset.to_bytes(4, byteorder) * lanes, byteorder)
    return total.to_bytes(len(indices), byteorder)


def raised_column(column: array[int], offset: int) -> array[int]:
    """A column of process indices (typecode ``I``) with ``offset`` added to each (``raised``)."""
    return array(column.typecode, raised(column.tobytes(), offset)) if offset else column


#: A fold's ranks: each state -> its members, in the order the states were first met.
States = dict[RankState, Members]


def fold_into(states: States, proc: int, data: ProcessData) -> None:
    """Add the ranks of ``data``, held by process ``proc``, to ``states``."""
    for comm in data.comms:
        for rank in comm.ranks:
            key = RankState.of(comm, rank)
            members = states.get(key)
            if members is None:
                members = states[key] = Members()
            members.add(proc, rank.comm_rank, rank.device, rank.idle_ms)


def unfold(states: States, count: int) -> list[tuple[CommRecord, ...]]:
    """Each of ``count`` processes' communicators, rebuilt from ``states``: one ``CommRecord`` per state a process
    has ranks in (two states of one communicator give it two records), ranks in the order they were folded."""
    out: list[list[CommRecord]] = [[] for _ in range(count)]
    for state, members in states.items():
        by_proc: dict[int, list[RankRecord]] = {}
        for proc, comm_rank, device, idle_ms in members.rows():
            by_proc.setdefault(proc, []).append(state.record(comm_rank, device, idle_ms))
        for proc, ranks in by_proc.items():
            out[proc].append(CommRecord(state.comm_hash, state.size, tuple(ranks), state.rank_map))
    return [tuple(comms) for comms in out]
