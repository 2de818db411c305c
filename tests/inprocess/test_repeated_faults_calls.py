"""The Wrapper gives up on a fault that every restart meets again (``inprocess.repeated_faults``), by default.

Real calls in this process (world size 1: the Wrapper's store server and monitor process are real), as the
reference's own tests call a wrapped function: the same exception at the same line in every iteration ends the call
after 3 iterations with ``RepeatedFault`` (a ``RestartAbort``), told once and announced to the launcher; a step
beyond any before (``state.step += 1`` of an ``inprocess.elastic`` state, the README's pattern) is progress, a step
replayed after a restore is not; ``repeated_faults=None`` restarts as the reference does, until ``RetryController``.
The policy's rules without a job: tests/unit/test_repeated_faults.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import psutil
import pytest

import inprocess
from inprocess.elastic import TorchState
from inprocess.launch_events import ENVIRONMENT
from inprocess_jobs import free_ports
from test_inprocess_call import fast

pytestmark = pytest.mark.slow  # real calls: the Wrapper's store server and monitor process


@pytest.fixture(scope="module")
def port() -> int:
    return free_ports(1)[0]  # one store server for the module's calls (each call has a namespace of its own)


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch, port: int) -> int:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("TORCHRAS_ENABLE", "0")  # the mesh is not what these tests are about
    for name in ("TORCHRAS_REPEATED_FAULTS", "TORCHRAS_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    return port


def monitors() -> set[int]:
    """This process's monitor processes (children running inprocess/monitor_process.py)."""
    children = psutil.Process().children(recursive=True)
    return {child.pid for child in children if any("monitor_process.py" in part for part in child.cmdline())}


def test_the_same_exception_in_every_iteration_ends_the_call_after_three(
    one_rank: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv(ENVIRONMENT, str(events))
    iterations: list[int] = []
    state = TorchState(step=0)  # the README's pattern: the training keeps a state, so it says when it progresses

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iterations.append(call_wrapper.iteration)
        state.sync()
        raise AssertionError(f"shapes differ in iteration {call_wrapper.iteration}")  # a message that varies

    with (
        caplog.at_level(logging.ERROR, logger="inprocess.repeated_faults"),
        pytest.raises(inprocess.exception.RepeatedFault) as raised,
    ):
        train()
    assert iterations == [0, 1, 2]
    error = raised.value
    assert isinstance(error, inprocess.exception.RestartAbort) and error.code == 1 and error.count == 3
    assert str(error).startswith("AssertionError: shapes differ in iteration 2 (raised at ")
    assert "test_repeated_faults_calls.py:" in str(error) and ", in train)" in str(error)
    reports = [record for record in caplog.records if record.name == "inprocess.repeated_faults"]
    assert len(reports) == 1 and "Traceback (most recent call last)" in reports[0].getMessage()
    announced = [json.loads(line) for line in events.read_text().splitlines()]
    gave_up = [event for event in announced if event["event"] == "gave_up"]
    assert len(gave_up) == 1 and gave_up[0]["reason"].startswith("RepeatedFault: AssertionError: "), gave_up
    assert not monitors()  # nothing of the call is left


def test_steps_beyond_any_before_are_progress(one_rank: int) -> None:
    state = TorchState(step=0)

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> int:
        state.sync()  # no process group: the restore of the last commit (none: step 0)
        while state.step < 3 * (call_wrapper.iteration + 1):
            state.step += 1  # further each time: the fault comes later and later
        if call_wrapper.iteration < 5:
            raise RuntimeError("diverged")
        return call_wrapper.iteration

    assert train() == 5


def test_steps_replayed_after_a_restore_are_no_progress(one_rank: int) -> None:
    state = TorchState(step=0)
    iterations: list[tuple[int, int]] = []

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        state.sync()
        iterations.append((call_wrapper.iteration, state.step))
        while state.step < 4:
            state.step += 1
            if state.step == 2:
                state.commit()
        raise RuntimeError("the batch at step 5 is corrupt")  # met again from every restore of step 2

    with pytest.raises(inprocess.exception.RepeatedFault, match="ended 3 restart iterations"):
        train()
    assert iterations == [(0, 0), (1, 2), (2, 2)]  # iteration 0 progressed (the first of the run), 1 and 2 replayed


def test_off_it_restarts_as_the_reference_does_until_retry_controller(one_rank: int) -> None:
    iterations: list[int] = []

    @inprocess.Wrapper(
        store_kwargs={"port": one_rank},
        initialize=inprocess.initialize.RetryController(max_iterations=5),
        repeated_faults=None,
        **fast(),
    )
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iterations.append(call_wrapper.iteration)
        raise RuntimeError("always")

    with pytest.raises(inprocess.exception.RestartAbort) as raised:
        train()
    assert not isinstance(raised.value, inprocess.exception.RepeatedFault)
    assert iterations == [0, 1, 2, 3, 4]


def test_the_environment_sets_the_limit(one_rank: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHRAS_REPEATED_FAULTS", "2")
    iterations: list[int] = []

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iterations.append(call_wrapper.iteration)
        raise RuntimeError("always")

    with pytest.raises(inprocess.exception.RepeatedFault):
        train()
    assert iterations == [0, 1]


class Flaky:
    """A ``state_dict``/``load_state_dict`` object (as a scheduler or sampler is) that raises on cue."""

    def __init__(self, fail_saves: int = 0, fail_loads: int = 0) -> None:
        self.fail_saves, self.fail_loads, self.value = fail_saves, fail_loads, 0

    def state_dict(self) -> dict:
        if self.fail_saves:
            self.fail_saves -= 1
            raise OSError("no space left for the copy")
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        if self.fail_loads:
            self.fail_loads -= 1
            raise KeyError("value")
        self.value = state["value"]


def test_an_exception_inside_commit_once_recovers_from_the_commit_before(one_rank: int) -> None:
    flaky = Flaky()
    state = TorchState(sampler=flaky, step=0)

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> tuple[int, int]:
        state.sync()
        while state.step < 6:
            state.step += 1
            flaky.value = state.step
            if state.step % 2 == 0:
                if state.step == 4 and call_wrapper.iteration == 0:
                    flaky.fail_saves = 1  # the copy of step 4 fails half-way: the commit of step 2 stays whole
                state.commit()
        return call_wrapper.iteration, state.commits

    assert train() == (1, 3)  # one restart, from the commit of step 2; then steps 3 to 6 and two more commits


def test_an_exception_inside_commit_every_time_ends_the_call_with_where_it_was_raised(one_rank: int) -> None:
    flaky = Flaky()
    state = TorchState(sampler=flaky, step=0)
    flaky.fail_saves = 10**6  # every copy from now on fails

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        state.sync()
        state.step += 1
        state.commit()

    with pytest.raises(inprocess.exception.RepeatedFault) as raised:
        train()
    assert str(raised.value).startswith("OSError: no space left for the copy (raised at ")
    assert ", in state_dict)" in str(raised.value)


def test_an_exception_inside_sync_every_time_ends_the_call_with_where_it_was_raised(one_rank: int) -> None:
    flaky = Flaky()
    state = TorchState(sampler=flaky, step=0)
    iterations: list[int] = []

    @inprocess.Wrapper(store_kwargs={"port": one_rank}, **fast())
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iterations.append(call_wrapper.iteration)
        flaky.fail_loads = 10**6  # from now on, every restore fails
        state.sync()  # iteration 0: nothing to restore; after a restart its restore raises, in every iteration
        state.step += 1
        raise RuntimeError("the first step fails")

    with pytest.raises(inprocess.exception.RepeatedFault) as raised:
        train()
    # Iteration 0 progressed (step 1) and failed; 1, 2 and 3 failed in sync() with no progress: 3 in a row.
    assert iterations == [0, 1, 2, 3]
    assert str(raised.value).startswith("KeyError: 'value' (raised at ") and ", in load_state_dict)" in str(
        raised.value
    )
