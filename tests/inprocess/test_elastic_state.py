"""inprocess.elastic state without processes: commit, restore, a commit cut by a fault, reset callbacks, trees."""

from __future__ import annotations

import collections
import ctypes
import threading
import time

import pytest
import torch

from inprocess.elastic import ObjectState, TorchState, snapshot


def small_training(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).sum().backward()
        optimizer.step()


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict:
    return snapshot.clone_tree(optimizer.state_dict()["state"])


def assert_trees_equal(left, right) -> None:
    if isinstance(left, torch.Tensor):
        assert torch.equal(left, right)
    elif isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            assert_trees_equal(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert type(left) is type(right) and len(left) == len(right)
        for mine, theirs in zip(left, right, strict=True):
            assert_trees_equal(mine, theirs)
    else:
        assert left == right


def test_object_state_restores_the_last_commit_and_shares_nothing_with_it() -> None:
    state = ObjectState(epoch=0, seen=[1])
    state.restore()
    assert (state.epoch, state.seen, state.commits) == (0, [1], 0)
    state.epoch, state.seen = 3, [1, 2]
    state.commit()
    state.epoch = 4
    state.seen.append(3)  # mutating the live list must not reach the commit
    state.restore()
    assert (state.epoch, state.seen, state.commits) == (3, [1, 2], 1)
    state.seen.append(9)
    state.restore()
    assert state.seen == [1, 2]


def test_state_values_cannot_shadow_the_api() -> None:
    with pytest.raises(ValueError):
        ObjectState(commit=1)
    with pytest.raises(ValueError):
        TorchState(_private=1)


def test_torch_state_restores_model_optimizer_and_values() -> None:
    model, optimizer = small_training()
    state = TorchState(model, optimizer, step=0)
    train_steps(model, optimizer, 3)
    state.step = 3
    state.commit()
    committed_model, committed_optimizer = model_tensors(model), optimizer_tensors(optimizer)
    train_steps(model, optimizer, 2)
    state.step = 5
    assert not torch.equal(model[0].weight, committed_model["0.weight"])
    state.restore()
    assert state.step == 3
    assert_trees_equal(model_tensors(model), committed_model)
    assert_trees_equal(optimizer_tensors(optimizer), committed_optimizer)
    # The optimizer keeps the tensors it loads: stepping after a restore must not change the commit.
    train_steps(model, optimizer, 2)
    state.restore()
    assert_trees_equal(model_tensors(model), committed_model)
    assert_trees_equal(optimizer_tensors(optimizer), committed_optimizer)


def test_restore_before_any_commit_gives_the_constructor_state() -> None:
    model, optimizer = small_training()
    initial = model_tensors(model)
    state = TorchState(model, optimizer, step=0)
    train_steps(model, optimizer, 2)
    state.step = 2
    state.restore()
    assert state.step == 0 and state.commits == 0
    assert_trees_equal(model_tensors(model), initial)


def test_commits_reuse_their_buffers() -> None:
    model, optimizer = small_training()
    train_steps(model, optimizer, 1)
    state = TorchState(model, optimizer)
    state.commit()
    state.commit()
    first = state._slots[0].tree["objects"]["model"]["0.weight"].data_ptr()
    state.commit()
    state.commit()
    assert state._slots[0].tree["objects"]["model"]["0.weight"].data_ptr() == first
    assert state.commits == 4


class FailingValue:
    """A plain state value whose copy fails on cue: a fault in the middle of a commit."""

    def __init__(self) -> None:
        self.fail = False

    def __deepcopy__(self, memo: dict) -> FailingValue:
        if self.fail:
            raise RuntimeError("fault during the commit")
        return FailingValue()


def test_a_commit_cut_by_an_exception_leaves_the_previous_commit_intact() -> None:
    model, optimizer = small_training()
    # The tensors are copied before the failing value ("objects" after "values" in the tree is not relied on:
    # either order leaves some part of the new copy written when the fault comes).
    state = TorchState(model, optimizer, step=0, marker=FailingValue())
    train_steps(model, optimizer, 2)
    state.step = 2
    state.commit()
    state.commit()  # two commits: both buffers hold step 2, the spare is the one the cut commit overwrites
    committed = model_tensors(model)
    train_steps(model, optimizer, 3)
    state.step = 5
    state.marker.fail = True
    with pytest.raises(RuntimeError, match="fault during the commit"):
        state.commit()
    state.marker.fail = False
    assert state.commits == 2
    state.restore()
    assert state.step == 2
    assert_trees_equal(model_tensors(model), committed)
    train_steps(model, optimizer, 1)
    state.step = 3
    state.commit()
    assert state.commits == 3
    weights = model_tensors(model)
    state.restore()
    assert state.step == 3
    assert_trees_equal(model_tensors(model), weights)


class Interrupt(BaseException):
    """Delivered asynchronously, between two bytecodes, as the wrapper delivers RankShouldRestart."""


def test_commits_cut_by_asynchronous_exceptions_are_all_or_nothing() -> None:
    """Every tensor of a consistent state holds the step number; interrupt commits at random moments.

    One exception at a time, raised only while the main thread is inside the try block (the wrapper's
    hand-shake, inprocess/monitor_thread.py, does the same so the exception never lands outside the function).
    """
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(20)])
    state = TorchState(model, step=0, history=list(range(50)))
    main = threading.get_ident()
    lock = threading.Lock()
    armed = [False]
    stop = threading.Event()

    def cancel() -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.c_void_p(0))

    def interrupter() -> None:
        while not stop.is_set():
            time.sleep(0.0007)
            with lock:
                if armed[0]:
                    armed[0] = False
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(Interrupt))

    thread = threading.Thread(target=interrupter, daemon=True)
    thread.start()
    interrupted = completed = step = 0
    deadline = time.monotonic() + 1.5
    try:
        while (time.monotonic() < deadline or interrupted < 5) and time.monotonic() < deadline + 20:
            try:
                with lock:
                    armed[0] = True
                step += 1
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.fill_(step)
                state.step = step
                state.history = list(range(step, step + 50))
                state.commit()
                with lock:
                    armed[0] = False
                    cancel()
                completed += 1
            except Interrupt:
                interrupted += 1
    finally:
        stop.set()
        thread.join()
        with lock:
            armed[0] = False
            cancel()
    assert interrupted >= 5 and completed >= 1
    state.restore()
    committed = state.step
    assert state.history == list(range(committed, committed + 50))
    for parameter in model.parameters():
        assert torch.all(parameter == committed), "a restore mixed two commits"


def test_reset_callbacks_run_in_order() -> None:
    calls: list[str] = []
    state = ObjectState(step=0)
    state.register_reset_callbacks([lambda: calls.append("a")])
    state.register_reset_callbacks([lambda: calls.append("b"), lambda: calls.append("c")])
    state.on_reset()
    assert calls == ["a", "b", "c"]


def test_sync_without_a_process_group_commits_the_baseline_and_resets_nothing() -> None:
    model, optimizer = small_training()
    state = TorchState(model, optimizer, step=0)
    calls: list[int] = []
    state.register_reset_callbacks([lambda: calls.append(1)])
    train_steps(model, optimizer, 1)  # e.g. a checkpoint loaded after the state was built
    state.step = 7
    outcome = state.sync()
    assert (outcome.source, outcome.broadcast, outcome.restored, outcome.reset) == (0, False, False, False)
    synced = model_tensors(model)
    train_steps(model, optimizer, 1)
    state.restore()
    assert state.step == 7
    assert_trees_equal(model_tensors(model), synced)
    assert calls == []


Point = collections.namedtuple("Point", "x y")


def test_trees_keep_their_shape_metadata_and_split_and_join_back() -> None:
    tree = collections.OrderedDict(
        a=torch.arange(6.0).view(2, 3),
        b=[torch.tensor([1, 2]), 3, "x"],
        c=Point(torch.ones(2, dtype=torch.float64), None),
        d={"e": torch.zeros(0)},
    )
    tree._metadata = {"": {"version": 2}}
    copied = snapshot.copy_tree(tree)
    assert type(copied) is collections.OrderedDict and copied._metadata == {"": {"version": 2}}
    assert isinstance(copied["c"], Point)
    assert_trees_equal(copied, tree)
    assert copied["a"].data_ptr() != tree["a"].data_ptr()
    skeleton, tensors = snapshot.split_tree(tree)
    assert snapshot.buffer_sizes(skeleton) == {"float32": 6, "int64": 2, "float64": 2}
    buffers = {name: snapshot.flatten(group, torch.device("cpu")) for name, group in tensors.items()}
    joined = snapshot.join_tree(skeleton, buffers)
    assert_trees_equal(joined, tree)
    assert isinstance(joined["c"], Point) and joined["b"][1:] == [3, "x"]
