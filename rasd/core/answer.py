"""A process's answer to a gather of an ask other than STATUS (``wire.Ask``): the value the providers make
(``Node.answers``), the wire carries (``wire.Answers``) and a snapshot holds (``JobSnapshot.answers``). A module of its
own because the snapshot sits below the wire format."""

from __future__ import annotations

from typing import NamedTuple


class Answer(NamedTuple):
    """One process's answer to a gather of an ask other than STATUS, made by its provider (``Node.answers``): a
    ``shared`` part that many processes may give byte for byte (the stacks they stand in), and its ``own`` part (who
    it is, how long it has stood there). A relay passes each distinct shared part once (``Answers``), so that 4,096
    processes in one all-reduce carry one stack to the root, not 4,096. Both parts are opaque to the core; either may
    be empty, and an answer with neither is no answer."""

    shared: bytes = b""
    own: bytes = b""

    @property
    def size(self) -> int:
        return len(self.shared) + len(self.own)
