"""The wrapper's restart vocabulary (``StoreMixin``) over any key-value store, without importing torch.

Why a module of its own: the monitor process (``inprocess.monitor_process``) speaks this vocabulary too, and for
the common store, a TCPStore, it talks to the store server with ``inprocess.tcpstore_client`` instead of torch's
client, so that each rank's monitor does not spend seconds and hundreds of MB importing torch. Everything here
builds on the operations of torch's ``Store`` (``set/get/add/check/wait/compare_set/append/multi_get/
multi_set``), whoever provides them: ``inprocess.store`` combines the mixin with torch's stores (the trainer,
whose ``init_process_group`` needs one), ``PrefixedStore`` below with the torch-free client.

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
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import exception, logs
from .attribution import InterruptionRecord

if TYPE_CHECKING:
    import torch.distributed

log = logs.get_logger("inprocess.store")

ITERATION_PREFIX = "_inprocess_{iteration}"
USER_PREFIX = "_inprocess_user_{iteration}"
FAULT_REASONS_KEY = "fault_reasons"
FAULT_TIME_KEY = "fault_time"
ITERATION_COMPLETED = "completed"
ITERATION_INTERRUPTED = "interrupted"
TIMEOUT_FOREVER = datetime.timedelta(days=365)
# A single store wait longer than this is split, so that a timeout message is printed at most this often.
_LONG_WAIT_CHUNK = datetime.timedelta(hours=1)


class StoreTimeoutError(RuntimeError):
    """A store wait ran out of time, raised by stores that are not torch's (``inprocess.tcpstore_client``).

    torch raises ``DistStoreError`` (a ``RuntimeError`` too) for the same event; ``StoreMixin.wait_key`` accepts
    both, so the vocabulary behaves the same over either client.
    """


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


def _timeout_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a store raises when a wait runs out of time: ours, and torch's if torch is loaded.

    Built at each call, from ``sys.modules``, so that the torch-free path never imports torch for an ``except``.
    """
    distributed = sys.modules.get("torch.distributed")
    torch_error = getattr(distributed, "DistStoreError", None)
    return (StoreTimeoutError, torch_error) if torch_error is not None else (StoreTimeoutError,)


if TYPE_CHECKING:
    # The mixin is combined with a torch Store (``inprocess.store``) or with a client that has the same operations
    # (``PrefixedStore`` over ``inprocess.tcpstore_client``); a type checker sees torch's Store as its base, so the
    # operations it builds on are checked.
    _Store = torch.distributed.Store
else:
    _Store = object


class StoreMixin(_Store):
    """Restart vocabulary on top of a torch Store, or a client with its operations (``set/get/add/append/check/wait/
    compare_set/multi_get/multi_set``)."""

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

    def iteration_store(self, iteration: int) -> StoreMixin:
        """The namespace of restart iteration ``iteration`` (``inprocess.store`` returns torch's PrefixStore)."""
        return PrefixedStore(ITERATION_PREFIX.format(iteration=iteration), self)

    def user_store(self, iteration: int) -> StoreMixin:
        """The wrapped function's own namespace in ``iteration`` (``CallWrapper.store``), apart from the wrapper's."""
        return PrefixedStore(USER_PREFIX.format(iteration=iteration), self)

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
            except _timeout_errors() as error:
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


class PrefixedStore(StoreMixin):
    """``prefix`` inside ``store``, without torch: keys are ``prefix + "/" + key``, as torch's ``PrefixStore`` joins
    them, so a client of this class and a torch client of the same server read and write the same keys.

    ``store`` is anything with torch's Store operations: ``inprocess.tcpstore_client.TCPStoreClient`` or another
    ``PrefixedStore`` (namespaces nest: call namespace, then iteration).
    """

    def __init__(self, prefix: str, store: Any) -> None:
        self.prefix = prefix
        self.base_store = store

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def _keys(self, keys: Iterable[str]) -> list[str]:
        return [self._key(key) for key in keys]

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return getattr(self.base_store, "critical_ranks", ())

    @property
    def timeout(self) -> datetime.timedelta:
        return self.base_store.timeout

    def set(self, key: str, value: str | bytes) -> None:
        self.base_store.set(self._key(key), value)

    def get(self, key: str) -> bytes:
        return self.base_store.get(self._key(key))

    def add(self, key: str, value: int) -> int:
        return self.base_store.add(self._key(key), value)

    def check(self, keys: list[str]) -> bool:
        return self.base_store.check(self._keys(keys))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self.base_store.wait(self._keys(keys), timeout)

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return self.base_store.compare_set(self._key(key), expected_value, desired_value)

    def append(self, key: str, value: str | bytes) -> None:
        self.base_store.append(self._key(key), value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self.base_store.multi_get(self._keys(keys))

    def multi_set(self, keys: list[str], values: list[str] | list[bytes]) -> None:
        self.base_store.multi_set(self._keys(keys), values)

    def delete_key(self, key: str) -> bool:
        return self.base_store.delete_key(self._key(key))
