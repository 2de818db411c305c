"""Callback run when a rank leaves the wrapper by an exception (after it registered at the barriers)."""

from __future__ import annotations

import abc

from .state import FrozenState


class Terminate(abc.ABC):
    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        raise NotImplementedError
