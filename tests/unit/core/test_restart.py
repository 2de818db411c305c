"""In-process restarts in the core: the record a restart makes, the node's local notification (RESTART to its own
subscribers, nothing on the mesh) and the summary each process contributes to gathers, across the wire."""

import dataclasses
import math

import pytest
from hypothesis import given, settings, strategies as st

from rasd.core import node as core, wire
from rasd.core.comms import MAX_CAUSE_BYTES, CommRecord, ProcessData, RestartRecord, next_restart
from rasd.core.events import Group, Kind
from rasd.core.peers import Addr

from .harness import Harness, peer

RECORD = RestartRecord(
    iteration=3, restarts=2, cause="PEER_DEAD of rank 2 (pid 4242)", terminated=(2, 5), seconds_lost=0.375
)


# --- the record ---------------------------------------------------------------------------------------------------


def test_each_restart_counts_once_and_a_repeat_of_the_last_iteration_is_ignored():
    first = next_restart(None, 1, "PEER_DEAD of rank 2", (2,), 0.4)
    assert first == RestartRecord(1, 1, "PEER_DEAD of rank 2", (2,), 0.4)
    assert next_restart(first, 1, "again", (), 9.0) is None
    second = next_restart(first, 2, "COMM_STUCK", (), 1.5)
    assert (second.iteration, second.restarts, second.cause, second.terminated) == (2, 2, "COMM_STUCK", ())
    # A Wrapper called anew starts its iterations again: a lower iteration is a new restart, not a stale one.
    assert next_restart(second, 1, "", (), 0.0).restarts == 3


def test_odd_input_becomes_a_record_the_wire_can_carry():
    record = next_restart(None, -5, "a\nb\t c" + "é" * 200, (7, 7, -1, 2**31, 3), -2.0)
    assert record.iteration == 0 and record.terminated == (3, 7) and record.seconds_lost == 0.0
    assert record.cause.startswith("a b cé") and "\n" not in record.cause
    assert len(record.cause.encode()) <= MAX_CAUSE_BYTES and record.cause.endswith("...")  # marked as cut
    assert next_restart(None, 1, "x" * MAX_CAUSE_BYTES, (), 0.0).cause == "x" * MAX_CAUSE_BYTES  # fits: not cut
    record.cause.encode().decode()  # cut at a character boundary
    for bad in (float("nan"), float("inf")):
        assert next_restart(None, 1, "", (), bad).seconds_lost == 0.0
    assert next_restart(None, 2**40, "", (), 0.0).iteration == 2**32 - 1


def test_the_event_details():
    assert RECORD.describe() == (
        "restart 2 (iteration 3) after PEER_DEAD of rank 2 (pid 4242): ranks 2,5 terminated, 0.375s lost"
    )
    assert RestartRecord(1, 1).describe() == "restart 1 (iteration 1): no rank terminated, 0.000s lost"


# --- the wire -----------------------------------------------------------------------------------------------------


def collresp(*data: ProcessData) -> wire.CollResp:
    return wire.collresp(Addr("10.0.0.1", 1), 7, 0, tuple((Addr("10.0.0.1", 2 + i), d) for i, d in enumerate(data)))


def test_process_data_with_a_restart_round_trips():
    comm = CommRecord(comm_hash=5, size=1, ranks=())
    msg = collresp(
        ProcessData(restart=RECORD), ProcessData(comms=(comm,)), ProcessData(comms=(comm,), restart=RestartRecord(0, 0))
    )
    assert wire.decode_body(wire.encode(msg)[4:]) == msg


@settings(max_examples=100, deadline=None)
@given(
    st.integers(-10, 2**33),
    st.text(max_size=300),
    st.lists(st.integers(-3, 2**31 + 3), max_size=40),
    st.floats(allow_nan=True, allow_infinity=True),
)
def test_every_record_the_node_makes_round_trips(iteration, cause, ranks, lost):
    record = next_restart(None, iteration, cause, tuple(ranks), lost)
    msg = collresp(ProcessData(restart=record))
    assert wire.decode_body(wire.encode(msg)[4:]) == msg


def test_every_truncation_of_a_restart_is_a_protocol_error():
    body = wire.encode(collresp(ProcessData(restart=RECORD)))[4:]
    for cut in range(len(body)):
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(body[:cut]).entries  # noqa: B018 - decoding the entries is the point


@pytest.mark.parametrize(
    "record",
    [
        dataclasses.replace(RECORD, seconds_lost=-1.0),
        dataclasses.replace(RECORD, seconds_lost=math.inf),
        dataclasses.replace(RECORD, seconds_lost=math.nan),
        dataclasses.replace(RECORD, terminated=(5, 2)),
        dataclasses.replace(RECORD, terminated=(2, 2)),
        dataclasses.replace(RECORD, terminated=(-1,)),
    ],
)
def test_a_record_the_node_would_never_make_is_a_protocol_error(record):
    with pytest.raises(wire.ProtocolError):
        wire.decode_body(wire.encode(collresp(ProcessData(restart=record)))[4:]).entries  # noqa: B018 - decoding the entries is the point


def test_a_bad_presence_flag_is_a_protocol_error():
    body = bytearray(wire.encode(collresp(ProcessData()))[4:])
    assert body[-1] == 0  # the restart flag ends an entry without one
    body[-1] = 2
    with pytest.raises(wire.ProtocolError):
        wire.decode_body(bytes(body)).entries  # noqa: B018 - decoding the entries is the point


def trio() -> Harness:
    h = Harness()
    for i, name in enumerate("abc"):
        h.add(name, peer(i + 1))
    h.introduce()
    h.advance(2.0, 0.5)
    return h


def test_a_restart_is_a_lifecycle_event_of_this_node_only_and_sends_nothing():
    h = trio()
    sent_before = {n: len(h[n].sent) for n in "abc"}
    h.call("b", lambda: h["b"].node.restarted(3, "PEER_DEAD of rank 9", (9,), 0.25, h.now))
    h.run()
    (event,) = h["b"].kinds(Kind.RESTART)
    assert event.group == Group.LIFECYCLE and event.peer == h["b"].node.me and event.addr == h["b"].node.me.addr
    assert event.restart == RestartRecord(3, 1, "PEER_DEAD of rank 9", (9,), 0.25) and event.ranks == (9,)
    assert event.details == "restart 1 (iteration 3) after PEER_DEAD of rank 9: rank 9 terminated, 0.250s lost"
    assert not h["a"].kinds(Kind.RESTART) and not h["c"].kinds(Kind.RESTART)
    assert {n: len(h[n].sent) for n in "abc"} == sent_before
    # The same iteration again: no second event, no second count.
    h.call("b", lambda: h["b"].node.restarted(3, "PEER_DEAD of rank 9", (9,), 0.25, h.now))
    assert len(h["b"].kinds(Kind.RESTART)) == 1 and h["b"].node.restart.restarts == 1


def test_every_process_contributes_its_restart_to_a_gather():
    h = trio()
    for name, it in (("a", 4), ("b", 4), ("c", 3)):
        for i in range(1, it + 1):
            h.call(name, lambda name=name, i=i: h[name].node.restarted(i, f"cause {i}", (), 0.1, h.now))
    h.call("a", lambda: h["a"].node.start_gather(1, h.now))
    h.run()
    (done,) = [a for a in h["a"].actions if isinstance(a, core.GatherDone)]
    restarts = {addr.port: data.restart for addr, data in done.snapshot.responses.items()}
    assert restarts == {
        30001: RestartRecord(4, 4, "cause 4", (), 0.1),
        30002: RestartRecord(4, 4, "cause 4", (), 0.1),
        30003: RestartRecord(3, 3, "cause 3", (), 0.1),
    }


def test_a_process_that_never_restarted_contributes_none_and_local_data_wins():
    own = RestartRecord(9, 9, "the local data's own")
    h = Harness()
    h.add("a", peer(1), local_data=lambda: ProcessData(restart=own))
    h.add("b", peer(2))
    h.introduce()
    h.advance(2.0, 0.5)
    h.call("a", lambda: h["a"].node.restarted(1, "", (), 0.0, h.now))
    h.call("a", lambda: h["a"].node.start_gather(1, h.now))
    h.run()
    (done,) = [a for a in h["a"].actions if isinstance(a, core.GatherDone)]
    assert {addr.port: data.restart for addr, data in done.snapshot.responses.items()} == {30001: own, 30002: None}
