"""The wrapper's key-value store: any ``torch.distributed.Store`` plus ``StoreMixin``'s restart vocabulary.

Where it lives (docs/inprocess.md section 7). No training process hosts it: ``TCPStore`` is a client of a store
server process (``inprocess.store_server``), ``inprocess.etcd_store.EtcdStore`` a client of an etcd cluster.
Because the store outlives a call, every call of the wrapped function works in a namespace of its own
(``open_base_store``); the function's own store (``CallWrapper.store``) is ``user_store(i)`` of that namespace.

Layout. The store built by ``store_factory`` is the *base* store; all state of restart iteration ``i`` lives in
``PrefixStore(i, base)`` (prefix ``_inprocess_{i}``), so a late write that names an old iteration can never
disturb a newer one. Keys inside an iteration namespace:

    any_rank_interrupted        set by whoever records a fault
    iteration_end               "interrupted" or "completed", written once (compare_set: the first writer wins):
                                by a fault record or by the last rank through the completion barrier. Every
                                waiter of the iteration waits on this one key (torch's wait needs all keys), and
                                every rank decides restart-or-return from its value, so no two ranks disagree
                                when a late fault races the completion
    interruption_records        append-only "InterruptionRecord(...);" list, frozen once the lock is taken
    interruption_records_lock   counter; > 0 freezes the records
    terminated_ranks            append-only "3,5," list, read as a set: ranks (in this iteration's numbering)
                                that rank assignment must drop
    any_rank_completed          an active rank returned from the wrapped function
    initial_rank_{rank}         this iteration's rank -> initial rank
    rank_of_initial_{initial}   initial rank -> this iteration's rank (used by external verdicts)
    barrier:{name}:...          barriers, see below

Barriers count *distinct* ranks with one ``add`` per rank key, so re-registering a rank (by itself, by its
monitor process, by an external verdict) is harmless and no arrival ever re-reads a list of all arrivals:
O(1) store operations per registration, whatever the world size.

Method resolution: ``StoreMixin`` comes *first* in the bases of the concrete stores. torch 2.13 added a native
``Store.barrier(key, world_size, timeout)``; with the torch class first it would shadow the wrapper's barrier.
Our ``barrier`` keeps the wrapper's signature and forwards calls in torch's form (a ``str`` key first) to torch.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed

from . import exception
from .attribution import InterruptionRecord

log = logging.getLogger(__name__)

ITERATION_PREFIX = "_inprocess_{iteration}"
USER_PREFIX = "_inprocess_user_{iteration}"
FAULT_REASONS_KEY = "fault_reasons"
FAULT_TIME_KEY = "fault_time"
ITERATION_COMPLETED = "completed"
ITERATION_INTERRUPTED = "interrupted"
TIMEOUT_FOREVER = datetime.timedelta(days=365)
# A single store wait longer than this is split, so that a timeout message is printed at most this often.
_LONG_WAIT_CHUNK = datetime.timedelta(hours=1)


class StoreUnavailable(BaseException):
    """The Wrapper's store cannot be reached (its server process died, or no etcd member answers).

    No fault can be coordinated without it, so every rank leaves the call with this exception and a log line
    naming the cause, rather than training on unprotected or hanging at the next barrier. A ``BaseException``, like
    ``RankShouldRestart``, so that a workload's ``except Exception`` does not swallow it.
    """

    message = "the wrapper's store is unreachable"

    def __str__(self) -> str:
        return self.args[0] if self.args else self.message


class BarrierError(exception.RestartError):
    pass


class BarrierTimeout(BarrierError):
    pass


class BarrierOverflow(BarrierError):
    pass


def _as_timedelta(timeout: Any) -> datetime.timedelta:
    if timeout is None:
        return TIMEOUT_FOREVER
    if isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


def _is_timeout_error(error: BaseException) -> bool:
    return "timeout" in str(error).lower() or "timed out" in str(error).lower()


if TYPE_CHECKING:
    # The mixin is only ever combined with a torch Store (the concrete stores below list it first); a type
    # checker sees that Store as its base, so the operations it builds on are checked.
    _Store = torch.distributed.Store
else:
    _Store = object


class StoreMixin(_Store):
    """Restart vocabulary on top of a torch Store (uses ``set/get/add/append/check/wait/multi_get``)."""

    if TYPE_CHECKING:
        # Operations every torch Store has at run time (torch 2.13) that torch's type stubs do not declare.
        def append(self, key: str, value: str | bytes) -> None: ...

        def multi_set(self, keys: list[str], values: list[str] | list[bytes]) -> None: ...

        @property
        def timeout(self) -> datetime.timedelta: ...

    # ---- identity ---------------------------------------------------------------------------------------------

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        """Ranks that must outlive the others (the store host); they wait at the termination barrier."""
        return ()

    def new_connection(self) -> StoreMixin:
        """Another client of the same store, so that a thread's blocking wait never holds up other threads.

        torch serialises all operations of one client, and a ``wait`` holds the client for its whole duration.
        Stores that cannot do this raise ``NotImplementedError``; the wrapper then calls its factory again.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot open another connection")

    def iteration_store(self, iteration: int) -> PrefixStore:
        return PrefixStore(iteration, self)

    def user_store(self, iteration: int) -> NamespaceStore:
        """The wrapped function's own namespace in ``iteration`` (``CallWrapper.store``), apart from the wrapper's."""
        return NamespaceStore(USER_PREFIX.format(iteration=iteration), self)

    # ---- small helpers ----------------------------------------------------------------------------------------

    def get_packed(self, key: str, sep: str) -> list[str]:
        if not self.check([key]):
            return []
        raw = self.get(key).decode()
        return [item for item in raw.split(sep) if item]

    def wait_key(self, key: str, timeout: Any) -> bool:
        """Wait until ``key`` exists; False on timeout. ``timeout`` 0 only checks."""
        remaining = _as_timedelta(timeout)
        if remaining <= datetime.timedelta(0):
            return bool(self.check([key]))
        deadline = time.monotonic() + remaining.total_seconds()
        while True:
            chunk = min(remaining, _LONG_WAIT_CHUNK)
            try:
                self.wait([key], chunk)
                return True
            except torch.distributed.DistStoreError as error:
                if not _is_timeout_error(error):
                    raise
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            remaining = datetime.timedelta(seconds=left)

    # ---- interruptions ----------------------------------------------------------------------------------------

    def record_interrupted(self, records: Iterable[InterruptionRecord] = (), reason: str | None = None) -> None:
        """Interrupt the iteration. ``reason``: one line saying what happened, printed by every rank at the restart
        (``fault_reasons``); the first record also stamps ``fault_time`` (wall clock) to measure the time lost."""
        text = "".join(f"{record};" for record in records)
        if text and int(self.add("interruption_records_lock", 0)) == 0:
            self.append("interruption_records", text)
        if reason:
            self.append(FAULT_REASONS_KEY, reason.replace("\n", " ")[:500] + "\n")
        self.compare_set(FAULT_TIME_KEY, "", repr(time.time()))
        self.set("any_rank_interrupted", "")
        self.compare_set("iteration_end", "", ITERATION_INTERRUPTED)

    def lock_interruption_records(self) -> None:
        self.add("interruption_records_lock", 1)

    def get_interruption_records(self) -> list[InterruptionRecord]:
        records = []
        for item in self.get_packed("interruption_records", ";"):
            try:
                records.append(InterruptionRecord.from_str(item))
            except ValueError:
                log.warning("ignoring a malformed interruption record %r", item)
        return records

    def is_interrupted(self) -> bool:
        return bool(self.check(["any_rank_interrupted"]))

    def wait_for_iteration_end(self, timeout: Any) -> bool:
        """Block until the iteration ends (a fault was recorded or every rank completed); False on timeout."""
        return self.wait_key("iteration_end", timeout)

    def signal_iteration_end(self) -> None:
        self.compare_set("iteration_end", "", ITERATION_COMPLETED)

    def iteration_outcome(self) -> str | None:
        """``"interrupted"``, ``"completed"`` or None while the iteration runs."""
        return self.get("iteration_end").decode() if self.check(["iteration_end"]) else None

    def record_completed(self) -> None:
        self.set("any_rank_completed", "")

    # ---- terminated ranks and identities ----------------------------------------------------------------------

    def record_terminated_ranks(self, ranks: Iterable[int]) -> None:
        text = "".join(f"{rank}," for rank in ranks)
        if text:
            self.append("terminated_ranks", text)

    def get_terminated_ranks(self) -> set[int]:
        return {int(item) for item in self.get_packed("terminated_ranks", ",")}

    def set_initial_rank(self, rank: int, initial_rank: int) -> None:
        self.multi_set([f"initial_rank_{rank}", f"rank_of_initial_{initial_rank}"], [str(initial_rank), str(rank)])

    def get_initial_ranks(self, ranks: Sequence[int]) -> list[int]:
        if not ranks:
            return []
        return [int(value) for value in self.multi_get([f"initial_rank_{rank}" for rank in ranks])]

    def get_rank_of_initial(self, initial_rank: int, timeout: Any = 0) -> int | None:
        key = f"rank_of_initial_{initial_rank}"
        if not self.wait_key(key, timeout):
            return None
        return int(self.get(key))

    # ---- Tree inputs ------------------------------------------------------------------------------------------

    def send_state(self, state: dict, rank: int) -> None:
        self.set(f"state_{rank}", json.dumps(state))

    def get_states(self, ranks: Sequence[int]) -> list[dict]:
        return [json.loads(value) for value in self.multi_get([f"state_{rank}" for rank in ranks])]

    def send_key(self, key: list, rank: int) -> None:
        self.set(f"key_{rank}", json.dumps(key))

    def get_keys(self, ranks: Sequence[int]) -> list[list]:
        return [json.loads(value) for value in self.multi_get([f"key_{rank}" for rank in ranks])]

    # ---- barriers ---------------------------------------------------------------------------------------------

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        """The wrapper's one-shot counting barrier, ``barrier(ranks, group_name, rendezvous_count, timeout)``.

        Called in torch's own form ``barrier(key: str, world_size, timeout=None)`` it is torch's native barrier.
        """
        if (args and isinstance(args[0], str)) or "key" in kwargs:
            # Store.barrier: in torch 2.13, not in its type stubs.
            return super().barrier(*args, **kwargs)  # type: ignore[misc]
        return self._barrier(*args, reentrant=False, **kwargs)

    def reentrant_barrier(
        self, ranks: Iterable[int], group_name: str, rendezvous_count: int, timeout: Any, timeout_chunk: Any = None
    ) -> None:
        """Barrier over distinct ranks: any actor may register any rank any number of times."""
        self._barrier(ranks, group_name, rendezvous_count, timeout, timeout_chunk, reentrant=True)

    def _barrier(
        self,
        ranks: Iterable[int],
        group_name: str,
        rendezvous_count: int,
        timeout: Any,
        timeout_chunk: Any = None,
        *,
        reentrant: bool,
    ) -> None:
        base = f"barrier:{group_name}"
        done_key = f"{base}:last_worker_arrived"
        for rank in sorted(set(ranks)):
            if reentrant and int(self.add(f"{base}:rank:{rank}", 1)) != 1:
                continue  # this rank was registered before, by itself or on its behalf
            arrived = int(self.add(f"{base}:count", 1))
            if arrived == rendezvous_count:
                self.set(done_key, "")
            elif arrived > rendezvous_count:
                raise BarrierOverflow(f"barrier {group_name}: {arrived} arrivals for {rendezvous_count}")
        if _as_timedelta(timeout) <= datetime.timedelta(0):
            return
        if not self.wait_key(done_key, timeout):
            arrived = int(self.add(f"{base}:count", 0))
            raise BarrierTimeout(f"barrier {group_name}: {arrived} of {rendezvous_count} arrived within {timeout}")

    def initial_barrier(self, ranks: Iterable[int], rendezvous_count: int, timeout: Any) -> None:
        self.reentrant_barrier(ranks, "initial", rendezvous_count, timeout)

    def iteration_barrier(self, ranks: Iterable[int], rendezvous_count: int, timeout: Any) -> None:
        self.reentrant_barrier(ranks, "iteration", rendezvous_count, timeout)

    def termination_barrier(self, ranks: Iterable[int], rendezvous_count: int, timeout: Any) -> None:
        """Keyed by *initial* ranks over the initial world size, on the base store."""
        self.reentrant_barrier(ranks, "termination", rendezvous_count, timeout)

    def completion_barrier(self, ranks: Iterable[int], rendezvous_count: int, timeout: Any) -> bool:
        """Register; the last rank ends the iteration. Waits for the end of the iteration, however it ends.

        Returns True if every rank completed, False if the iteration was interrupted instead; raises
        ``BarrierTimeout`` if neither happened within ``timeout``.
        """
        self.reentrant_barrier(ranks, "completion", rendezvous_count, 0)
        if int(self.add("barrier:completion:count", 0)) >= rendezvous_count:
            self.signal_iteration_end()
        if not self.wait_for_iteration_end(timeout):
            raise BarrierTimeout(f"completion barrier: not every rank completed within {timeout}")
        return self.iteration_outcome() == ITERATION_COMPLETED


class PrefixStore(StoreMixin, torch.distributed.PrefixStore):
    """The namespace of restart iteration ``iteration`` inside another store, ``_inprocess_{iteration}``.

    Takes the iteration, as the reference's ``PrefixStore(iteration, store)`` does (torch joins prefix and key
    with ``/``).
    """

    def __init__(self, iteration: Any, store: torch.distributed.Store) -> None:
        prefix = ITERATION_PREFIX.format(iteration=iteration)
        super().__init__(prefix, store)
        self.iteration = iteration
        self.prefix = prefix
        self.base_store = store

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return getattr(self.base_store, "critical_ranks", ())

    def new_connection(self) -> PrefixStore:
        base = self.base_store
        # Store.clone: in torch 2.13, not in its type stubs.
        other = base.new_connection() if isinstance(base, StoreMixin) else base.clone()  # type: ignore[attr-defined]
        return PrefixStore(self.iteration, other)


class NamespaceStore(StoreMixin, torch.distributed.PrefixStore):
    """Any namespace inside another store: a call's namespace (``open_base_store``), the function's own store."""

    def __init__(self, prefix: str, store: torch.distributed.Store) -> None:
        super().__init__(prefix, store)
        self.prefix = prefix
        self.base_store = store

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return getattr(self.base_store, "critical_ranks", ())

    @property
    def port(self) -> int | None:
        """The port of the store underneath, if it has one (the abort leaves connections to it alone)."""
        return getattr(self.base_store, "port", None)

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port of a replicated store underneath (its members); empty for other stores."""
        return tuple(getattr(self.base_store, "ports", None) or ())

    def new_connection(self) -> NamespaceStore:
        base = self.base_store
        # Store.clone: in torch 2.13, not in its type stubs.
        other = base.new_connection() if isinstance(base, StoreMixin) else base.clone()  # type: ignore[attr-defined]
        return NamespaceStore(self.prefix, other)


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
