"""What a node asks its driver to do: the outputs of every ``Node`` input.

Belongs here: the action value types and nothing else. Every input method of ``node.Node`` returns a list of
these, and the driver (the asyncio runtime in ``rasd/net/runtime.py``, the simulator in ``rasd/sim/network.py``)
carries them out in order (docs/architecture.md section 1, "The node's interface").
"""

from __future__ import annotations

from dataclasses import dataclass

from .events import Event
from .peers import Addr
from .snapshot import JobSnapshot


@dataclass(frozen=True)
class Connect:
    """Open a TCP connection to ``addr``; answer with ``Node.connected`` or ``Node.connect_failed``."""

    conn_id: int
    addr: Addr


@dataclass(frozen=True)
class Send:
    """Write ``data`` (whole frames) on the connection."""

    conn_id: int
    data: bytes


@dataclass(frozen=True)
class Close:
    """Close the connection; the node has already forgotten it."""

    conn_id: int


@dataclass(frozen=True)
class Emit:
    """Log the event and pass it to the client port's monitors and the in-process subscribers."""

    event: Event


@dataclass(frozen=True)
class ProbePid:
    """Ask whether ``pid`` still exists on this host; answer with ``Node.pid_gone`` if it does not."""

    addr: Addr
    pid: int


@dataclass(frozen=True)
class GatherDone:
    """A status gather rooted here ended: hand the snapshot to whoever asked (``query_id``)."""

    query_id: int
    snapshot: JobSnapshot


Action = Connect | Send | Close | Emit | ProbePid | GatherDone
