"""The wrapped function's store connection (``CallWrapper.store``): its own TCP connection, cut at every restart.

Why cut it. A restart reaches a main thread blocked in a Python call or in a collective (the wake signal, the gloo
abort), but not one blocked inside ``init_process_group`` while gloo connects the new group: gloo's
``connectFullMesh`` waits in the store (a C++ ``wait``/``get`` on this connection) for the address of every peer,
and a peer that died before publishing it is waited for until the group's timeout (30 minutes for gloo by default),
or until the Wrapper's hard timeout ends the rank (issue 38: a kill as a rank re-enters ``init_process_group``
during a restart cost 134 s, and the survivors' in-memory state with it). Shutting this one connection down
(``SHUT_RDWR``) makes that wait fail at once, ``init_process_group`` raises, and the restart proceeds. The
connection belongs to the iteration that ends; the next iteration gets a fresh one (a TCP connect, milliseconds).

The sockets are the ones that appeared while the connection was made (psutil, as the gloo abort finds its
sockets): the Wrapper's own store connections, made before and after, are never touched. A store without a TCP
connection of its own (an etcd client connects lazily) has none to cut, and behaves as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import logs
from .abort import connection_key, established_connections, shutdown_socket

log = logs.get_logger(__name__)


class UserStoreConnection:
    """Makes, hands out and cuts the connection behind ``CallWrapper.store``."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.connection: Any = None
        self._sockets: set[tuple] = set()
        self.cut = False
        self.reconnect()

    def reconnect(self) -> None:
        before = _keys()
        self.connection = self._connect()
        self._sockets = _keys() - before
        self.cut = False

    def store(self, iteration: int) -> Any:
        """The function's namespace of ``iteration``, on a fresh connection if the last one was cut."""
        if self.cut:
            self.reconnect()
        return self.connection.user_store(iteration)

    def cut_now(self) -> int:
        """Shut this connection's sockets down (from the monitor thread, at a restart); how many were."""
        # Only sockets still this connection's: an fd number is reused once closed.
        count = sum(shutdown_socket(fd) for fd, *_ in self._sockets & _keys())
        self.cut = True
        log.debug("cut the wrapped function's store connection (%d socket(s))", count)
        return count

    def close(self) -> None:
        self.connection = None
        self._sockets = set()


def _keys() -> set[tuple]:
    try:
        return {connection_key(c) for c in established_connections() if c.fd is not None and c.fd >= 0}
    except Exception:  # psutil cannot read this process's sockets: nothing to cut later
        log.debug("cannot list this process's connections", exc_info=True)
        return set()
