"""A peer whose frame is still arriving is not silent (issue 14; found by the fuzzer, docs/reliability.md §2.2).

Silence is measured from the last bytes heard from a peer, as NCCL's ``lastRecvTime`` (set on every receive, whole
message or not): a large frame crawling over a slow link, or an authenticated peer's stream left inside an
unfinished frame while the peer keeps sending, is a peer that speaks, not a peer to declare UNRESPONSIVE or HUNG.
"""

from __future__ import annotations

from rasd.core import node as core, wire
from rasd.core.config import Timers
from rasd.core.events import Kind

from .harness import Harness, peer

VERDICTS_AND_WARNINGS = (Kind.PEER_UNRESPONSIVE, Kind.PEER_HUNG, Kind.PEER_KEEPALIVE_TIMEOUT, Kind.PEER_DEAD)


def _pair(timers: Timers) -> Harness:
    h = Harness()
    h.add("a", peer(1), timers)
    h.add("b", peer(2), timers)
    h.introduce()
    return h


def _from_b(h: Harness) -> int:
    """The id, at ``a``, of a ready connection from ``b``."""
    return h["a"].ready_conns(h["b"].node.me.addr)[0].id


def test_a_frame_that_arrives_over_longer_than_the_hang_limit_keeps_its_sender_alive():
    t = Timers()
    h = _pair(t)
    a, b = h["a"], h["b"]
    cid = _from_b(h)
    h.pause("b")  # b says nothing of its own: only the frame's bytes reach a, a few every second
    frame = wire.encode(wire.PeersUpdate((a.node.me, b.node.me), (), (), True))
    seconds = int(t.hang) + 3
    pieces = [frame[i * len(frame) // seconds : (i + 1) * len(frame) // seconds] for i in range(seconds)]
    assert all(pieces) and b"".join(pieces) == frame
    for i, piece in enumerate(pieces):
        h.advance(float(i + 1), t.tick, ["a"])
        h.call("a", lambda piece=piece: a.node.received(cid, piece, h.now))
        h.run()
    assert h.now > t.hang + 1
    assert [e.kind for e in a.events if e.kind in VERDICTS_AND_WARNINGS] == []
    assert cid in a.node.conns and a.node.conns[cid].state is core.ConnState.READY  # the frame was handled


def test_a_peer_stuck_inside_an_unfinished_frame_is_heard_while_it_sends():
    # The fuzzer's case: an authenticated peer's stream holds the start of a 24 KB frame, and everything the peer
    # sends afterwards (its keepalives) is read as the rest of that frame. It still speaks: no verdict about it.
    t = Timers()
    h = _pair(t)
    a, b = h["a"], h["b"]
    cid = _from_b(h)
    h.call("a", lambda: a.node.received(cid, bytes.fromhex("0000608a0001020a040a00000175300000000000000000"), h.now))
    h.advance(t.reset - 1.0, t.tick)
    assert a.node.conns[cid].reader.buffered > 23  # b's keepalives went into the unfinished frame
    assert [e.kind for e in a.events if e.kind in VERDICTS_AND_WARNINGS] == []
    assert not a.node.hung and not a.node.dead and not b.node.hung
