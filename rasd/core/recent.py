"""A bounded memory of recently seen keys: flood ids and finished gathers, for de-duplication.

Belongs here: the bounded, insertion-ordered set and its size. A node forgets the oldest key once it holds
``HISTORY`` of them; a duplicate older than that is long past every hop of its flood.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: Remembered flood ids and finished gathers (for de-duplication).
HISTORY = 4096


class Recent(Generic[K]):
    """The last ``limit`` keys remembered, oldest forgotten first."""

    def __init__(self, limit: int = HISTORY) -> None:
        self._keys: collections.OrderedDict[K, None] = collections.OrderedDict()
        self._limit = limit

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, key: K) -> None:
        self._keys[key] = None
        if len(self._keys) > self._limit:
            self._keys.popitem(last=False)

    def first_sight(self, key: K) -> bool:
        """Remember ``key``; whether it was new (a duplicate flood is dropped on the second sight)."""
        if key in self._keys:
            return False
        self.remember(key)
        return True
