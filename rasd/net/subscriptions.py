"""In-process subscribers to the node's events.

The RAS thread never runs subscriber code: it puts each event on the subscriber's queue and moves on. A consumer
reads its queue from its own thread (``Subscription.get``), or registers a callback, which runs on one small
dispatcher thread shared by all callbacks of the process, so a slow callback delays other callbacks but never the
mesh.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable

from rasd.core.events import Event, Kind

log = logging.getLogger("rasd")

#: A subscriber that stops reading loses its oldest events beyond this many, never blocking the mesh.
MAX_QUEUED = 10_000
#: Recent events kept for subscribers that arrive late and ask for a replay.
HISTORY = 4096


class Subscription:
    """A queue of the events of the chosen kinds (all kinds when ``kinds`` is None)."""

    def __init__(self, owner: Subscribers, kinds: Iterable[Kind] | None) -> None:
        self._owner = owner
        self.kinds = frozenset(kinds) if kinds is not None else None
        self._queue: queue.Queue[Event] = queue.Queue()
        self.dropped = 0

    def wants(self, event: Event) -> bool:
        return self.kinds is None or event.kind in self.kinds

    def deliver(self, event: Event) -> None:
        """Queue ``event`` (the publisher's side); never blocks."""
        if self._queue.qsize() >= MAX_QUEUED:
            try:
                self._queue.get_nowait()
                self.dropped += 1
            except queue.Empty:
                pass
        self._queue.put_nowait(event)

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event, or None when ``timeout`` seconds pass without one."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list[Event]:
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._owner.remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Subscribers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: list[Subscription] = []
        self._callbacks: list[tuple[Subscription, Callable[[Event], None]]] = []
        self._dispatcher: threading.Thread | None = None
        self._wake = threading.Event()
        self._history: collections.deque[Event] = collections.deque(maxlen=HISTORY)

    def subscribe(self, kinds: Iterable[Kind] | None = None, replay: bool = False) -> Subscription:
        """A new queue; with ``replay``, it starts with the recent events that happened before it."""
        sub = Subscription(self, kinds)
        with self._lock:
            if replay:
                for e in self._history:
                    if sub.wants(e):
                        sub.deliver(e)
            self._subs.append(sub)
        return sub

    def on_event(
        self, callback: Callable[[Event], None], kinds: Iterable[Kind] | None = None, replay: bool = False
    ) -> Subscription:
        """Call ``callback(event)`` for each event, on the dispatcher thread. Close the returned subscription to
        stop."""
        sub = self.subscribe(kinds, replay)
        with self._lock:
            self._callbacks.append((sub, callback))
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, name="torchras-events", daemon=True)
                self._dispatcher.start()
        self._wake.set()
        return sub

    def remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
            self._callbacks = [(s, cb) for s, cb in self._callbacks if s is not sub]

    def publish(self, event: Event) -> None:
        with self._lock:
            self._history.append(event)
            subs = list(self._subs)
            has_callbacks = bool(self._callbacks)
        for sub in subs:
            if sub.wants(event):
                sub.deliver(event)
        if has_callbacks:
            self._wake.set()

    def _dispatch(self) -> None:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                callbacks = list(self._callbacks)
            for sub, cb in callbacks:
                for event in sub.drain():
                    try:
                        cb(event)
                    except Exception:
                        log.exception("rasd: an event callback raised (ignored)")
            if not callbacks:
                time.sleep(0.05)
