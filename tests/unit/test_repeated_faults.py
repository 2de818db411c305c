"""``rasd demo``'s rule for a fault that every restart meets (``torchras.demo_worker.RepeatedFaults``), without a job.

What one rank does at each restart, played with a store and a ``CallWrapper`` made up here: the ``finalize`` writes
the exception the Wrapper took for this rank's fault (``fn_exception``) and whether a step was completed into the
failed iteration's store, the ``initialize`` of the next iteration reads them back and counts. Giving up is the
``REPEATS``-th restart in a row caused by the same exception (type, message, the line that raised it) with no step
completed in between; a verdict's restart, a step completed or another exception starts the count again. The Wrapper
and the launcher around it are tests/acceptance/test_demo_repeats.py's.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest

from torchras.demo_worker import REPEATS, Fault, RepeatedFaults


class Store:
    """The store operations the rule uses, as torch's stores answer them."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(key in self.data for key in keys)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        if self.data.get(key, b"") == expected.encode():
            self.data[key] = desired.encode()
        return self.data[key]


@dataclasses.dataclass(frozen=True)
class State:
    """The fields of ``inprocess.FrozenState`` the rule reads."""

    iteration: int
    active_rank: int | None = 0
    fn_exception: BaseException | None = None


def raised(message: str = "Numpy is not available", kind: type[Exception] = RuntimeError) -> Exception:
    try:
        _deep_inside(kind, message)
    except kind as error:
        return error
    raise AssertionError("unreachable")


def _deep_inside(kind: type[Exception], message: str) -> None:
    raise kind(message)


def elsewhere(message: str = "Numpy is not available") -> Exception:
    try:
        raise RuntimeError(message)  # the same type and message, from another line
    except RuntimeError as error:
        return error


class Job:
    """One rank's Wrapper call, iteration after iteration: ``faults`` sees what the Wrapper would show it."""

    def __init__(self, faults: RepeatedFaults, rank: int = 0) -> None:
        self.faults = faults
        self.rank = rank
        self.call_wrapper: Any = SimpleNamespace(iteration=0, store=Store(), last_restart=None)
        self.iteration = 0
        self.faults.watch(self.call_wrapper)

    def fail(self, error: Exception | None, *, steps: int = 0, cause: str | None = None) -> Fault | None:
        """The current iteration ends: ``steps`` completed, ``error`` raised here (None: it raised elsewhere, or
        nowhere), ``cause`` the restart's first reason (default: ``error``'s, as the Wrapper records it). Then the
        restart: the finalize, the barrier, the next iteration's initialize; what the initialize gave up on."""
        for _ in range(steps):
            self.faults.step_done()
        self.faults.record(State(self.iteration, self.rank, error))
        if cause is None:
            cause = f"{type(error).__name__} on rank 1: {error}" if error else "RuntimeError on rank 1: elsewhere"
        self.iteration += 1
        self.call_wrapper.iteration = self.iteration
        self.call_wrapper.store = Store()  # the next iteration's namespace
        self.call_wrapper.last_restart = SimpleNamespace(reasons=(cause,))
        given_up = self.faults.check(State(self.iteration, self.rank))
        if given_up is None:
            self.faults.watch(self.call_wrapper)  # the function starts the next iteration
        return given_up


def test_the_same_exception_with_no_step_between_gives_up_at_the_limit() -> None:
    job = Job(RepeatedFaults())
    error = raised()
    outcomes = [job.fail(error) for _ in range(REPEATS)]
    assert outcomes[:-1] == [None] * (REPEATS - 1)
    fault = outcomes[-1]
    assert fault is not None and job.faults.gave_up == fault and job.faults.count == REPEATS
    assert (fault.kind, fault.message) == ("RuntimeError", "Numpy is not available")
    assert fault.location.endswith(", in _deep_inside") and "test_repeated_faults.py:" in fault.location
    assert fault.iteration == REPEATS - 1 and fault.rank == 0
    assert job.faults.reporter  # rank 0 says it


def test_only_rank_0_says_it() -> None:
    job = Job(RepeatedFaults(), rank=2)
    for _ in range(REPEATS):
        fault = job.fail(raised())
    assert fault is not None and not job.faults.reporter


def test_each_occurrence_counts_whichever_rank_raised_it() -> None:
    # Rank 0 sends the broadcast and never raises; the ranks that receive raise, a different one each time.
    faults = RepeatedFaults()
    job = Job(faults)
    for iteration in range(REPEATS):
        store = job.call_wrapper.store
        other = raised()
        store.compare_set(RepeatedFaults.FAULT_KEY, "", Fault.of(other, 1 + iteration % 3, iteration).to_json())
        fault = job.fail(None, cause="RuntimeError on rank 2: Numpy is not available")
    assert fault is not None and fault.rank == 3, faults.count


def test_a_completed_step_starts_the_count_again() -> None:
    job = Job(RepeatedFaults())
    error = raised()
    assert job.fail(error) is None
    assert job.fail(error, steps=1) is None  # progress: not a repeat
    assert job.faults.count == 0
    for _ in range(REPEATS - 1):
        assert job.fail(error) is None
    assert job.fail(error) is not None


def test_another_message_or_another_line_is_another_fault() -> None:
    job = Job(RepeatedFaults())
    for error in [raised(), raised("Numpy is not available!"), elsewhere(), raised(kind=ValueError), raised()]:
        assert job.fail(error) is None
        assert job.faults.count == 1


def test_a_restart_a_verdict_caused_is_not_counted() -> None:
    # A kill: the survivors' collectives fail too, but the restart is the verdict's (it comes first in the reasons).
    job = Job(RepeatedFaults())
    error = raised("Connection closed by peer")
    for _ in range(REPEATS + 1):
        assert job.fail(error, cause="PEER_DEAD of rank 2 (pid 4711 exited)") is None
    assert job.faults.count == 0


def test_the_first_exception_written_in_an_iteration_is_its_fault() -> None:
    faults = RepeatedFaults()
    job = Job(faults)
    first, second = raised(), elsewhere("Connection reset by peer")
    faults.record(State(0, 0, first))
    faults.record(State(0, 1, second))  # later, on another rank: a consequence
    stored = Fault.from_json(job.call_wrapper.store.get(RepeatedFaults.FAULT_KEY))
    assert stored.same(Fault.of(first, 5, 9)) and stored.rank == 0
    assert "Traceback (most recent call last)" in stored.traceback and stored.traceback.rstrip().endswith(str(first))


def test_nothing_is_written_for_an_iteration_the_function_did_not_start() -> None:
    faults = RepeatedFaults()
    job = Job(faults)
    faults.record(State(1, 0, raised()))  # the function never started iteration 1 here
    assert job.call_wrapper.store.data == {}


def test_a_process_that_joined_later_counts_from_its_first_iteration() -> None:
    faults = RepeatedFaults()
    assert faults.check(State(5, 0)) is None and faults.count == 0  # no iteration of its own to read yet


def test_a_store_that_fails_never_raises_into_the_wrapper() -> None:
    class Broken(Store):
        def compare_set(self, key: str, expected: str, desired: str) -> bytes:
            raise RuntimeError("store gone")

        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("store gone")

    faults = RepeatedFaults()
    job = Job(faults)
    job.call_wrapper.store = Broken()
    faults.watch(job.call_wrapper)
    faults.record(State(0, 0, raised()))  # logged, not raised: a Finalize that raises makes the rank leave
    job.iteration = 1
    job.call_wrapper.last_restart = SimpleNamespace(reasons=("RuntimeError on rank 0: Numpy is not available",))
    assert faults.check(State(1, 0)) is None and faults.count == 0


def test_the_report_says_what_where_how_often_and_why_it_stops() -> None:
    job = Job(RepeatedFaults())
    for _ in range(REPEATS):
        fault = job.fail(raised())
    assert fault is not None
    report = job.faults.report()
    first, *traceback = report.splitlines()
    assert first.startswith(f"rasd demo: RuntimeError: Numpy is not available (raised at {fault.location}) ended ")
    assert f"ended {REPEATS} restart iterations in a row, with no training step completed in between" in first
    assert "a restart does not heal it" in first and "a missing dependency" in first
    assert (
        traceback[0] == "Traceback (most recent call last):" and traceback[-1] == "RuntimeError: Numpy is not available"
    )


def test_a_fault_survives_its_trip_through_the_store() -> None:
    fault = Fault.of(raised(), 1, 2)
    assert Fault.from_json(fault.to_json()) == fault
    assert json.loads(fault.to_json())["kind"] == "RuntimeError"


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_the_limit_is_the_number_of_failed_iterations(limit: int) -> None:
    job = Job(RepeatedFaults(limit))
    outcomes = [job.fail(raised()) for _ in range(limit)]
    assert [outcome is not None for outcome in outcomes] == [False] * (limit - 1) + [True]
