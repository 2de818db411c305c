"""Why an iteration was interrupted: the records that end up in the restart message.

Records only feed log and exception messages; the decision who leaves the job is driven by
``terminated_ranks`` in the store, never by these records.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Iterable

from .utils import format_rank_set_verbose


class Interruption(enum.Enum):
    EXCEPTION = enum.auto()
    BASE_EXCEPTION = enum.auto()
    SOFT_TIMEOUT = enum.auto()
    HARD_TIMEOUT = enum.auto()
    TERMINATED = enum.auto()
    UNRESPONSIVE = enum.auto()
    MONITOR_PROCESS_EXCEPTION = enum.auto()
    EXTERNAL = enum.auto()  # a verdict from an external fault source (inprocess.fault_source)


@dataclasses.dataclass(frozen=True)
class InterruptionRecord:
    rank: int
    interruption: Interruption

    def __str__(self) -> str:
        return f"InterruptionRecord(rank={self.rank}, interruption={self.interruption})"

    _PATTERN = re.compile(r"InterruptionRecord\(rank=(-?\d+), interruption=Interruption\.(\w+)\)")

    @classmethod
    def from_str(cls, text: str) -> InterruptionRecord:
        match = cls._PATTERN.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not an InterruptionRecord: {text!r}")
        return cls(int(match.group(1)), Interruption[match.group(2)])


def format_rank_set(ranks: Iterable[int]) -> str:
    """``{0-3, 7, 9-10}``: sorted ranks with runs folded into ranges (``utils.format_rank_set_verbose``)."""
    return format_rank_set_verbose(ranks)


def format_interruption_records(records: Iterable[InterruptionRecord]) -> str:
    """``Interruption.EXCEPTION affecting ranks {3}, Interruption.TERMINATED affecting ranks {2}``."""
    grouped: dict[Interruption, set[int]] = {}
    for record in records:
        grouped.setdefault(record.interruption, set()).add(record.rank)
    return ", ".join(
        f"{interruption} affecting ranks {format_rank_set(ranks)}" for interruption, ranks in grouped.items()
    )
