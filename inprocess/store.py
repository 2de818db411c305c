"""The wrapper's key-value store: any ``torch.distributed.Store`` plus ``StoreMixin``'s restart vocabulary.

Layout. The store built by ``store_factory`` is the *base* store; all state of restart iteration ``i`` lives in
``PrefixStore("_inprocess_{i}", base)``, so a late write that names an old iteration can never disturb a newer
one. Keys inside an iteration namespace:

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
import uuid
from typing import Any, Iterable, Optional, Sequence

import torch.distributed

from . import exception
from .attribution import InterruptionRecord

log = logging.getLogger(__name__)

ITERATION_PREFIX = "_inprocess_{iteration}"
ITERATION_COMPLETED = "completed"
ITERATION_INTERRUPTED = "interrupted"
TIMEOUT_FOREVER = datetime.timedelta(days=365)
# A single store wait longer than this is split, so that a timeout message is printed at most this often.
_LONG_WAIT_CHUNK = datetime.timedelta(hours=1)


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


class StoreMixin:
    """Restart vocabulary on top of a torch Store (uses ``set/get/add/append/check/wait/multi_get``)."""

    # ---- identity ---------------------------------------------------------------------------------------------

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        """Ranks that must outlive the others (the store host); they wait at the termination barrier."""
        return ()

    def new_connection(self) -> "StoreMixin":
        """Another client of the same store, so that a thread's blocking wait never holds up other threads.

        torch serialises all operations of one client, and a ``wait`` holds the client for its whole duration.
        Stores that cannot do this raise ``NotImplementedError``; the wrapper then calls its factory again.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot open another connection")

    def iteration_store(self, iteration: int) -> "PrefixStore":
        return PrefixStore(ITERATION_PREFIX.format(iteration=iteration), self)

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

    def record_interrupted(self, records: Iterable[InterruptionRecord] = ()) -> None:
        text = "".join(f"{record};" for record in records)
        if text and int(self.add("interruption_records_lock", 0)) == 0:
            self.append("interruption_records", text)
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

    def iteration_outcome(self) -> Optional[str]:
        """``"interrupted"``, ``"completed"`` or None while the iteration runs."""
        return self.get("iteration_end").decode() if self.check(["iteration_end"]) else None

    def record_completed(self) -> None:
        self.set("any_rank_completed", "")

    def is_completed(self) -> bool:
        return bool(self.check(["any_rank_completed"]))

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

    def get_rank_of_initial(self, initial_rank: int, timeout: Any = 0) -> Optional[int]:
        key = f"rank_of_initial_{initial_rank}"
        if not self.wait_key(key, timeout):
            return None
        return int(self.get(key))

    # ---- heartbeats (monitor processes) -----------------------------------------------------------------------

    def send_heartbeat(self, rank: int) -> None:
        self.set(f"heartbeat_{rank}", repr(time.time()))

    def get_heartbeat(self, rank: int) -> Optional[float]:
        key = f"heartbeat_{rank}"
        return float(self.get(key)) if self.check([key]) else None

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
    """A namespace inside another store (torch joins prefix and key with ``/``)."""

    def __init__(self, prefix: Any, store: torch.distributed.Store) -> None:
        super().__init__(str(prefix), store)
        self.prefix = str(prefix)
        self.base_store = store

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return getattr(self.base_store, "critical_ranks", ())

    def new_connection(self) -> "PrefixStore":
        base = self.base_store
        other = base.new_connection() if isinstance(base, StoreMixin) else base.clone()
        return PrefixStore(self.prefix, other)


class TCPStore(StoreMixin, torch.distributed.TCPStore):
    """torch's TCPStore, hosted by the process whose ``RANK`` is ``TCP_STORE_HOST_RANK`` (falls back to client)."""

    TCP_STORE_HOST_RANK = 0

    def __init__(
        self,
        host_name: Optional[str] = None,
        port: Optional[int] = None,
        world_size: Optional[int] = None,
        timeout: datetime.timedelta = datetime.timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        use_libuv: bool = True,
    ) -> None:
        host_name = host_name if host_name is not None else os.environ["MASTER_ADDR"]
        port = int(port if port is not None else os.environ["MASTER_PORT"])
        world_size = int(world_size if world_size is not None else os.environ.get("WORLD_SIZE", 1))
        self._host = int(os.environ.get("RANK", 0)) == self.TCP_STORE_HOST_RANK and not os.environ.get(
            "INPROCESS_STORE_CLIENT"
        )
        self._designated_host = self._host  # meant to host, even if it ends up a client (see open_base_store)
        kwargs = dict(timeout=timeout, multi_tenant=multi_tenant, use_libuv=use_libuv)
        self._connection = (host_name, port, world_size, kwargs)
        if self._host:
            try:
                # The wrapper's initial barrier waits for the workers; torch's own wait would also count the
                # extra connections (monitor process, monitor thread), so it is not used.
                super().__init__(host_name, port, world_size, True, wait_for_workers=False, **kwargs)
                log.debug("hosting the wrapper store on %s:%s", host_name, port)
                return
            except (RuntimeError, torch.distributed.DistError) as error:
                log.debug("cannot host the store on %s:%s (%s), connecting as a client", host_name, port, error)
                self._host = False
        super().__init__(host_name, port, world_size, False, wait_for_workers=False, **kwargs)

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return (self.TCP_STORE_HOST_RANK,)

    @property
    def is_host(self) -> bool:
        return self._host

    def new_connection(self) -> "TCPStore":
        host_name, _, world_size, kwargs = self._connection
        other = TCPStore.__new__(TCPStore)
        torch.distributed.TCPStore.__init__(other, host_name, self.port, world_size, False, wait_for_workers=False, **kwargs)
        other._host = False
        other._designated_host = False
        other._connection = self._connection
        return other

    @property
    def server_address(self) -> tuple[str, int]:
        """Where the server is; ``open_base_store`` tells its successive servers on this address apart."""
        return (self._connection[0], self.port)


class FileStore(StoreMixin, torch.distributed.FileStore):
    """torch's FileStore with the wrapper vocabulary (single host; handy in tests)."""

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        super().__init__(file_name, world_size)
        self.file_name = file_name
        self.world_size = world_size

    def new_connection(self) -> "FileStore":
        return FileStore(self.file_name, self.world_size)


class HashStore(StoreMixin, torch.distributed.HashStore):
    """In-memory store of one process (unit tests of rank assignments)."""


# ---- one server per call ------------------------------------------------------------------------------------
#
# The store host builds a new server at the start of every call of a wrapped function and destroys it at the end
# (``CallWrapper.shutdown``), on the same address. The termination barrier at the end of call N lets every other
# rank go as soon as everybody has registered, i.e. *before* the host has destroyed call N's server: a rank that
# starts call N+1 at once may connect to call N's server (still listening, full of call N's keys, e.g. a finished
# initial barrier) and lose that connection mid-call when the host tears it down (``Broken pipe``). So every
# server carries a generation, written by the host right after it starts listening, and a rank accepts a
# connection only to a generation that it has not used before; otherwise it drops the connection and connects
# again (bounded by the caller's timeout) until the host's new server answers.

GENERATION_KEY = "_inprocess_store_generation"
_RECONNECT_INTERVAL = 0.1
_last_generation: dict[tuple, str] = {}  # server address -> generation of the server the last call used
_hosted_generations: set[str] = set()  # generations of the servers that this process hosted


def _accept_generation(store: Any, deadline: float) -> bool:
    """True if ``store`` is connected to a server of this call; False if to a server of an earlier call."""
    address = store.server_address
    if store.is_host or getattr(store, "_designated_host", False):
        if not store.is_host and store.check([GENERATION_KEY]):
            if store.get(GENERATION_KEY).decode() in _hosted_generations:
                # Could not bind: a server this process hosted for an earlier call is still referenced somewhere,
                # hence still listening. It is used as before (as a client), under a new generation.
                log.info("the store server of an earlier call on %s is still alive; connecting to it", address)
        # Hosting (or, when the port belongs to a server hosted elsewhere, standing in for the host): a new one.
        generation = uuid.uuid4().hex
        store.set(GENERATION_KEY, generation)
        if store.is_host:
            _hosted_generations.add(generation)
        _last_generation[address] = generation
        return True
    left = max(deadline - time.monotonic(), 0.0)
    if not store.wait_key(GENERATION_KEY, datetime.timedelta(seconds=left)):
        raise exception.TimeoutError(f"the store host did not start the store on {address} in time")
    generation = store.get(GENERATION_KEY).decode()
    if generation == _last_generation.get(address):
        return False  # the server of the previous call, about to be torn down
    _last_generation[address] = generation
    return True


def open_base_store(factory: Any, kwargs: dict, timeout: Any) -> Any:
    """``factory(**kwargs)``, connected to the server of this call (see above); stores without a host as is."""
    deadline = time.monotonic() + _as_timedelta(timeout).total_seconds()
    attempts = 0
    while True:
        attempts += 1
        try:
            store = factory(**kwargs)
            if getattr(store, "server_address", None) is None or not hasattr(store, "is_host"):
                return store
            if _accept_generation(store, deadline):
                if attempts > 1:
                    log.debug("connected to the store of this call after %s attempts", attempts)
                return store
            reason: Any = "a server of an earlier call"
        except exception.TimeoutError:
            raise
        except RuntimeError as error:  # torch's DistError family: the old server went away under us
            reason = error
        store = None  # drop the connection (and never keep one to an old server)
        if time.monotonic() >= deadline:
            raise exception.TimeoutError(f"could not connect to the store of this call within {timeout}: {reason}")
        log.debug("store connection attempt %s: %s; connecting again", attempts, reason)
        time.sleep(_RECONNECT_INTERVAL)
