"""Callback run once when the wrapped function completed on every rank (its errors are logged)."""

from __future__ import annotations

import abc

from .state import FrozenState


class Completion(abc.ABC):
    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        raise NotImplementedError
