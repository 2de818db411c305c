"""Training state that survives an in-process restart in memory: Horovod Elastic's ``State`` semantics.

``commit()`` copies the state into host memory (no disk, no collective), ``restore()`` rolls the live objects back
to the last commit, ``sync()`` makes every rank equal to the most advanced surviving rank (the one with the most
commits), and reset callbacks run after every restart (docs/elastic.md, section 2).

Inside ``inprocess.Wrapper`` (docs/elastic.md, section 3):

* the first ``commit()`` or ``sync()`` in a call of the wrapped function registers the state with that call;
  at every restart the wrapper runs the state's restart hook, which restores the last commit (the main thread is
  out of the function by then, so nothing can cut the restore);
* the wrapped function calls ``state.sync()`` right after its ``init_process_group``: after a restart it restores
  (if the hook has not), picks the source rank and broadcasts, then runs the reset callbacks.

A commit cut by a fault (an exception, or ``RankShouldRestart`` delivered asynchronously between two bytecodes)
never leaves a half-written commit: the copy goes into a spare buffer, and the committed one is replaced by a
single attribute store once the copy is complete.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from .. import fault_source, logs, repeated_faults
from ..monitor_thread import RankShouldRestart
from . import snapshot, sync as sync_module

log = logs.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class Commit:
    """One committed copy of a state. ``serial`` counts commits (the progress ``sync`` compares); ``lineage`` names
    the history the commits belong to: every rank has the same once synced, and a fresh state has its own."""

    tree: Any
    serial: int
    lineage: int


@dataclasses.dataclass(frozen=True)
class SyncOutcome:
    """What one ``sync()`` did on this rank."""

    source: int  # the rank (in the group) whose state every rank now holds
    broadcast: bool  # False when every rank already held the same commit
    restored: bool  # the last commit was restored because the wrapped function was restarted
    reset: bool  # the reset callbacks ran
    commits: int  # the commit count every rank now has


def _new_lineage() -> int:
    return int.from_bytes(os.urandom(8), "big") >> 2  # 62 bits: fits a signed 64-bit tensor, negated too


class State:
    """Base class: the commit/restore/sync machinery over a tree that subclasses capture and apply."""

    def __init__(self) -> None:
        repeated_faults.state_created()  # a training that keeps a state says when it progresses
        self._reset_callbacks: list[Callable[[], Any]] = []
        # (committed, spare tree): replaced as a whole by one attribute store, never edited in place.
        self._slots: tuple[Commit, Any] = (Commit(snapshot.copy_tree(self._capture()), 0, _new_lineage()), None)
        self._seen: tuple[int, int] | None = None  # (call id, iteration) of the last sync
        self._restored_by_hook = False
        self._warned_unsynced: tuple[int, int] | None = None

    # ---- what subclasses provide ------------------------------------------------------------------------------

    def _capture(self) -> Any:
        """The live state as a tree (tensors may be the live ones: the caller copies)."""
        raise NotImplementedError

    def _apply(self, tree: Any, owned: bool) -> None:
        """Load ``tree`` into the live objects; ``owned``: the tree is a fresh copy the objects may keep."""
        raise NotImplementedError

    # ---- Horovod's API ----------------------------------------------------------------------------------------

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], Any]]) -> None:
        """Callbacks run, in order, after every restart once the state is synced (e.g. to scale the learning
        rate to the new world size, ``torch.distributed.get_world_size()``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    @property
    def commits(self) -> int:
        """How many commits the committed copy holds (sync adopts the source's count)."""
        return self._slots[0].serial

    def commit(self) -> None:
        """Keep a copy of the live state in host memory. Local: no disk, no collective."""
        call = fault_source.active_call()
        self._register(call)
        self._warn_if_unsynced(call)
        self.save()
        repeated_faults.report_progress("commit", self.commits)  # a commit beyond any before is progress
        joining = getattr(call, "joining", None)
        rank = getattr(getattr(call, "state", None), "rank", None)
        if joining is not None and call is not None:  # Horovod's host-update check (docs/elastic.md section 5)
            reason = joining.check_waiting(rank, call.iteration, self.commits)
            if reason is not None:  # a rendezvous round is due: every rank leaves here, at the same commit
                raise RankShouldRestart(reason)

    def save(self) -> None:
        committed, spare = self._slots
        tree = snapshot.copy_tree(self._capture(), spare)
        self._slots = (Commit(tree, committed.serial + 1, committed.lineage), committed.tree)

    def restore(self) -> None:
        """Roll the live objects back to the last commit (the state given to the constructor if none)."""
        self._load(self._slots[0].tree, owned=False)

    def _load(self, tree: Any, owned: bool) -> None:
        """``_apply``, marked as a load: a ``step`` it sets back (or forward, from another rank) is no progress."""
        object.__setattr__(self, "_loading", True)
        try:
            self._apply(tree, owned)
        finally:
            object.__setattr__(self, "_loading", False)

    def sync(self, group: Any = None) -> SyncOutcome:
        """Make every rank of ``group`` (default: the default process group) hold the state of the most
        advanced rank: the one with the most commits, the lowest rank among equals. Collective: every rank of
        the group calls it. Restores first and runs the reset callbacks after when the wrapped function was
        restarted since the last sync. Without a process group, only the restore and the callbacks happen."""
        call = fault_source.active_call()
        key = (id(call), call.iteration) if call is not None else (0, 0)
        restarted = self._seen is not None and call is not None and self._seen[0] == key[0] and self._seen[1] != key[1]
        restored = restarted and self._restored_by_hook
        if restarted and not self._restored_by_hook:
            self.restore()
            restored = True
        self._register(call)
        committed = self._slots[0]
        outcome = sync_module.agree_and_broadcast(
            group, committed.serial, committed.lineage, self._capture, self._receive
        )
        if outcome.broadcast:
            self._adopt(outcome.serial, outcome.lineage)
            repeated_faults.report_progress("commit", outcome.serial, counts=False)  # the source's count: no move
        elif self._seen is None and committed.serial == 0:
            self._adopt(committed.serial, committed.lineage)  # the live state is the baseline a restore goes to
        if restarted:
            self.on_reset()
        self._seen = key
        self._restored_by_hook = False
        return SyncOutcome(outcome.source, outcome.broadcast, restored, restarted, self.commits)

    # ---- the wrapper side -------------------------------------------------------------------------------------

    def _register(self, call: Any | None) -> None:
        hooks = getattr(call, "restart_hooks", None)
        if hooks is not None and self._on_restart not in hooks:
            hooks.append(self._on_restart)

    def _on_restart(self) -> None:
        """Called by the wrapper at each restart, in the main thread, outside the wrapped function."""
        try:
            self.restore()
            self._restored_by_hook = True
        except Exception:  # sync() restores again; a restart must not fail because of a state
            log.warning("restoring %s at the restart failed; sync() will try again", type(self).__name__, exc_info=True)

    def _warn_if_unsynced(self, call: Any | None) -> None:
        if call is None or self._seen is None or self._seen[0] != id(call):
            return
        key = (id(call), call.iteration)
        if key != self._seen and key != self._warned_unsynced:
            self._warned_unsynced = key
            log.warning(
                "commit() in iteration %s before sync(): call state.sync() after init_process_group so that "
                "every rank resumes from the same commit",
                call.iteration,
            )

    def _receive(self, tree: Any) -> None:
        self._load(tree, owned=True)

    def _adopt(self, serial: int, lineage: int) -> None:
        """Commit the live state under the given count and lineage (after a sync: the source's)."""
        committed, spare = self._slots
        tree = snapshot.copy_tree(self._capture(), spare)
        self._slots = (Commit(tree, serial, lineage), committed.tree)


class StepProgress:
    """``state.step += 1`` is progress (``inprocess.repeated_faults``): a state whose values are attributes."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "step" and type(value) is int:
            repeated_faults.report_progress("step", value, counts=not self.__dict__.get("_loading", False))

    if TYPE_CHECKING:  # for the type checker only: the keyword arguments are attributes, set by name in __init__

        def __getattr__(self, name: str) -> Any: ...


class ObjectState(StepProgress, State):
    """State of plain Python values, each given as a keyword argument and exposed as an attribute::

    state = ObjectState(epoch=0, batch=0)
    for state.epoch in range(state.epoch, epochs): ...
    """

    def __init__(self, **values: Any) -> None:
        for name in values:
            if name.startswith("_") or name in dir(type(self)):
                raise ValueError(f"{name!r} cannot be a state value: it starts with '_' or names a method")
        self._names = tuple(values)
        for name, value in values.items():
            setattr(self, name, value)
        super().__init__()

    def _capture(self) -> Any:
        return {"values": {name: getattr(self, name) for name in self._names}}

    def _apply(self, tree: Any, owned: bool) -> None:
        values = tree["values"] if owned else snapshot.clone_tree(tree["values"])
        for name in self._names:
            setattr(self, name, values[name])


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


class TorchState(ObjectState):
    """State of a PyTorch training process: a model, an optimizer, and any other objects with ``state_dict`` and
    ``load_state_dict`` (LR schedulers, samplers, more models) given as keywords; every other keyword is a plain
    value. Everything is exposed as an attribute::

        state = TorchState(model, optimizer, scheduler=scheduler, step=0)
    """

    def __init__(
        self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, **values: Any
    ) -> None:
        everything = {"model": model, "optimizer": optimizer, **values}
        objects = {name: value for name, value in everything.items() if value is not None and _is_stateful(value)}
        for name in everything:
            if name.startswith("_") or name in dir(ObjectState):
                raise ValueError(f"{name!r} cannot be a state value: it starts with '_' or names a method")
        self._objects = dict(objects)
        for name, value in objects.items():
            object.__setattr__(self, name, value)
        ObjectState.__init__(self, **{name: value for name, value in everything.items() if name not in objects})

    def __setattr__(self, name: str, value: Any) -> None:
        objects = self.__dict__.get("_objects")
        if objects is not None and name in objects:
            if not _is_stateful(value):
                raise TypeError(f"state.{name} must keep a state_dict()/load_state_dict() object")
            objects[name] = value
        ObjectState.__setattr__(self, name, value)

    def _capture(self) -> Any:
        tree = ObjectState._capture(self)
        tree["objects"] = {name: value.state_dict() for name, value in self._objects.items()}
        return tree

    def _apply(self, tree: Any, owned: bool) -> None:
        for name, value in self._objects.items():
            state = tree["objects"][name]
            # A module copies what it loads into its own tensors; other objects (an optimizer) keep the tensors
            # they are given, which must then not be the committed ones.
            if not owned and not isinstance(value, torch.nn.Module):
                state = snapshot.clone_tree(state)
            value.load_state_dict(state)
        ObjectState._apply(self, tree, owned)
