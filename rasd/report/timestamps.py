"""Wall-clock timestamps as the report and the events print them: local time, ``%Y-%m-%d %H:%M:%S`` (NCCL's
``%F %T``). The caller reads the clock; this only formats."""

from __future__ import annotations

import time


def format_timestamp(wall_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_time))
