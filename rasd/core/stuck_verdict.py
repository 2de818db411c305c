"""The COMM_STUCK verdict as a value: which operation of a communicator is stuck, and who is to blame.

Belongs here: ``StuckVerdict`` alone. It is made by the stuck detector (``stuck.py``: ``attribute``) and by the
floods that carry it (``floods.py``), held by the sweeper, carried by every ``JobSnapshot`` (``snapshot.py``) and
rendered by the report; it is data (op type, operation, ranks behind, ranks inside) all the way to the JSON report,
and ``describe`` is its sentence, for events and the text report. It lives apart from the detector so that the
snapshot can carry it without importing the detector, which reads snapshots: imports go ``stuck`` -> ``snapshot``
-> ``stuck_verdict``, never back.
"""

from __future__ import annotations

from dataclasses import dataclass

from .comms import OP_TYPES
from .frames import Positions, position_text


@dataclass(frozen=True)
class StuckVerdict:
    comm_hash: int
    op: int  # index into OP_TYPES
    seq: int  # the operation the most advanced ranks launched
    behind: tuple[int, ...]  # communicator ranks that launched fewer operations of this type
    inside: tuple[int, ...]  # communicator ranks that launched an operation of this type and did not complete it
    global_behind: tuple[int, ...] = ()  # the same ranks as global ranks, where the rank map tells
    global_inside: tuple[int, ...] = ()
    #: Where each rank behind was (communicator rank, its main thread's innermost frames) in the sweep that made
    #: the verdict; empty when the processes sent no position (frames.py).
    positions: Positions = ()
    #: SLOW, not STUCK: every rank behind is working (its process's CPU or I/O moving), in a phase its code declared
    #: within that phase's limit, or waiting in another communicator's operation (stuck.py). Shown, never a restart.
    slow: bool = False
    #: The communicator ranks behind that were working when the verdict was made.
    busy: tuple[int, ...] = ()
    #: The phase a rank behind declared (``rasd.phase``), "" for none.
    phase: str = ""
    #: How long the counters had stood still, and the limit in force for an idle rank (learned from the
    #: communicator's cadence), in milliseconds, when the verdict was made.
    stood_ms: int = 0
    limit_ms: int = 0

    def describe(self) -> str:
        op = OP_TYPES[self.op]
        parts = [f"{op} operation {self.seq} {'slow' if self.slow else 'stuck'}"]
        if self.behind:
            parts.append(f"{_ranks(self.behind)} behind (not launched)")
        if self.inside:
            parts.append(f"{_ranks(self.inside)} inside it (launched, not completed)")
        if self.busy:
            parts.append(f"{_ranks(self.busy)} working (CPU or I/O moving)")
        if self.phase:
            parts.append(f"in phase {self.phase!r}")
        if self.slow and self.stood_ms:  # a STUCK verdict is made at its limit; how long a SLOW one lasted says more
            parts.append(f"no progress for {self.stood_ms / 1000:.0f} s")
        parts += [f"rank {rank} in {position_text(position, short=True)}" for rank, position in self.positions]
        return "; ".join(parts)

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.global_behind + self.global_inside))


def _ranks(ranks: tuple[int, ...]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)
