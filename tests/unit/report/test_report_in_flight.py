"""Operations in flight are not a MISMATCH: a healthy job caught while some ranks already entered the next
all-reduce must look healthy; a rank that skipped one, or a hang, must not."""

import pytest

from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, ProcessData, RankRecord
from rasd.core.peers import Addr, PeerInfo
from rasd.core.snapshot import JobSnapshot
from rasd.report.model import CommErrors, build_report

AR = OP_TYPES.index("AllReduce")


def _snapshot(ranks: list[tuple[int, int, int]], grace: float = 2.0) -> JobSnapshot:
    """ranks: (launched, completed, idle_ms) of the AllReduce counter of each rank."""
    peers, responses = [], {}
    for r, (launched, completed, idle_ms) in enumerate(ranks):
        addr = Addr("10.0.0.1", 6000 + r)
        peers.append(PeerInfo(addr, pid=r, hostname="h", incarnation=r, rank=r))
        lc, cc = [0] * N_OPS, [0] * N_OPS
        lc[AR], cc[AR] = launched, completed
        responses[addr] = ProcessData(comms=(CommRecord(7, len(ranks), (
            RankRecord(r, launched=tuple(lc), completed=tuple(cc), idle_ms=idle_ms),), ((0, len(ranks), 1),)),))
    return JobSnapshot(peers=tuple(peers), responses=responses, in_flight_grace=grace)


def mismatch(snap: JobSnapshot) -> bool:
    (comm,) = build_report(snap).communicators
    return bool(comm.errors & CommErrors.MISMATCH)


def test_leaders_inside_the_next_operation_moments_ago_are_in_flight():
    assert not mismatch(_snapshot([(42, 41, 3), (42, 41, 5), (41, 41, 180), (41, 41, 150)]))


def test_leaders_inside_it_for_longer_than_the_grace_are_a_mismatch():
    assert mismatch(_snapshot([(42, 41, 2500), (42, 41, 2600), (41, 41, 2500), (41, 41, 2700)]))


@pytest.mark.parametrize("ranks", [
    [(43, 42, 3), (41, 41, 3)],  # two operations apart
    [(42, 42, 3), (41, 41, 3)],  # ahead without being inside: not explained by an operation in flight
    [(42, 41, 3), (41, 40, 3)],  # the one behind is inside an older operation
])
def test_differences_no_operation_in_flight_explains_are_a_mismatch(ranks):
    assert mismatch(_snapshot(ranks))


def test_a_zero_grace_is_nccls_rule_any_difference_is_a_mismatch():
    assert mismatch(_snapshot([(42, 41, 3), (41, 41, 3)], grace=0.0))
