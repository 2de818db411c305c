"""Releasing what a finished call's exceptions keep alive of the Wrapper's frames (``release_wrapper_frames``)."""

from __future__ import annotations

import inspect
import os
from typing import Any

_PACKAGE_DIRECTORY = os.path.dirname(os.path.abspath(__file__)) + os.sep  # this package
_GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def release_wrapper_frames(*errors: BaseException) -> None:
    """Clear the locals of this package's finished frames that ``errors`` (and their chains) keep alive.

    The exception a call raises reaches the caller, who may keep it (``assertRaises``, a retry loop, a report). Its
    traceback, and those of the exceptions it was raised from, keep their frames, and every frame keeps the frames
    that called it (``f_back``): without this, the wrapper's frames would keep the call's stores and sockets alive
    through them. Nothing of a call outlives it (docs/inprocess.md, section 1). The frames of the user's own code
    are left as they are, and so are frames still running and suspended generators (clearing one would close it).
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = list(errors)
    cleared: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback = current.__traceback__
        while traceback is not None:
            frame: Any = traceback.tb_frame
            while frame is not None and id(frame) not in cleared:
                cleared.add(id(frame))
                code = frame.f_code
                if code.co_filename.startswith(_PACKAGE_DIRECTORY) and not code.co_flags & _GENERATOR_FLAGS:
                    try:
                        frame.clear()
                    except RuntimeError:  # still executing (this very frame's callers): nothing to release
                        pass
                frame = frame.f_back
            traceback = traceback.tb_next
        pending += [current.__cause__, current.__context__]
