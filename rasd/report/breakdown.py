"""Breakdowns of one communicator that the Errors and Warnings sections list: who has which status, who launched
how many operations of one type, who reported which error.

Each breakdown is a list of groups, the most populous first, so a renderer only has to apply the outlier rule and
print. Ties: for statuses and counts the higher value first (NCCL); for errors the lower code first (NCCL picks the
most frequent code scanning upwards). Ranks inside a group are in communicator-rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Communicator, MissingRank, PresentRank, Status, is_error_code

#: NCCL's names of its error codes (ncclResult_t). 8 is ours: NCCL counts it but never names it.
ERROR_NAMES: dict[int, str] = {
    1: "Unhandled CUDA error",
    2: "System error",
    3: "Internal error",
    4: "Invalid argument",
    5: "Invalid usage",
    6: "Remote process error",
    7: "NCCL operation in progress",
    8: "Timeout",
}


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, "Unexpected error")


@dataclass(frozen=True)
class StatusGroup:
    """Ranks sharing one status. NOCOMM ranks are missing ranks whose process answered (or left)."""

    status: Status
    ranks: tuple[PresentRank, ...] = ()
    nocomm: tuple[MissingRank, ...] = ()

    @property
    def count(self) -> int:
        return len(self.ranks) + len(self.nocomm)


@dataclass(frozen=True)
class CountGroup:
    """Ranks that launched the same number of operations of one op type."""

    value: int
    ranks: tuple[PresentRank, ...]

    @property
    def count(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class ErrorGroup:
    """Ranks that reported the same error code."""

    code: int
    ranks: tuple[PresentRank, ...]

    @property
    def count(self) -> int:
        return len(self.ranks)

    @property
    def name(self) -> str:
        return error_name(self.code)


def status_groups(comm: Communicator) -> tuple[StatusGroup, ...]:
    by_status: dict[Status, list[PresentRank]] = {}
    for rank in comm.ranks:
        by_status.setdefault(rank.status, []).append(rank)
    groups = [StatusGroup(status, tuple(ranks)) for status, ranks in by_status.items()]
    if comm.nocomm_ranks:
        groups.append(StatusGroup(Status.NOCOMM, nocomm=comm.nocomm_ranks))
    return tuple(sorted(groups, key=lambda g: (-g.count, -int(g.status))))


def launch_count_groups(comm: Communicator, op: int) -> tuple[CountGroup, ...]:
    by_value: dict[int, list[PresentRank]] = {}
    for rank in comm.ranks:
        by_value.setdefault(rank.launched(op), []).append(rank)
    groups = [CountGroup(value, tuple(ranks)) for value, ranks in by_value.items()]
    return tuple(sorted(groups, key=lambda g: (-g.count, -g.value)))


def _error_code(rank: PresentRank, asynchronous: bool) -> int:
    return rank.record.async_error if asynchronous else rank.record.init_state


def error_rank_count(comm: Communicator, asynchronous: bool) -> int:
    """How many ranks reported an initialization (or, with ``asynchronous``, an asynchronous) error."""
    return sum(1 for rank in comm.ranks if is_error_code(_error_code(rank, asynchronous)))


def error_groups(comm: Communicator, asynchronous: bool) -> tuple[ErrorGroup, ...]:
    by_code: dict[int, list[PresentRank]] = {}
    for rank in comm.ranks:
        code = _error_code(rank, asynchronous)
        if is_error_code(code):
            by_code.setdefault(code, []).append(rank)
    groups = [ErrorGroup(code, tuple(ranks)) for code, ranks in by_code.items()]
    return tuple(sorted(groups, key=lambda g: (-g.count, g.code)))
