"""The state of one rank inside the wrapper: its ranks, its mode and the restart iteration."""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Iterable
from typing import Any


class Mode(enum.Enum):
    """What a rank does in the current iteration."""

    INITIALIZED = enum.auto()  # before the first rank assignment
    ACTIVE = enum.auto()  # calls the wrapped function
    INACTIVE = enum.auto()  # an idle reserve rank, waits for the iteration to end
    TERMINATED = enum.auto()  # left the job (used by Tree)


@dataclasses.dataclass
class State:
    """Mutable state of one rank; callbacks receive its frozen copy (``FrozenState``).

    ``rank``/``world_size`` number the ranks the wrapper still knows about; ``active_rank``/``active_world_size``
    are what the wrapped function sees (``None`` for a reserve rank). ``fn_exception`` is the exception the wrapped
    function raised on *this* rank in the iteration that just ended; ``None`` when the restart came from elsewhere.
    """

    rank: int | None
    world_size: int
    active_rank: int | None = None
    active_world_size: int | None = None
    initial_rank: int | None = None
    initial_world_size: int | None = None
    iteration: int = 0
    mode: Mode = Mode.INITIALIZED
    fn_exception: BaseException | None = None

    def __post_init__(self) -> None:
        if self.initial_rank is None:
            self.initial_rank = self.rank
        if self.initial_world_size is None:
            self.initial_world_size = self.world_size

    @classmethod
    def from_env(cls) -> State:
        return cls(rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)))

    def set_distributed_vars(self) -> None:
        """Export the active rank and world size as ``RANK``/``WORLD_SIZE`` (``"None"`` on reserve ranks)."""
        os.environ["RANK"] = str(self.active_rank)
        os.environ["WORLD_SIZE"] = str(self.active_world_size)

    def advance(self) -> None:
        self.iteration += 1
        self.fn_exception = None

    def freeze(self) -> FrozenState:
        return FrozenState(**{field.name: getattr(self, field.name) for field in dataclasses.fields(State)})

    def copy_from(self, other: Any, fields: Iterable[str] | None = None) -> None:
        names = list(fields) if fields is not None else [field.name for field in dataclasses.fields(State)]
        for name in names:
            setattr(self, name, getattr(other, name))


def freeze_dataclass(cls: type) -> type:
    """A frozen dataclass ``Frozen<name>`` with the fields of the dataclass ``cls``, in its order (the reference's
    helper; ``FrozenState`` below is written out instead, so that a type checker sees its fields)."""
    fields = [(field.name, field.type, field) for field in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(f"Frozen{cls.__name__}", fields, frozen=True)


@dataclasses.dataclass(frozen=True)
class FrozenState:
    """Read-only copy of ``State`` handed to every callback; assigning raises FrozenInstanceError.

    Its fields are State's, in State's order (``State.freeze`` copies them by name; a test holds the two lists
    equal). Written out rather than derived, so that a type checker sees them."""

    rank: int | None
    world_size: int
    active_rank: int | None = None
    active_world_size: int | None = None
    initial_rank: int | None = None
    initial_world_size: int | None = None
    iteration: int = 0
    mode: Mode = Mode.INITIALIZED
    fn_exception: BaseException | None = None
