"""Callbacks run after a fault, once the function was left, before the restart health check."""

from __future__ import annotations

import abc
import datetime
from collections.abc import Callable
from typing import Any

from . import exception  # noqa: F401 - names of the reference's module
from .bounded import run_bounded
from .state import FrozenState


class Finalize(abc.ABC):
    """Any exception raised here makes the rank leave the wrapper."""

    @abc.abstractmethod
    def __call__(self, state: FrozenState) -> FrozenState:
        raise NotImplementedError


class ThreadedFinalize(Finalize):
    """Run ``fn(*args, **kwargs)`` in a daemon thread; ``exception.TimeoutError`` if it outlives ``timeout``.

    Unlike the reference it needs no CUDA: the CUDA device is selected only when CUDA is initialised.
    """

    def __init__(
        self,
        timeout: datetime.timedelta,
        fn: Callable[..., Any],
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> None:
        self.timeout = timeout
        self.fn = fn
        self.args = args
        self.kwargs = kwargs or {}

    def __call__(self, state: FrozenState) -> FrozenState:
        def run() -> None:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                import os

                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
            self.fn(*self.args, **self.kwargs)

        run_bounded(run, self.timeout, "ThreadedFinalize", f"ThreadedFinalize: {self.fn} still running")
        return state
