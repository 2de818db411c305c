"""What a worker tells ``rasd launch``, the launcher that started it: one JSON line per event in a file the launcher
names (``ENVIRONMENT``). inprocess's Wrapper (``inprocess.launch_events``) and torchras's worker entry point
(``torchras.launch.worker_main``) encode them; the launcher (``torchras.launch.main``) decodes them. Why each event
exists, and what the launcher does with it: ``inprocess/launch_events.py``.

A line is ``{<the event's fields>, "event": <name>, "time": <time.time()>, "pid": <the worker's pid>}``, a record's
fields in the order its dataclass declares them. The reader takes any JSON object and asks it with ``.get``: a line
from an older or newer worker with a field more or less is still read.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

ENVIRONMENT = "TORCHRAS_LAUNCH_EVENTS"

log = logging.getLogger(__name__)


class LaunchEvent(str, enum.Enum):
    """The events' names, as the lines spell them (a str: ``LaunchEvent.JOINED == "joined"``)."""

    #: The Wrapper runs, before its start-up barrier.
    WRAPPER_STARTING = "wrapper_starting"
    #: The Wrapper passed its start-up barrier (every initial rank met), or admitted this newcomer.
    WRAPPER = "wrapper"
    #: A replacement was admitted into the running job.
    JOINED = "joined"
    #: A replacement was refused (``reason``: ``closed``, the job completed; ``timeout``).
    JOIN_FAILED = "join_failed"
    #: The wrapped call completed.
    COMPLETED = "completed"
    #: The Wrapper gave up (``RestartAbort``): the job ends.
    GAVE_UP = "gave_up"
    #: The iteration the Wrapper runs now, with its world.
    ITERATION = "iteration"
    #: A worker without the Wrapper: its first ``init_process_group`` starts, then returned.
    PROCESS_GROUP_STARTING = "process_group_starting"
    PROCESS_GROUP = "process_group"


@dataclass(frozen=True)
class WrapperStarting:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.WRAPPER_STARTING
    newcomer: bool


@dataclass(frozen=True)
class Wrapper:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.WRAPPER
    #: Whether the Wrapper admits newcomers (``inprocess.elastic.Joining``): only then is a dead worker respawned.
    joining: bool
    newcomer: bool
    initial_rank: int | None


@dataclass(frozen=True)
class Joined:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.JOINED
    rank: int
    world_size: int
    iteration: int


@dataclass(frozen=True)
class JoinFailed:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.JOIN_FAILED
    reason: str


@dataclass(frozen=True)
class Completed:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.COMPLETED
    iteration: int


@dataclass(frozen=True)
class GaveUp:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.GAVE_UP
    reason: str


@dataclass(frozen=True)
class Iteration:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.ITERATION
    iteration: int
    rank: int | None
    world_size: int | None


@dataclass(frozen=True)
class ProcessGroupStarting:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.PROCESS_GROUP_STARTING


@dataclass(frozen=True)
class ProcessGroup:
    EVENT: ClassVar[LaunchEvent] = LaunchEvent.PROCESS_GROUP
    rank: int
    world_size: int


#: Any event a worker writes.
Record = (
    WrapperStarting
    | Wrapper
    | Joined
    | JoinFailed
    | Completed
    | GaveUp
    | Iteration
    | ProcessGroupStarting
    | ProcessGroup
)


class Announcement(TypedDict, total=False):
    """A line as the launcher reads it: the fields every line has, and those of every event (each one optional)."""

    event: str
    time: float
    pid: int
    newcomer: bool
    joining: bool
    initial_rank: int | None
    rank: int
    world_size: int
    iteration: int
    reason: str


def encode(record: Record, at: float, pid: int) -> bytes:
    """The line of ``record``, written by process ``pid`` at ``at`` (``time.time()``), newline included."""
    fields: dict[str, Any] = {field.name: getattr(record, field.name) for field in dataclasses.fields(record)}
    return (json.dumps(dict(fields, event=record.EVENT.value, time=at, pid=pid), default=str) + "\n").encode()


def decode(line: bytes) -> Announcement | None:
    """A line's announcement, or None for a line that is not a JSON object (the launcher skips it)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None  # type: ignore[return-value]


def announce(record: Record) -> None:
    """Append ``record``'s line to the file the launcher named in ``ENVIRONMENT``, if it named one: whole, with one
    ``write`` of a file opened for appending. Never raises: a full disk or a removed folder costs the launcher its
    lines, not the job its step. Both writers use it: the Wrapper (``inprocess.launch_events``) and a plain
    worker's entry point (``torchras.launch.worker_main``)."""
    path = os.environ.get(ENVIRONMENT)
    if not path:
        return
    try:
        line = encode(record, time.time(), os.getpid())
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
    except Exception as error:  # noqa: BLE001 - the launcher's lines are a courtesy, never a reason to stop training
        log.debug("could not tell the launcher about %s: %s", record.EVENT.value, error)
