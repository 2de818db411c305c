"""The Wrapper's rule for a fault that every restart meets (``inprocess.repeated_faults``), without a job.

What the ranks of a job do at each restart, played with a store made up here: before the iteration barrier each
rank records its progress and its exception into the failed iteration's store; after it, each computes the
iteration's decision from that store and the decision of the iteration before, and the first written is everyone's.
Giving up is the ``limit``-th iteration in a row that the same fault (an exception's type and the line that raised
it, or a verdict's kind and ranks) ended with no progress in between. The Wrapper around it is
tests/inprocess/test_repeated_faults_calls.py's; ``rasd demo``'s use of it tests/acceptance/test_demo_repeats.py's.
"""

from __future__ import annotations

import logging

import pytest

from inprocess import exception
from inprocess.attribution import Interruption, InterruptionRecord
from inprocess.repeated_faults import (
    DECISION_KEY,
    DEFAULT_LIMIT,
    FAULT_KEY,
    SILENT_LIMIT,
    Decision,
    Fault,
    RepeatedFaults,
    Tracker,
    resolve,
)


class Store:
    """The store operations the rule uses, as the Wrapper's stores answer them."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.records: list[InterruptionRecord] = []

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

    def get_interruption_records(self) -> list[InterruptionRecord]:
        return list(self.records)


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
    """Ranks of one call, iteration after iteration, sharing the iterations' stores as the Wrapper's ranks do."""

    def __init__(self, policy: RepeatedFaults | None = None, ranks: int = 2, speaks: bool = True) -> None:
        """``speaks``: the training can say when it progresses (it keeps an ``inprocess.elastic`` state, as the
        README's pattern does; here its trackers are told so directly)."""
        self.policy = policy or RepeatedFaults()
        self.trackers = [Tracker(self.policy) for _ in range(ranks)]
        for tracker in self.trackers:
            tracker.spoke = speaks
        self.stores = [Store()]

    @property
    def iteration(self) -> int:
        return len(self.stores) - 1

    def fail(
        self,
        error: Exception | None,
        *,
        progress_on: int | None = None,
        verdict: str | None = None,
        pings: int = 0,
    ) -> list[bool]:
        """The current iteration ends: ``error`` raised on rank 0 (and a consequence on rank 1), ``verdict`` (a
        reason such as "PEER_DEAD of rank 1 ...") recorded about rank 1; then the restart on every rank. Whether
        each rank gave up. ``pings``: how many times every rank called ``call_wrapper.ping()`` before the fault."""
        store, iteration = self.stores[-1], self.iteration
        for tracker in self.trackers:
            tracker.new_iteration()
            for _ in range(pings):
                tracker.ping()
        if progress_on is not None:
            self.trackers[progress_on].progress("call")
        reasons = []
        if verdict is not None:
            store.records.append(InterruptionRecord(1, Interruption.EXTERNAL))
            store.set("initial_rank_1", "1")
            reasons.append(verdict)
        if error is not None:
            reasons.append(f"{type(error).__name__} on rank 0: {error}")
        for rank, tracker in enumerate(self.trackers):
            tracker.record(store, error if rank == 0 else None, rank, iteration)
        if error is not None:  # rank 1's collective failed because rank 0 left: recorded later, a consequence
            self.trackers[1].record(store, elsewhere("Connection closed by peer"), 1, iteration)
        previous = self.stores[-2] if len(self.stores) > 1 else None
        decisions = [tracker.decide(store, previous, reasons, iteration) for tracker in self.trackers]
        self.stores.append(Store())
        return [decision is not None and decision.give_up for decision in decisions]

    def count(self) -> int:
        return Decision.from_json(self.stores[-2].get(DECISION_KEY), self.policy.limit).count


def test_the_same_exception_with_no_progress_between_gives_up_at_the_limit_on_every_rank_at_once() -> None:
    job = Job()
    error = raised()
    outcomes = [job.fail(error) for _ in range(DEFAULT_LIMIT)]
    assert outcomes == [[False, False]] * (DEFAULT_LIMIT - 1) + [[True, True]]
    assert job.count() == DEFAULT_LIMIT


def test_the_fault_is_the_type_and_the_line_whatever_the_message_says() -> None:
    job = Job()
    for message in ("step 1: nan", "step 2: nan", "step 3: nan"):
        outcome = job.fail(raised(message))
    assert outcome == [True, True]
    fault = Fault.from_json(job.stores[-2].get(FAULT_KEY))
    assert fault.kind == "RuntimeError" and fault.function == "_deep_inside"
    assert fault.place.endswith(f"test_repeated_faults.py:{_deep_inside.__code__.co_firstlineno + 1}")
    assert "Traceback (most recent call last)" in fault.traceback and fault.traceback.rstrip().endswith("nan")


def test_another_line_or_another_type_is_another_fault() -> None:
    job = Job()
    for error in [raised(), elsewhere(), raised(kind=ValueError), raised(), elsewhere()]:
        assert job.fail(error) == [False, False]
        assert job.count() == 1


def test_progress_on_any_rank_starts_the_count_again() -> None:
    job = Job()
    error = raised()
    assert job.fail(error) == [False, False]
    assert job.fail(error, progress_on=1) == [False, False]  # progress, then the fault: the first of a new run
    assert job.count() == 1
    for _ in range(DEFAULT_LIMIT - 2):
        assert job.fail(error) == [False, False]
    assert job.fail(error) == [True, True]


def test_a_verdict_about_the_same_rank_repeats_and_comes_before_the_exceptions_it_caused() -> None:
    job = Job()
    for _ in range(DEFAULT_LIMIT):
        outcome = job.fail(raised("Connection closed by peer"), verdict="PEER_HUNG of rank 1 (silent for 10 s)")
    assert outcome == [True, True]
    fault = Decision.from_json(job.stores[-2].get(DECISION_KEY), DEFAULT_LIMIT).fault
    assert fault is not None and (fault.kind, fault.place) == ("PEER_HUNG", "initial ranks 1")


def test_restarts_that_are_no_fault_end_a_run() -> None:
    job = Job()
    error = raised()
    for _ in range(DEFAULT_LIMIT - 1):
        job.fail(error)
    assert job.fail(None, verdict="JOIN_WAITING: 1 process(es) wait to join the job (round 2)") == [False, False]
    assert job.count() == 0
    assert job.fail(error) == [False, False]


def test_the_first_decision_written_is_everyones() -> None:
    job = Job()
    error = raised()
    job.fail(error)
    job.fail(error)
    store = job.stores[-1]
    # A record that reaches the store after the first rank decided (a late verdict) cannot split the ranks.
    first, second = job.trackers
    first.new_iteration(), second.new_iteration()
    first.record(store, error, 0, 2)
    decided = first.decide(store, job.stores[-2], [f"RuntimeError on rank 0: {error}"], 2)
    late = second.decide(store, job.stores[-2], ["PEER_DEAD of rank 3 (late)", "RuntimeError on rank 0"], 2)
    assert decided is not None and late == decided and decided.give_up and decided.by == first.token


def test_only_the_rank_whose_decision_was_written_reports_once_with_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = Job(ranks=4)
    with caplog.at_level(logging.ERROR, logger="inprocess.repeated_faults"):
        for _ in range(DEFAULT_LIMIT):
            job.fail(raised())
    reports = [record for record in caplog.records if record.name == "inprocess.repeated_faults"]
    assert len(reports) == 1, [record.getMessage() for record in reports]
    text = reports[0].getMessage()
    assert text.startswith("giving up: RuntimeError: Numpy is not available (raised at ")
    assert f"ended {DEFAULT_LIMIT} restart iterations in a row with no progress between them" in text
    assert text.rstrip().endswith("RuntimeError: Numpy is not available") and "Traceback" in text


def test_a_replayed_step_is_no_progress_a_step_beyond_is() -> None:
    tracker = Tracker(RepeatedFaults())
    for step in range(1, 11):
        tracker.progress("step", step)
    tracker.new_iteration()
    tracker.progress("step", 8, counts=False)  # restored from the commit at step 8
    tracker.progress("step", 9)
    tracker.progress("step", 10)  # replayed: no further than before
    assert not tracker.progressed
    tracker.progress("step", 11)
    assert tracker.progressed


def test_a_position_loaded_from_another_rank_is_no_progress() -> None:
    tracker = Tracker(RepeatedFaults())
    tracker.progress("commit", 40, counts=False)  # sync() from the most advanced rank
    tracker.progress("commit", 40)
    assert not tracker.progressed
    tracker.progress("commit", 41)
    assert tracker.progressed


def test_the_progress_sources_are_a_setting() -> None:
    default = Tracker(RepeatedFaults())
    assert default.policy.progress == {"step", "commit", "ping", "call"}
    without_pings = Tracker(RepeatedFaults(progress=("step", "commit")))
    for _ in range(5):
        without_pings.ping()
    assert not without_pings.progressed
    pinging = Tracker(RepeatedFaults(progress=("ping",)))
    pinging.progress("step", 5)
    assert not pinging.progressed
    pinging.ping()
    assert pinging.progressed
    explicit = Tracker(RepeatedFaults(progress=()))
    explicit.progress("call")  # call_wrapper.progress() always counts
    assert explicit.progressed


def test_the_first_progress_of_an_iteration_is_told_once() -> None:
    told: list[int] = []
    tracker = Tracker(RepeatedFaults(), lambda: told.append(1))
    for step in range(1, 5):
        tracker.progress("step", step)
    tracker.new_iteration()
    tracker.progress("step", 5)
    assert told == [1, 1]


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_the_limit_is_the_number_of_iterations(limit: int) -> None:
    job = Job(RepeatedFaults(limit))
    outcomes = [job.fail(raised())[0] for _ in range(limit)]
    assert outcomes == [False] * (limit - 1) + [True]


def test_a_store_that_fails_never_raises_into_the_wrapper() -> None:
    class Broken(Store):
        def compare_set(self, key: str, expected: str, desired: str) -> bytes:
            raise RuntimeError("store gone")

        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("store gone")

    tracker = Tracker(RepeatedFaults())
    tracker.progress("call")
    tracker.record(Broken(), raised(), 0, 0)  # logged, not raised: a rank must not leave for a count
    assert tracker.decide(Broken(), None, ["RuntimeError on rank 0: x"], 0) is None


def test_the_settings_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    policy = RepeatedFaults.from_environment({"TORCHRAS_REPEATED_FAULTS": "5", "TORCHRAS_PROGRESS": "commit,ping"})
    assert policy is not None and policy.limit == 5 and policy.progress == {"commit", "ping", "call"}
    assert RepeatedFaults.from_environment({"TORCHRAS_REPEATED_FAULTS": "0"}) is None
    with caplog.at_level(logging.WARNING, logger="inprocess.repeated_faults"):
        bad = RepeatedFaults.from_environment({"TORCHRAS_REPEATED_FAULTS": "many", "TORCHRAS_PROGRESS": "epochs"})
    assert bad is not None and bad.limit == DEFAULT_LIMIT and bad.progress == {"step", "commit", "ping", "call"}
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2 and "TORCHRAS_REPEATED_FAULTS='many'" in warnings[0], warnings
    assert resolve(None) is None
    with pytest.raises(ValueError, match="limit"):
        RepeatedFaults(limit=0)
    with pytest.raises(ValueError, match="unknown progress"):
        RepeatedFaults(progress=("epoch",))


def test_giving_up_is_a_restart_abort_and_a_quiet_exit_status_1() -> None:
    tracker = Tracker(RepeatedFaults(1))
    tracker.spoke = True
    store = Store()
    tracker.record(store, raised(), 0, 0)
    decision = tracker.decide(store, None, ["RuntimeError on rank 0: Numpy is not available"], 0)
    assert decision is not None and decision.give_up
    error = tracker.give_up(decision)
    assert isinstance(error, exception.RestartAbort) and isinstance(error, SystemExit) and error.code == 1
    assert str(error).startswith("RuntimeError: Numpy is not available (raised at ")
    assert str(error).endswith("ended 1 restart iterations in a row with no progress")


def test_pings_count_when_an_iteration_makes_more_than_the_one_before() -> None:
    """A script that pings every step and keeps no ``state.step`` (nvidia-resiliency-ext's kind): faults that come
    after ever longer training are no loop (issue 39's benchmark: three false restarts 35 s of training apart)."""
    job = Job()
    error = raised()
    for pings in (40, 80, 120, 160, 200):
        assert job.fail(error, pings=pings) == [False, False]
        assert job.count() == 1


def test_a_script_that_pings_once_at_the_top_and_then_fails_gives_up() -> None:
    job = Job()
    error = raised()
    outcomes = [job.fail(error, pings=1) for _ in range(DEFAULT_LIMIT)]
    assert outcomes == [[False, False]] * (DEFAULT_LIMIT - 1) + [[True, True]]


def test_a_fault_at_the_same_step_of_every_iteration_gives_up_however_many_pings_before_it() -> None:
    job = Job()
    error = raised("nan at step 17")
    outcomes = [job.fail(error, pings=17) for _ in range(DEFAULT_LIMIT)]
    assert outcomes == [[False, False]] * (DEFAULT_LIMIT - 1) + [[True, True]]


def test_fewer_or_as_many_pings_as_the_iteration_before_are_no_progress() -> None:
    tracker = Tracker(RepeatedFaults())
    tracker.new_iteration()
    for _ in range(10):
        tracker.ping()
    assert tracker.progressed  # the first iteration: more than none before it
    tracker.new_iteration()
    for _ in range(10):
        tracker.ping()
    assert not tracker.progressed  # as many as before: the same place
    tracker.ping()
    assert tracker.progressed  # the eleventh: further than the iteration before
    tracker.new_iteration()
    for _ in range(5):
        tracker.ping()
    assert not tracker.progressed  # fewer than the 11 before
    tracker.new_iteration()
    for _ in range(6):
        tracker.ping()
    assert tracker.progressed  # more than the 5 of the iteration before


def test_a_training_that_says_nothing_of_its_progress_gets_the_larger_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``inprocess.elastic`` state, no ``ping()``, no ``progress()`` (the reference's examples, which checkpoint
    to disk and inject random faults at one line): its restarts may be progress the rule cannot see, so it gives up
    at ``SILENT_LIMIT`` faults in a row, not at the limit."""
    monkeypatch.setattr("inprocess.repeated_faults._states", 0)
    job = Job(speaks=False)
    assert [any(job.fail(raised())) for _ in range(SILENT_LIMIT)] == [False] * (SILENT_LIMIT - 1) + [True]
    monkeypatch.setattr("inprocess.repeated_faults._states", 1)  # a state made in this process: it speaks
    job = Job(speaks=False)
    assert [any(job.fail(raised())) for _ in range(3)] == [False, False, True]


def test_a_silent_training_counts_an_exception_as_the_same_only_with_the_same_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reference's example raises at one line at random steps ("example fault at iteration=21"): with nothing
    else to tell its progress by, each message is a new fault, and the job restarts as long as they change. The same
    message every time (the same assertion before any step) still ends at ``SILENT_LIMIT``; a training that speaks
    counts by type and place alone, whatever the message."""
    monkeypatch.setattr("inprocess.repeated_faults._states", 0)
    job = Job(speaks=False)
    assert not any(any(job.fail(raised(f"example fault at iteration={step}"))) for step in range(3 * SILENT_LIMIT))
    job = Job(speaks=False)
    assert [any(job.fail(raised("same"))) for _ in range(SILENT_LIMIT)][-1]
    monkeypatch.setattr("inprocess.repeated_faults._states", 1)
    job = Job(speaks=False)
    assert [any(job.fail(raised(f"at {step}"))) for step in range(3)] == [False, False, True]


def test_a_stuck_communicator_is_the_same_fault_only_at_the_same_operation_with_the_same_rank_behind() -> None:
    """Every rank is named by a COMM_STUCK (behind or inside): the fault is the operation and who is behind it. A
    rank that wedges at random steps (a flaky data loader) is healed every time; a hang met at the same operation
    after every restart gives up."""

    def stuck(op: int, behind: int) -> str:
        return (
            f"COMM_STUCK on communicator 00000000000000ab: AllReduce operation {op} stuck; rank {behind} behind (not "
            f"launched); ranks 0,1,3 inside it (launched, not completed)"
        )

    job = Job()
    assert not any(any(job.fail(None, verdict=stuck(op, 2))) for op in (5, 9, 14, 3, 8))
    assert [any(job.fail(None, verdict=stuck(5, 2))) for _ in range(3)] == [False, False, True]
