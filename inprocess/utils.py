"""Small helpers the reference's ``inprocess.utils`` offers, under the same names: rank sets and exceptions for log
lines, timing a block at debug level, the nearest handler of a logger, a torch version test.

Nothing here imports torch at module level (the monitor process imports this package's torch-free modules).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import inspect
import logging
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from . import logs

#: ``NVRX_LOG_RANK_FORMAT_VERBOSE`` (the reference's switch): every rank as ranges, not the first and last four.
VERBOSE_ENVIRONMENT = "NVRX_LOG_RANK_FORMAT_VERBOSE"
_TRUE = ("1", "true", "yes", "on")


def torch_older_than(version: str) -> bool:
    """Whether the installed torch is older than ``version`` (``"2.6"``, ``"2.6.0a0"``)."""
    import torch

    return torch.torch_version.TorchVersion(torch.__version__) < version


def format_exc(exc: BaseException) -> str:
    """An exception in one short piece, for a log line: its ``repr``."""
    return repr(exc)


def format_rank_set_verbose(ranks: Iterable[int]) -> str:
    """``{1-3, 5, 7-9}``: every rank, runs folded into ranges."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = index
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        parts.append(str(ordered[start]) if start == index else f"{ordered[start]}-{ordered[index]}")
        index += 1
    return "{" + ", ".join(parts) + "}"


def format_rank_set_brief(ranks: Iterable[int], max_show: int = 8) -> str:
    """``{0, 1, 2}``; over ``max_show`` ranks, the first and last four and the count:
    ``{0, 1, 2, 3...12, 13, 14, 15 (total: 16)}``."""
    ordered = sorted(ranks)
    if len(ordered) <= max_show:
        return "{" + ", ".join(map(str, ordered)) + "}"
    first, last = ", ".join(map(str, ordered[:4])), ", ".join(map(str, ordered[-4:]))
    return f"{{{first}...{last} (total: {len(ordered)})}}"


def format_rank_set(ranks: Iterable[int]) -> str:
    """Brief (``format_rank_set_brief``), or every rank as ranges when ``NVRX_LOG_RANK_FORMAT_VERBOSE`` is on."""
    if os.environ.get(VERBOSE_ENVIRONMENT, "").strip().lower() in _TRUE:
        return format_rank_set_verbose(ranks)
    return format_rank_set_brief(ranks)


def log_exc(rank_or_state: Any, exc: BaseException, name: str) -> str:
    """``[2026-01-02 03:04:05.678901] rank=3 fn_ex: RuntimeError('...')``: the text of a log line about ``exc``
    (UTC time; ``rank_or_state`` is a rank or anything with a ``rank``)."""
    timestamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    rank = rank_or_state if isinstance(rank_or_state, int) else getattr(rank_or_state, "rank", None)
    return f"[{timestamp}] rank={rank} {name}: {format_exc(exc)}"


@contextlib.contextmanager
def _log_exec(name: str, logger: logging.Logger) -> Iterator[None]:
    rank = os.environ.get("RANK", "0")
    logger.debug("rank=%s starts execution: %s", rank, name)
    start = time.perf_counter()
    try:
        yield
    finally:
        logger.debug("rank=%s ends execution: %s [elapsed=%.4e]", rank, name, time.perf_counter() - start)


def log_exec(target: Any) -> Any:
    """Time a function (as a decorator) or a block (``with log_exec("name"):``) at debug level, on the logger of
    the caller's module."""
    if callable(target):
        name = f"{target.__module__}.{target.__qualname__}"
        logger = logs.get_logger(target.__module__)

        @functools.wraps(target)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with _log_exec(name, logger):
                return target(*args, **kwargs)

        return timed
    frame = inspect.currentframe()
    try:
        caller = frame.f_back if frame is not None else None
        module = caller.f_globals.get("__name__", __name__) if caller is not None else __name__
    finally:
        del frame
    return _log_exec(str(target), logs.get_logger(module))


def find_nearest_handler(logger: logging.Logger, handler_cls: type | tuple) -> logging.Handler | None:
    """The first handler of class ``handler_cls`` on ``logger`` or the ancestors its records propagate to."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if isinstance(handler, handler_cls):
                return handler
        if not current.propagate:
            break
        current = current.parent
    return None


class Logging:
    """The reference's older, opt-in logging set-up (its usage guide's "Logging" section): ``initialize()`` gives
    the ``inprocess`` logger the stream handlers of its nearest ancestor that has any (``nvrx``, else the root) and
    stops its records propagating, so they are printed once; ``deinitialize()`` undoes it. Nothing calls it for
    you."""

    @classmethod
    def initialize(cls) -> None:
        logger = logging.getLogger(logs.PACKAGE_LOGGER)
        streams: list[logging.Handler] = []
        parent = logger.parent
        while parent is not None and not streams:
            streams = [handler for handler in parent.handlers if type(handler) is logging.StreamHandler]
            parent = parent.parent
        logger.propagate = False
        if streams:
            for handler in streams:
                if handler not in logger.handlers:
                    logger.addHandler(handler)
        else:
            warnings.warn("logging not initialized, logs are disabled", stacklevel=2)
            logger.addHandler(logging.NullHandler())
        logger.debug("logging initialized level=%s handlers=%s", logger.getEffectiveLevel(), logger.handlers)

    @classmethod
    def deinitialize(cls) -> None:
        logger = logging.getLogger(logs.PACKAGE_LOGGER)
        logger.debug("deinitialize logging")
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


__all__ = [
    "Logging",
    "find_nearest_handler",
    "format_exc",
    "format_rank_set",
    "format_rank_set_brief",
    "format_rank_set_verbose",
    "log_exc",
    "log_exec",
    "torch_older_than",
]
