"""gather.py alone: a status gather rooted here or relayed, its legs, duplicates, timeouts and the snapshot."""

import dataclasses

import pytest

from rasd.core import gather, wire
from rasd.core.comms import CommRecord, ProcessData, RankRecord, RestartRecord
from rasd.core.connections import ConnState
from rasd.core.effects import GatherFinished, Say, SayFrame
from rasd.core.frames import Frame
from rasd.core.gather import Gathering, own_part
from rasd.core.peers import Addr
from rasd.core.snapshot import JobSnapshot
from rasd.core.stuck import StuckVerdict

from .world import FakeWorld, peer

ME, P2, P3, P4 = peer(1), peer(2), peer(3), peer(4)
P2_NEW = peer(2, incarnation=9002)
MINE = ProcessData(comms=(CommRecord(77, 1, (RankRecord(0),)),))


def _gathering(*conns: int):
    """Ready connections ``2``, ``3``, ``4`` to P2, P3, P4, each a link of ours and heard at 0."""
    world = FakeWorld(ME, [P2, P3, P4])
    world.local_data = lambda: MINE
    for i in conns:
        world.add_conn(i, peer(i))
        world.links.add(peer(i).addr)
    return world, Gathering(world)


def _finished(effects) -> JobSnapshot:
    (done,) = effects
    assert isinstance(done, GatherFinished)
    return done.snapshot


def test_a_root_sends_its_request_on_every_usable_connection_once_encoded():
    world, g = _gathering(2, 3, 4)
    world.add_conn(5, peer(5), ConnState.INIT)  # not ready
    world.delayed.add(P4.addr)  # delayed: skipped
    world.add_conn(6, peer(6))
    world.unwanted.add(6)  # neither side uses it
    world.add_conn(8, peer(8))  # not our link, but the peer uses it
    frame = wire.encode(wire.CollReq(ME.addr, 1, 5000))
    assert g.start(42, 1.0, None) == [SayFrame(2, frame), SayFrame(3, frame), SayFrame(8, frame)]
    (gather,) = g.gathers.values()
    assert (gather.root, gather.coll_id, gather.query_id, gather.pending, gather.timeout) == (
        ME.addr,
        1,
        42,
        {2, 3, 8},
        5.0,
    )
    assert gather.parts == [own_part(ME.addr, MINE)]


def test_a_silent_connection_is_no_leg():
    world, g = _gathering(2)
    snap = _finished(g.start(1, world.timers.unresponsive + 0.1, None))
    assert snap.contributions() == {ME.addr: MINE} and snap.timeouts == 0


def test_a_gather_with_nobody_to_wait_on_ends_at_once_with_our_own_entry():
    world, g = _gathering()
    world.merge(P2_NEW)
    world.dead.update({P3.key, P2.key})
    world.left.add(P4.key)
    world.stuck[9] = StuckVerdict(9, 0, 1, (0,), ())
    snap = _finished(g.start(7, 1.0, None))
    assert snap == JobSnapshot(
        peers=(ME, P2_NEW, P3, P4),
        dead=frozenset({P3.addr}),
        left=frozenset({P4.addr}),
        former_dead=(P2,),
        former_left=(),
        responses={ME.addr: MINE},
        timeouts=0,
        collection_time=0.0,
        stuck={9: StuckVerdict(9, 0, 1, (0,), ())},
        in_flight_grace=world.timers.in_flight,
    )
    assert g.gathers == {}


def test_the_root_decodes_the_answers_and_ends_when_every_leg_answered():
    world, g = _gathering(2, 3)
    g.start(7, 1.0, None)
    theirs = ProcessData(waiting=True)
    assert (
        g.on_collresp(world.conns[2], wire.collresp(ME.addr, 1, 1, ((P2.addr, theirs), (P4.addr, theirs))), 2.0) == []
    )
    assert g.on_collresp(world.conns[2], wire.collresp(ME.addr, 1, 0, ((P2.addr, MINE),)), 2.0) == []  # answered
    snap = _finished(g.on_collresp(world.conns[3], wire.collresp(ME.addr, 1, 0, ((P3.addr, theirs),)), 2.5))
    assert snap.contributions() == {ME.addr: MINE, P2.addr: theirs, P4.addr: theirs, P3.addr: theirs}
    assert (snap.timeouts, snap.collection_time) == (1, 1.5)


def test_the_root_raises_on_an_entry_it_cannot_decode():
    world, g = _gathering(2)
    g.start(7, 1.0, None)
    with pytest.raises(wire.ProtocolError):
        g.on_collresp(world.conns[2], wire.CollResp(ME.addr, 1, 0, 1, b"\xff\x00"), 2.0)


def test_a_relay_forwards_the_request_and_folds_the_entries_into_its_own():
    world, g = _gathering(2, 3, 4)
    root = P2.addr
    req = wire.CollReq(root, 5, 3000)
    frame = wire.encode(req)
    assert g.on_collreq(world.conns[2], req, 1.0) == [SayFrame(3, frame), SayFrame(4, frame)]
    (gather,) = g.gathers.values()
    assert (gather.from_conn, gather.timeout, gather.own.count, gather.fold.count) == (2, 3.0, 1, 0)
    theirs = ((P3.addr, MINE), (P4.addr, ProcessData(waiting=True)))
    assert g.on_collresp(world.conns[3], wire.collresp(root, 5, 2, theirs), 1.5) == []
    (back,) = g.on_collresp(world.conns[4], wire.CollResp(root, 5, 0, 0, b""), 1.6)
    # One reply: the leg's entries as they came, then its own, the ranks of MINE's one state folded together.
    assert back == Say(2, wire.collresp(root, 5, 2, (*theirs, (ME.addr, MINE))))
    assert isinstance(back.msg, wire.CollResp) and len(back.msg.fold.states) == 1
    assert g.gathers == {}


def test_a_reachability_gather_carries_who_answered_and_nothing_else():
    """The REACH ask (suspicion.py's): a relay answers for itself with an empty ``ProcessData``, whatever it holds,
    and passes its legs' answers on folded; the root's snapshot lists who answered."""
    world, g = _gathering(2, 3)
    req = wire.CollReq(P2.addr, 5, 3000, wire.Ask.REACH)
    assert g.on_collreq(world.conns[2], req, 1.0) == [SayFrame(3, wire.encode(req))]
    theirs = ((P3.addr, ProcessData()),)
    (back,) = g.on_collresp(world.conns[3], wire.collresp(P2.addr, 5, 0, theirs), 1.5)
    assert back == Say(2, wire.collresp(P2.addr, 5, 0, (*theirs, (ME.addr, ProcessData()))))
    root_world, root = _gathering(2)
    root.start(-2, 1.0, None, wire.Ask.REACH)
    snapshot = _finished(root.on_collresp(root_world.conns[2], wire.collresp(ME.addr, 1, 0, theirs), 1.5))
    assert snapshot.responses == {ME.addr: ProcessData(), P3.addr: ProcessData()} and not snapshot.states


def test_a_relay_refuses_a_leg_it_cannot_fold():
    world, g = _gathering(2, 3)
    g.on_collreq(world.conns[2], wire.CollReq(P2.addr, 5, 3000), 1.0)
    with pytest.raises(wire.ProtocolError):
        g.on_collresp(world.conns[3], wire.CollResp(P2.addr, 5, 0, 1, b"\xde\xad\xbe\xef"), 1.5)


def test_duplicates_are_answered_empty_while_the_gather_runs_and_after():
    world, g = _gathering(2, 3)
    req = wire.CollReq(P2.addr, 5, 0)
    g.on_collreq(world.conns[2], req, 1.0)
    empty = wire.CollResp(P2.addr, 5, 0, 0, b"")
    assert g.on_collreq(world.conns[3], req, 1.1) == [Say(3, empty)]
    g.on_collresp(world.conns[3], empty, 1.2)  # the leg answers: the relay answers its parent and remembers it
    assert g.on_collreq(world.conns[3], req, 1.3) == [Say(3, empty)]


def test_a_relay_whose_parent_is_gone_answers_nobody():
    world, g = _gathering(2, 3)
    req = wire.CollReq(P2.addr, 5, 0)
    g.on_collreq(world.conns[2], req, 1.0)
    del world.conns[2]
    assert g.on_collresp(world.conns[3], wire.CollResp(P2.addr, 5, 0, 0, b""), 1.1) == []
    assert g.on_collreq(world.conns[3], req, 1.3) == [Say(3, wire.CollResp(P2.addr, 5, 0, 0, b""))]


def test_a_purged_leg_counts_a_timeout_and_a_purged_parent_drops_the_gather():
    world, g = _gathering(2, 3)
    g.start(7, 1.0, None)
    assert g.purge(2, 2.0) == []
    assert g.gathers[(ME.addr, 1)].leg_timeouts == 1
    snap = _finished(g.purge(3, 2.5))
    assert snap.timeouts == 2 and g.gathers == {}
    # At a relay, purging the connection it answers to drops the gather, remembered as done.
    g.on_collreq(world.conns[2], wire.CollReq(P2.addr, 5, 0), 3.0)
    assert g.purge(2, 3.1) == [] and g.gathers == {}
    assert g.on_collreq(world.conns[3], wire.CollReq(P2.addr, 5, 0), 3.2) == [
        Say(3, wire.CollResp(P2.addr, 5, 0, 0, b""))
    ]


def test_a_leg_gone_silent_is_counted_at_the_next_tick():
    world, g = _gathering(2, 3)
    g.start(7, 1.0, float("inf"))
    world.conns[3].last_recv = 4.0
    assert g.tick(world.timers.unresponsive + 0.5) == []  # 2 silent for 5.5 s: counted; 3 still heard
    assert g.gathers[(ME.addr, 1)].pending == {3}
    assert _finished(g.tick(4.0 + world.timers.unresponsive + 0.1)).timeouts == 2


def test_the_collective_timeout_counts_legs_that_cannot_answer_and_the_hard_limit_ends_the_gather():
    world, g = _gathering(2, 3, 4)
    g.start(7, 0.0, 2.0)
    for c in world.conns.values():
        c.last_recv = 1.9
    world.delayed.add(P3.addr)
    del world.conns[4]
    assert g.tick(2.0) == []  # at the timeout: 3 (delayed) and 4 (closed) are counted, 2 may still answer
    gather = g.gathers[(ME.addr, 1)]
    assert (gather.pending, gather.leg_timeouts) == ({2}, 2)
    world.conns[2].last_recv = 6.9
    assert g.tick(2.0 + world.timers.gather_extra - 0.1) == []
    snap = _finished(g.tick(2.0 + world.timers.gather_extra))  # the hard limit: timeout + gather_extra
    assert snap.timeouts == 3


def test_the_request_carries_the_timeout_in_milliseconds():
    world, g = _gathering(2)
    assert g.start(1, 0.0, float("inf")) == [SayFrame(2, wire.encode(wire.CollReq(ME.addr, 1, 0)))]
    assert g.gathers[(ME.addr, 1)].timeout is None
    assert g.start(2, 0.0, 1e12) == [SayFrame(2, wire.encode(wire.CollReq(ME.addr, 2, 0xFFFFFFFF)))]
    assert g.start(3, 0.0, 1e-9) == [SayFrame(2, wire.encode(wire.CollReq(ME.addr, 3, 1)))]


def test_finish_all_ends_our_own_gathers_and_drops_the_relayed_ones():
    world, g = _gathering(2, 3)
    g.start(7, 0.0, None)
    g.on_collreq(world.conns[2], wire.CollReq(P2.addr, 5, 0), 0.0)
    assert _finished(g.finish_all(1.0)).timeouts == 2
    assert g.gathers == {}


def test_the_contribution_adds_our_restarts_and_the_waiting_flag():
    world, g = _gathering()
    restart = RestartRecord(iteration=3, restarts=1)
    world.restart = restart
    world.waiting = True
    assert g.contribution() == ProcessData(comms=MINE.comms, restart=restart, waiting=True)


# --- gathers of another ask (wire.Ask): one opaque answer per process, read by the root alone ----------------------

DIAG = wire.Ask.DIAGNOSTICS
NONE = wire.Answer()  # a process whose provider failed


def _answers(*entries: tuple[Addr, wire.Answer]) -> bytes:
    """A leg's answers, as its relay encodes them."""
    answers = wire.Answers()
    for addr, answer in entries:
        answers.add(addr, answer)
    return answers.encode()


def test_a_gather_of_another_ask_carries_the_ask_and_collects_answers_not_process_data():
    world, g = _gathering(2, 3)
    world.answers[DIAG] = wire.Answer(b"shared", b"mine")
    frame = wire.encode(wire.CollReq(ME.addr, 1, 5000, DIAG))
    assert g.start(9, 1.0, None, DIAG) == [SayFrame(2, frame), SayFrame(3, frame)]
    answered = wire.CollResp(ME.addr, 1, 0, 2, _answers((P2.addr, wire.Answer(b"shared", b"two")), (P4.addr, NONE)))
    assert g.on_collresp(world.conns[2], answered, 1.5) == []
    snap = _finished(g.on_collresp(world.conns[3], wire.CollResp(ME.addr, 1, 1, 0, b""), 2.0))
    assert snap.ask == DIAG
    assert snap.answers == {
        ME.addr: wire.Answer(b"shared", b"mine"),
        P2.addr: wire.Answer(b"shared", b"two"),
        P4.addr: NONE,
    }
    # Every answering process counts as a responder (none of them is missing), with no process data of its own.
    assert snap.responses == {a: ProcessData() for a in (ME.addr, P2.addr, P4.addr)}
    assert [p.addr for p in snap.missing()] == [P3.addr] and snap.timeouts == 1


def test_a_relay_answers_the_ask_it_was_asked_and_forwards_the_ask():
    world, g = _gathering(2, 3)
    world.answers[DIAG] = wire.Answer(b"in all-reduce 33", b"relay's")
    req = wire.CollReq(P2.addr, 5, 3000, DIAG)
    assert g.on_collreq(world.conns[2], req, 1.0) == [SayFrame(3, wire.encode(req))]
    assert g.on_collresp(world.conns[3], wire.CollResp(P2.addr, 5, 0, 0, b""), 1.5) == [
        Say(2, wire.CollResp(P2.addr, 5, 0, 1, _answers((ME.addr, wire.Answer(b"in all-reduce 33", b"relay's")))))
    ]


def test_a_relay_passes_a_shared_part_its_legs_brought_once():
    world, g = _gathering(2, 3, 4)
    world.answers[DIAG] = wire.Answer(b"in all-reduce 33", b"relay")
    g.on_collreq(world.conns[2], wire.CollReq(P2.addr, 5, 3000, DIAG), 1.0)
    leg = _answers((P3.addr, wire.Answer(b"in all-reduce 33", b"three")), (Addr("10.0.0.9", 1), NONE))
    assert g.on_collresp(world.conns[3], wire.CollResp(P2.addr, 5, 0, 2, leg), 1.5) == []
    (reply,) = g.on_collresp(world.conns[4], wire.CollResp(P2.addr, 5, 0, 1, _answers((P4.addr, NONE))), 1.6)
    assert isinstance(reply, Say) and isinstance(reply.msg, wire.CollResp)
    assert reply.msg.raw.count(b"in all-reduce 33") == 1
    assert reply.msg.answers == (  # its legs' as they came, then its own
        (P3.addr, wire.Answer(b"in all-reduce 33", b"three")),
        (Addr("10.0.0.9", 1), NONE),
        (P4.addr, NONE),
        (ME.addr, wire.Answer(b"in all-reduce 33", b"relay")),
    )
    assert len(reply.msg.raw) == len(wire.Answers.decode(4, reply.msg.raw).encode())


def test_a_status_gather_never_asks_the_providers():
    world, g = _gathering()
    world.answers[DIAG] = wire.Answer(own=b"not asked")
    snap = _finished(g.start(1, 1.0, None))
    assert snap.ask == wire.Ask.STATUS and snap.answers == {} and snap.contributions() == {ME.addr: MINE}


def test_the_root_rejects_answers_it_cannot_decode():
    world, g = _gathering(2)
    g.start(7, 1.0, None, DIAG)
    too_long = _answers((P2.addr, wire.Answer(own=b"x")))[:-1]  # the length says one byte more than there is
    with pytest.raises(wire.ProtocolError):
        g.on_collresp(world.conns[2], wire.CollResp(ME.addr, 1, 0, 1, too_long), 2.0)


# --- the sweeper's gather (wire.Ask.SWEEP): process data with where each process is ---------------------------------

HERE = (Frame("/src/train.py", 31, "step"), Frame("/usr/lib/python3.11/queue.py", 171, "get"))


def test_a_sweep_contribution_says_where_this_process_is_and_a_status_contribution_does_not():
    world, g = _gathering()
    world.where = HERE
    assert g.contribution(wire.Ask.SWEEP) == dataclasses.replace(MINE, where=HERE)
    assert g.contribution(wire.Ask.STATUS) == g.contribution() == MINE


def test_a_sweep_rooted_here_and_a_sweep_relayed_here_carry_the_position():
    world, g = _gathering(2)
    world.where = HERE
    g.start(3, 1.0, None, wire.Ask.SWEEP)
    assert g.gathers[(ME.addr, 1)].parts == [own_part(ME.addr, dataclasses.replace(MINE, where=HERE))]
    relay_world, relay = _gathering(2)
    relay_world.where = HERE
    # A relay with no other leg answers at once, with its own entry.
    (sweep,) = relay.on_collreq(relay_world.conns[2], wire.CollReq(P2.addr, 5, 3000, wire.Ask.SWEEP), 1.0)
    assert isinstance(sweep, Say) and isinstance(sweep.msg, wire.CollResp)
    assert sweep.msg.entries == ((ME.addr, dataclasses.replace(MINE, where=HERE)),)
    (status,) = relay.on_collreq(relay_world.conns[2], wire.CollReq(P2.addr, 6, 3000), 1.0)
    assert isinstance(status, Say) and isinstance(status.msg, wire.CollResp)
    assert status.msg.entries == ((ME.addr, MINE),)


def test_a_relay_never_passes_back_more_than_one_frame_holds():
    world, g = _gathering(2, 3, 4)
    req = wire.CollReq(P2.addr, 5, 3000, DIAG)
    g.on_collreq(world.conns[2], req, 1.0)
    own = b"x" * (wire.MAX_ANSWER_BYTES - 16)  # own parts: nothing to fold, as a diagnostics gather's
    n = wire.MAX_FRAME // 2 // len(own) + 1
    big = _answers(*((Addr("10.0.0.9", j + 1), wire.Answer(own=own)) for j in range(n)))  # half a frame
    assert g.on_collresp(world.conns[3], wire.CollResp(P2.addr, 5, 0, n, big), 1.5) == []
    (done,) = g.on_collresp(world.conns[4], wire.CollResp(P2.addr, 5, 0, n, big), 1.6)  # would not fit: dropped
    assert isinstance(done, Say) and done.msg.count == n + 1 and done.msg.leg_timeouts == 1
    assert len(done.msg.raw) <= gather.RELAY_BYTES
