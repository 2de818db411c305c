"""Callbacks run at the start of every iteration, the first included."""

from __future__ import annotations

import abc

from . import exception
from .state import FrozenState


class Initialize(abc.ABC):
    """Raising an ``Exception`` starts another restart; raising a ``BaseException`` ends the wrapper."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        raise NotImplementedError


class RetryController(Initialize):
    """Stop restarting: after ``max_iterations`` calls of the function, or when too few ranks are left.

    Raises ``RestartAbort`` (a ``BaseException``), which bypasses further restarts.
    """

    def __init__(
        self, max_iterations: int | None = None, min_world_size: int = 1, min_active_world_size: int = 1
    ) -> None:
        self.max_iterations = max_iterations
        self.min_world_size = min_world_size
        self.min_active_world_size = min_active_world_size

    def __call__(self, state: FrozenState) -> FrozenState:
        active_world_size = state.active_world_size if state.active_world_size is not None else state.world_size
        if (
            state.world_size < self.min_world_size
            or active_world_size < self.min_active_world_size
            or (self.max_iterations is not None and state.iteration >= self.max_iterations)
        ):
            raise exception.RestartAbort(
                f"{state.iteration=} {self.max_iterations=} {state.world_size=} {self.min_world_size=} "
                f"{state.active_world_size=} {self.min_active_world_size=}"
            )
        return state
