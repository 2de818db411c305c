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
        responses[addr] = ProcessData(
            comms=(
                CommRecord(
                    7,
                    len(ranks),
                    (RankRecord(r, launched=tuple(lc), completed=tuple(cc), idle_ms=idle_ms),),
                    ((0, len(ranks), 1),),
                ),
            )
        )
    return JobSnapshot(peers=tuple(peers), responses=responses, in_flight_grace=grace)


def mismatch(snap: JobSnapshot) -> bool:
    (comm,) = build_report(snap).communicators
    return bool(comm.errors & CommErrors.MISMATCH)


def test_leaders_inside_the_next_operation_moments_ago_are_in_flight():
    assert not mismatch(_snapshot([(42, 41, 3), (42, 41, 5), (41, 41, 180), (41, 41, 150)]))


def test_leaders_inside_it_for_longer_than_the_grace_are_a_mismatch():
    assert mismatch(_snapshot([(42, 41, 2500), (42, 41, 2600), (41, 41, 2500), (41, 41, 2700)]))


@pytest.mark.parametrize(
    "ranks",
    [
        [(43, 42, 3), (41, 41, 3)],  # two operations apart
        [(42, 42, 3), (41, 41, 3)],  # ahead without being inside: not explained by an operation in flight
        [(42, 41, 3), (41, 40, 3)],  # the one behind is inside an older operation
    ],
)
def test_differences_no_operation_in_flight_explains_are_a_mismatch(ranks):
    assert mismatch(_snapshot(ranks))


def test_a_zero_grace_is_nccls_rule_any_difference_is_a_mismatch():
    assert mismatch(_snapshot([(42, 41, 3), (41, 41, 3)], grace=0.0))


def _gathered(ranks: list[tuple[int, int, int]], collection_time: float) -> JobSnapshot:
    import dataclasses

    return dataclasses.replace(_snapshot(ranks), collection_time=collection_time)


def test_a_leader_that_completed_a_step_during_the_gather_is_in_flight():
    # Seen on an 8-process swarm queried every 0.2 s: every count complete, one rank one step ahead, because its
    # counters moved after the others had been read. The gather took 40 ms; the leader moved 12 ms ago.
    ranks = [(41, 41, 900)] * 7 + [(42, 42, 12)]
    assert not mismatch(_gathered(ranks, 0.040))


def test_operations_shorter_than_the_gather_can_put_ranks_read_late_several_steps_ahead():
    # Seen with 20 ms steps and a 43 ms gather: counts 432, 433 (six ranks) and 434, each moved during the gather.
    ranks = [(432, 432, 30)] + [(433, 433, 12)] * 6 + [(434, 434, 2)]
    assert not mismatch(_gathered(ranks, 0.043))
    # A gloo rank read while inside its all_reduce, another read after it finished and entered the next.
    assert not mismatch(_gathered([(41, 40, 4), (42, 41, 1)], 0.010))


@pytest.mark.parametrize(
    "ranks, collection_time",
    [
        ([(41, 41, 900), (42, 42, 60)], 0.040),  # ahead since before the gather began: not explained by its timing
        ([(41, 41, 900), (43, 43, 5), (42, 42, 70)], 0.040),  # one rank ahead since before the gather began
        ([(41, 40, 2500), (42, 42, 5)], 0.040),  # the one behind has been inside its operation too long
        ([(41, 41, 900), (42, 42, 0)], 0.0),  # no gather window (a snapshot not from a gather): NCCL's rule
    ],
)
def test_differences_the_gathers_timing_does_not_explain_are_a_mismatch(ranks, collection_time):
    assert mismatch(_gathered(ranks, collection_time))
