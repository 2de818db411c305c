"""In-process subscribers: queues that never block the publisher, replay for late subscribers, callbacks on their
own thread."""

from __future__ import annotations

import threading

from rasd.core.events import Event, Kind
from rasd.net.subscriptions import MAX_QUEUED, Subscribers


def ev(kind: Kind, at: float = 0.0) -> Event:
    return Event(kind=kind, at=at)


def test_kinds_filter_and_replay():
    subs = Subscribers()
    subs.publish(ev(Kind.PEER_NEW))
    subs.publish(ev(Kind.PEER_DEAD))
    late = subs.subscribe({Kind.PEER_DEAD}, replay=True)
    fresh = subs.subscribe({Kind.PEER_DEAD})
    subs.publish(ev(Kind.PEER_DEAD, 1.0))
    assert [e.at for e in late.drain()] == [0.0, 1.0]
    assert [e.at for e in fresh.drain()] == [1.0]
    assert late.get(timeout=0.01) is None


def test_a_subscriber_that_stops_reading_loses_old_events_and_never_blocks_the_publisher():
    subs = Subscribers()
    sub = subs.subscribe()
    for i in range(MAX_QUEUED + 50):
        subs.publish(ev(Kind.PEER_NEW, float(i)))
    got = sub.drain()
    assert len(got) == MAX_QUEUED and sub.dropped == 50 and got[-1].at == MAX_QUEUED + 49


def test_callbacks_run_on_the_dispatcher_thread_and_a_blocked_one_does_not_hold_the_publisher():
    subs = Subscribers()
    seen: list[tuple[str, float]] = []
    release = threading.Event()
    done = threading.Event()

    def blocked(e: Event) -> None:
        release.wait(30)
        seen.append((threading.current_thread().name, e.at))
        if len(seen) == 3:
            done.set()

    subs.on_event(blocked)
    publisher = threading.Thread(target=lambda: [subs.publish(ev(Kind.PEER_HUNG, float(i))) for i in range(3)])
    publisher.start()
    publisher.join(10)
    assert not publisher.is_alive(), "publishing waited for a callback"
    assert not seen
    release.set()
    assert done.wait(10)
    assert [at for _, at in seen] == [0.0, 1.0, 2.0]
    assert {name for name, _ in seen} == {"torchras-events"}


def test_a_raising_callback_is_logged_and_the_next_event_still_arrives():
    subs = Subscribers()
    got = threading.Event()

    def flaky(e: Event) -> None:
        if e.kind is Kind.PEER_DEAD:
            raise RuntimeError("subscriber bug")
        got.set()

    subs.on_event(flaky)
    subs.publish(ev(Kind.PEER_DEAD))
    subs.publish(ev(Kind.PEER_LEFT))
    assert got.wait(10)


def test_closing_a_subscription_stops_delivery():
    subs = Subscribers()
    with subs.subscribe() as sub:
        subs.publish(ev(Kind.PEER_NEW))
    subs.publish(ev(Kind.PEER_NEW, 1.0))
    assert [e.at for e in sub.drain()] == [0.0]
