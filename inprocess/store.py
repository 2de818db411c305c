"""The wrapper's key-value store: any ``torch.distributed.Store`` plus ``StoreMixin``'s restart vocabulary.

Where it lives (docs/inprocess.md section 7). No training process hosts it: ``TCPStore`` is a client of a store
server process (``inprocess.store_server``), ``inprocess.etcd_store.EtcdStore`` a client of an etcd cluster.
Because the store outlives a call, every call of the wrapped function works in a namespace of its own
(``open_base_store``); the function's own store (``CallWrapper.store``) is ``user_store(i)`` of that namespace.

Layout and vocabulary: ``inprocess.store_mixin``, which holds ``StoreMixin`` without importing torch (the monitor
process uses it over ``inprocess.tcpstore_client``). ``inprocess.store_base`` combines it with torch's ``Store``
(``StoreMixin``, ``PrefixStore``, ``NamespaceStore``: what ``EtcdStore`` builds on too, without importing this
module); this module adds torch's concrete stores and keeps every name it always had.

Method resolution: ``StoreMixin`` comes *first* in the bases of the concrete stores. torch 2.13 added a native
``Store.barrier(key, world_size, timeout)``; with the torch class first it would shadow the wrapper's barrier.
Our ``barrier`` keeps the wrapper's signature and forwards calls in torch's form (a ``str`` key first) to torch.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch.distributed

from . import exception, logs, store_mixin, utils  # noqa: F401 - names of the reference's module
from .attribution import InterruptionRecord  # noqa: F401 - names of the reference's module
from .state import Mode, State  # noqa: F401 - names of the reference's module
from .store_base import NamespaceStore, PrefixStore, StoreMixin  # noqa: F401 - this module's names, as before
from .store_mixin import (  # noqa: F401 - the vocabulary's names are this module's public names, as before
    FAULT_REASONS_KEY,
    FAULT_TIME_KEY,
    ITERATION_COMPLETED,
    ITERATION_INTERRUPTED,
    ITERATION_PREFIX,
    TIMEOUT_FOREVER,
    USER_PREFIX,
    BarrierError,
    BarrierOverflow,
    BarrierTimeout,
    StoreTimeoutError,
    _as_timedelta,
)

log = logs.get_logger(__name__)


class StoreUnavailable(BaseException):
    """The Wrapper's store cannot be reached (its server process died, or no etcd member answers).

    No fault can be coordinated without it, so every rank leaves the call with this exception and a log line
    naming the cause, rather than training on unprotected or hanging at the next barrier. A ``BaseException``, like
    ``RankShouldRestart``, so that a workload's ``except Exception`` does not swallow it.
    """

    message = "the wrapper's store is unreachable"

    def __str__(self) -> str:
        return self.args[0] if self.args else self.message


class TCPStore(StoreMixin, torch.distributed.TCPStore):
    """A client of torch's TCPStore server on (``host_name``, ``port``), which runs in a process of its own.

    The first Wrapper on the host of ``host_name`` binds the port and starts the server process
    (``inprocess.store_server``); every rank, that one included, is a client, so no training process is special
    (the reference hosts the server in initial rank 0's trainer). ``critical_ranks`` is empty: nobody has to
    outlive anybody. ``TCP_STORE_HOST_RANK`` is kept for code that reads it; no rank hosts the store.
    """

    TCP_STORE_HOST_RANK = 0

    def __init__(
        self,
        host_name: str | None = None,
        port: int | None = None,
        world_size: int | None = None,
        timeout: datetime.timedelta = datetime.timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        use_libuv: bool = True,
    ) -> None:
        from . import store_server

        logs.adopt(store_server.log)  # a module that also runs as a script: its logger is made without inprocess.logs
        host_name = host_name if host_name is not None else os.environ["MASTER_ADDR"]
        port = int(port if port is not None else os.environ["MASTER_PORT"])
        world_size = int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", 1))
        timeout = _as_timedelta(timeout)
        self.server_pid: int | None = None  # set in the process that started the server
        if not os.environ.get("INPROCESS_STORE_CLIENT"):  # monitor processes never start a server
            started = store_server.serve(host_name, port, timeout.total_seconds())
            if started is not None:
                self.server_pid, port = started
        # The wrapper's initial barrier waits for the workers; torch's own wait would also count the extra
        # connections (monitor process, monitor thread), so it is not used.
        super().__init__(
            host_name, port, world_size, False, timeout=timeout, wait_for_workers=False, use_libuv=use_libuv
        )
        self._connection: tuple[str, int, int | None, datetime.timedelta, bool] = (
            host_name,
            port,
            world_size,
            timeout,
            use_libuv,
        )

    @property
    def is_host(self) -> bool:
        """True in the process that started the server process (it hosts nothing itself)."""
        return self.server_pid is not None

    def new_connection(self) -> TCPStore:
        return TCPStore.client(*self._connection)

    @classmethod
    def client(
        cls, host_name: str, port: int, world_size: int | None, timeout: datetime.timedelta, use_libuv: bool
    ) -> TCPStore:
        """A client of a running store server (never starts one): what other connections of a call use."""
        store = cls.__new__(cls)
        torch.distributed.TCPStore.__init__(
            store, host_name, port, world_size, False, timeout=timeout, wait_for_workers=False, use_libuv=use_libuv
        )
        store.server_pid = None
        store._connection = (host_name, port, world_size, timeout, use_libuv)
        return store

    def connection_parameters(self) -> dict:
        host_name, port, world_size, timeout, use_libuv = self._connection
        return dict(kind="tcp", host=host_name, port=port, timeout=timeout.total_seconds(), use_libuv=use_libuv)


class FileStore(StoreMixin, torch.distributed.FileStore):
    """torch's FileStore with the wrapper vocabulary (single host; handy in tests)."""

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        super().__init__(file_name, world_size)
        self.file_name = file_name
        self.world_size = world_size

    def new_connection(self) -> FileStore:
        return FileStore(self.file_name, self.world_size)

    def connection_parameters(self) -> dict:
        return dict(kind="file", path=self.file_name, world_size=self.world_size)


class HashStore(StoreMixin, torch.distributed.HashStore):
    """In-memory store of one process (unit tests of rank assignments)."""


# ---- one namespace per call ---------------------------------------------------------------------------------
#
# The store outlives a call of the wrapped function (a store server process, an etcd cluster), so every call
# works inside a namespace of its own and consecutive calls never mix, even when a rank starts call N+1 while
# another is still leaving call N. The namespace is the call's number, counted per initial rank on the store
# itself (``add``), so no process keeps state between calls and every rank of a job agrees on it: they all make
# the same calls. Counters are kept per launch attempt (torchrun's run id and restart count), so a job relaunched
# while the store is still up starts again from call 1 on every rank.

CALL_COUNTER = "_inprocess_calls/{job}/{initial_rank}"
CALL_NAMESPACE = "_inprocess_call/{job}/{number}"
_RECONNECT_INTERVAL = 0.1


def launch_attempt() -> str:
    """This launch of the job: torchrun's run id and restart count (both empty or 0 without torchrun)."""
    return f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}:{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def open_base_store(factory: Any, kwargs: dict, timeout: Any, initial_rank: int = 0) -> tuple[NamespaceStore, Any]:
    """Connect with ``factory(**kwargs)`` and enter this call's namespace: (namespaced store, raw connection).

    Connection errors are retried until ``timeout`` (a store server of an earlier call that is just ending).
    """
    deadline = time.monotonic() + _as_timedelta(timeout).total_seconds()
    attempts = 0
    while True:
        attempts += 1
        try:
            raw = factory(**kwargs)
            job = launch_attempt()
            number = int(raw.add(CALL_COUNTER.format(job=job, initial_rank=initial_rank), 1))
            namespace = CALL_NAMESPACE.format(job=job, number=number)
            if attempts > 1:
                log.debug("connected to the store after %s attempts", attempts)
            return NamespaceStore(namespace, raw), raw
        except exception.RestartError:
            raise
        except RuntimeError as error:  # torch's DistError family and our store errors
            if time.monotonic() >= deadline:
                raise exception.TimeoutError(
                    f"could not connect to the wrapper's store within {timeout}: {error}"
                ) from error
            log.debug("store connection attempt %s: %s; connecting again", attempts, error)
            time.sleep(_RECONNECT_INTERVAL)


# ---- a client of the same store in another process ------------------------------------------------------------
#
# The monitor process (a fresh interpreter) needs its own client of the trainer's store. An importable factory is
# sent by reference and called there, as the reference does. A factory that cannot be imported by name (a class
# defined inside a function) is never pickled: the trainer sends plain connection parameters instead, which
# ``open_connection`` turns into a client of the same server (``kind``: tcp, file, etcd).


def connection_parameters(store: Any) -> dict:
    """Plain, JSON-serialisable parameters from which another process opens its own client of ``store``."""
    describe = getattr(store, "connection_parameters", None)
    if callable(describe):
        return describe()
    if isinstance(store, torch.distributed.TCPStore):
        # TCPStore.timeout and .libuvBackend, FileStore.path: in torch 2.13, not in its type stubs.
        timeout = store.timeout  # type: ignore[attr-defined]
        libuv = store.libuvBackend  # type: ignore[attr-defined]
        return dict(kind="tcp", host=store.host, port=store.port, timeout=timeout.total_seconds(), use_libuv=libuv)
    if isinstance(store, torch.distributed.FileStore):
        return dict(kind="file", path=store.path, world_size=-1)  # type: ignore[attr-defined]
    raise TypeError(
        f"{type(store).__qualname__} cannot be opened in another process: make the store factory importable by "
        "name (a module-level class) or give the store a connection_parameters() method"
    )


def open_connection(parameters: dict) -> StoreMixin:
    """A new client from ``connection_parameters``: never starts a server."""
    kind = parameters.get("kind")
    if kind == "tcp":
        timeout = datetime.timedelta(seconds=parameters["timeout"])
        return TCPStore.client(parameters["host"], parameters["port"], None, timeout, parameters.get("use_libuv", True))
    if kind == "file":
        return FileStore(parameters["path"], parameters.get("world_size", -1))
    if kind == "etcd":
        from .etcd_store import EtcdStore

        return EtcdStore.from_connection_parameters(parameters)
    raise ValueError(f"unknown store connection kind {kind!r}")
