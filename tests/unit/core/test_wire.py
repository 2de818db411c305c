"""The mesh's wire format: every message round-trips, and anything malformed is a ``ProtocolError`` (and nothing
else), however it is cut into chunks."""

import struct

import pytest
from hypothesis import given, settings, strategies as st

from rasd.core import wire
from rasd.core.comms import N_OPS, CommRecord, ProcessData, RankRecord
from rasd.core.frames import POSITION_FRAMES, Frame
from rasd.core.peers import Addr, PeerInfo, PeerKey
from rasd.core.stuck import StuckVerdict

V4 = PeerInfo(Addr("10.1.2.3", 40001), pid=4242, hostname="node-a", incarnation=2**64 - 1, devices=(0, 3), rank=17)
V6 = PeerInfo(Addr("fe80::1", 65535), pid=1, hostname="ünï-cödé", incarnation=0, devices=(), rank=-1)

DATA = ProcessData(
    comms=(
        CommRecord(
            comm_hash=2**64 - 1,
            size=4,
            rank_map=((0, 2, 1), (8, 2, 4)),
            ranks=(
                RankRecord(
                    comm_rank=0,
                    init_state=0,
                    async_error=7,
                    finalize_called=True,
                    destroy_flag=False,
                    abort_flag=True,
                    device=3,
                    launched=tuple(range(N_OPS)),
                    completed=tuple(range(N_OPS)),
                ),
                RankRecord(comm_rank=3, device=-1, launched=(2**64 - 1,) * N_OPS),
            ),
        ),
        CommRecord(comm_hash=5, size=1, ranks=()),
    )
)

#: A position as a sweep carries it: the innermost frames, with names that need more than one byte per character.
WHERE = (
    Frame("train.py", 31, "next_batch"),
    Frame("/usr/lib/python3.11/queue.py", 171, "get"),
    Frame("é" * 100, 2**32 - 1, "λ"),
)

MESSAGES = [
    wire.Hello(b"n" * wire.NONCE_LEN),
    wire.Challenge(b"c" * wire.NONCE_LEN, b"m" * wire.MAC_LEN),
    wire.Proof(b"p" * wire.MAC_LEN),
    wire.ConnInit(V4, 1, 2**64 - 1),
    wire.ConnInit(V6, 0, 0),
    wire.ConnInit(V4, 1, 2, 4096, V6.addr),  # a reunion probe: the connector's side
    wire.ConnInitAck(wire.Nack.OK, V4),
    wire.ConnInitAck(wire.Nack.YOU_ARE_DEAD),
    wire.ConnInitAck(wire.Nack.DUPLICATE),
    wire.ConnInitAck(wire.Nack.LEAVING, V6),
    wire.ConnInitAck(wire.Nack.OUTNUMBERED),
    wire.Keepalive(3, 4, True),
    wire.Keepalive(0, 2**64 - 1, False, 12345.678),
    wire.PeersUpdate((V4, V6), (V6.key,), (V4.key, PeerKey(Addr("::", 1), 0), PeerKey(V4.addr, 5)), True),
    wire.PeersUpdate((), (), (), False),
    *[wire.Flood(V4.addr, 9, kind, V6.addr, 12345) for kind in wire.FloodKind],
    wire.Flood(V4.addr, 10, wire.FloodKind.HUNG, V6.addr, 1, stamp=-3.5),
    wire.CollReq(V6.addr, 2**64 - 1, 0),
    wire.CollReq(V4.addr, 1, 5000),
    wire.CollReq(V4.addr, 3, 5000, wire.Ask.DIAGNOSTICS),
    wire.collresp(V4.addr, 1, 3, ((V4.addr, DATA), (V6.addr, ProcessData()))),
    wire.collresp(V4.addr, 1, 0, ()),
    wire.collresp(
        V4.addr, 2, 0, ((V6.addr, ProcessData(where=WHERE)), (V4.addr, ProcessData(waiting=True, where=WHERE)))
    ),
    wire.CommVerdict(
        V4.addr, 7, True, StuckVerdict(2**64 - 1, N_OPS - 1, 2**64 - 1, (2,), (0, 1, 3), (10,), (8, 9, 11))
    ),
    wire.CommVerdict(V6.addr, 8, False, StuckVerdict(0, 0, 0, (), (), (), ())),
    wire.CommVerdict(V6.addr, 9, True, StuckVerdict(5, 0, 62, (2,), (0, 1, 3), (2,), (0, 1, 3), ((2, WHERE), (7, ())))),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    frame = wire.encode(msg)
    (length,) = struct.unpack("!I", frame[:4])
    assert length == len(frame) - 4
    assert frame[4] == wire.VERSION
    assert wire.decode_body(frame[4:]) == msg
    reader = wire.FrameReader(wire.MAX_FRAME)
    assert list(reader.feed(frame)) == [msg]
    assert reader.buffered == 0


def decode_fully(b: bytes) -> wire.Message:
    """``decode_body``, and a gather answer's entries too (a relay leaves them encoded; the root decodes them)."""
    msg = wire.decode_body(b)
    if isinstance(msg, wire.CollResp):
        msg.entries  # noqa: B018 - decoding is the point
    return msg


def test_answers_round_trip_and_are_bounded():
    answers = (
        (V4.addr, wire.Answer()),
        (V6.addr, wire.Answer(b"s" * 100, b"x" * (wire.MAX_ANSWER_BYTES - 100))),
        (V4.addr._replace(port=2), wire.Answer(own=b"own only")),
    )
    gathered = wire.Answers()
    for addr, answer in answers:
        gathered.add(addr, answer)
    raw = gathered.encode()
    assert len(raw) == gathered.size
    assert wire.CollResp(V4.addr, 1, 0, 3, raw).answers == answers
    with pytest.raises(ValueError):
        wire.Answers().add(V4.addr, wire.Answer(b"x", b"x" * wire.MAX_ANSWER_BYTES))
    entry = wire._packed_addr(V4.addr)
    bad = {
        "own part too long": struct.pack("!I", 0) + entry + struct.pack("!II", 0xFFFFFFFF, 70000) + b"x" * 70000,
        "shared part not held": struct.pack("!I", 0) + entry + struct.pack("!II", 0, 0),
        "empty shared part": struct.pack("!II", 1, 0) + entry + struct.pack("!II", 0, 0),
        "a shared part twice": struct.pack("!IIcIc", 2, 1, b"a", 1, b"a") + entry + struct.pack("!II", 0, 0),
        "both parts too long together": struct.pack("!I", 1)
        + struct.pack("!I", 40000)
        + b"s" * 40000
        + entry
        + struct.pack("!II", 0, 30000)
        + b"x" * 30000,
        "trailing bytes": struct.pack("!I", 0) + entry + struct.pack("!II", 0xFFFFFFFF, 0) + b"?",
        "truncated": struct.pack("!I", 0) + entry + struct.pack("!II", 0xFFFFFFFF, 5) + b"abc",
        "bad address": struct.pack("!I", 0) + b"\x05" + b"\x00" * 12,
    }
    for what, raw in bad.items():
        with pytest.raises(wire.ProtocolError):
            wire.CollResp(V4.addr, 1, 0, 1, raw).answers  # noqa: B018 - decoding is the point
            pytest.fail(what)
    with pytest.raises(wire.ProtocolError):  # an ask this version does not know
        wire.decode_body(wire.encode(wire.CollReq(V4.addr, 1, 0))[4:-1] + b"\x7f")


def test_a_relay_carries_each_shared_part_once():
    """Processes in the same place give the same shared part: a relay's reply carries it once, however many legs
    brought it, and the root reads every process's answer whole."""
    legs = []
    for leg in range(3):
        answers = wire.Answers()
        for j in range(50):
            shared = b"inside all-reduce 33" if j % 10 else b"waiting in time.sleep"
            answers.add(Addr("10.0.0.1", 1000 * leg + j), wire.Answer(shared * 20, f"pid {leg}-{j}".encode()))
        legs.append(wire.Answers.decode(answers.count, answers.encode()))  # as it arrives
    relay = wire.Answers()
    relay.add(Addr("10.0.0.2", 1), wire.Answer(b"the relay's own stack", b"relay"))
    for leg in legs:
        relay.merge(leg)
    raw = relay.encode()
    assert len(raw) == relay.size
    assert len(relay.shared) == 3
    assert raw.count(b"inside all-reduce 33" * 20) == 1
    got = dict(wire.CollResp(V4.addr, 1, 0, relay.count, raw).answers)
    assert len(got) == 151
    assert got[Addr("10.0.0.1", 2013)] == wire.Answer(b"inside all-reduce 33" * 20, b"pid 2-13")
    assert got[Addr("10.0.0.1", 1020)] == wire.Answer(b"waiting in time.sleep" * 20, b"pid 1-20")
    assert got[Addr("10.0.0.2", 1)] == wire.Answer(b"the relay's own stack", b"relay")


@settings(max_examples=200, deadline=None)
@given(
    legs=st.lists(
        st.lists(st.tuples(st.sampled_from([b"", b"a", b"bb", b"ccc"]), st.binary(max_size=8)), max_size=6),
        max_size=4,
    )
)
def test_merged_answers_are_the_answers_added_one_by_one(legs):
    merged, flat = wire.Answers(), wire.Answers()
    port = 0
    for leg in legs:
        answers = wire.Answers()
        for shared, own in leg:
            port += 1
            answers.add(Addr("10.1.1.1", port), wire.Answer(shared, own))
            flat.add(Addr("10.1.1.1", port), wire.Answer(shared, own))
        merged.merge(wire.Answers.decode(answers.count, answers.encode()))
    assert merged.answers() == flat.answers()
    assert merged.size == len(merged.encode()) or not merged.count
    assert len(merged.shared) == len({shared for leg in legs for shared, _ in leg if shared})


def test_positions_are_bounded_on_the_wire():
    long = tuple(Frame(f"f{i}.py", i, "g") for i in range(10))
    (entry,) = wire.decode_body(
        wire.encode(wire.collresp(V4.addr, 1, 0, ((V4.addr, ProcessData(where=long)),)))[4:]
    ).entries
    assert entry[1].where == long[-POSITION_FRAMES:]  # the innermost frames
    wide = (Frame("x" * 300, 1, "y" * 300),)
    (entry,) = wire.decode_body(
        wire.encode(wire.collresp(V4.addr, 1, 0, ((V4.addr, ProcessData(where=wide)),)))[4:]
    ).entries
    assert entry[1].where == (Frame("x" * 255, 1, "y" * 255),)


def test_every_message_type_is_covered():
    assert {type(m) for m in MESSAGES} == set(wire.Message.__args__)
    assert {wire.encode(m)[5] for m in MESSAGES} == {int(t) for t in wire.MsgType}


def test_frames_split_byte_by_byte_and_glued_together_decode_in_order():
    stream = b"".join(wire.encode(m) for m in MESSAGES)
    reader = wire.FrameReader(wire.MAX_FRAME)
    out = []
    for i in range(len(stream)):
        out.extend(reader.feed(stream[i : i + 1]))
    assert out == MESSAGES
    assert list(wire.FrameReader(wire.MAX_FRAME).feed(stream)) == MESSAGES


def test_the_peer_record_of_the_bootstrap_store_round_trips():
    for p in (V4, V6):
        assert wire.decode_peer(wire.encode_peer(p)) == p
    with pytest.raises(wire.ProtocolError):
        wire.decode_peer(wire.encode_peer(V4) + b"\x00")
    with pytest.raises(wire.ProtocolError):
        wire.decode_peer(bytes([wire.VERSION + 1]) + wire.encode_peer(V4)[1:])
    with pytest.raises(wire.ProtocolError):
        wire.decode_peer(wire.encode_peer(V4)[:-1])


# ----------------------------------------------------------------------------------------------------------------
# Malformed bodies


def body(msg) -> bytes:
    return wire.encode(msg)[4:]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_truncation_is_a_protocol_error(msg):
    b = body(msg)
    for cut in range(len(b)):
        with pytest.raises(wire.ProtocolError):
            decode_fully(b[:cut])


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_trailing_bytes_are_a_protocol_error(msg):
    with pytest.raises(wire.ProtocolError, match="trailing"):
        decode_fully(body(msg) + b"\x00")


def test_a_bad_version_is_a_protocol_error():
    b = bytearray(body(wire.Keepalive(1, 2, True)))
    for version in (0, wire.VERSION - 1, wire.VERSION + 1, 255):
        b[0] = version
        with pytest.raises(wire.ProtocolError, match="version"):
            decode_fully(bytes(b))


@pytest.mark.parametrize("t", [0, 11, 99, 255])
def test_an_unknown_type_is_a_protocol_error(t):
    with pytest.raises(wire.ProtocolError):
        decode_fully(bytes([wire.VERSION, t]) + b"\x00" * 40)


def test_bad_enums_and_booleans_are_protocol_errors():
    ack = bytearray(body(wire.ConnInitAck(wire.Nack.OK)))
    ack[2] = 99  # nack
    with pytest.raises(wire.ProtocolError, match="Nack"):
        decode_fully(bytes(ack))
    ack = bytearray(body(wire.ConnInitAck(wire.Nack.OK)))
    ack[3] = 2  # "has info" boolean
    with pytest.raises(wire.ProtocolError, match="boolean"):
        decode_fully(bytes(ack))
    ka = bytearray(body(wire.Keepalive(1, 2, True)))
    ka[-9] = 2  # the "wanted" boolean, before the 8-byte clock
    with pytest.raises(wire.ProtocolError, match="boolean"):
        decode_fully(bytes(ka))
    flood = bytearray(body(wire.Flood(V4.addr, 1, wire.FloodKind.DEAD, V4.addr, 2)))
    kind_at = 2 + 1 + 4 + 2 + 8
    assert flood[kind_at] == wire.FloodKind.DEAD
    flood[kind_at] = 0
    with pytest.raises(wire.ProtocolError, match="FloodKind"):
        decode_fully(bytes(flood))
    pu = bytearray(body(wire.PeersUpdate((), (), (), True)))
    pu[2] = 7
    with pytest.raises(wire.ProtocolError, match="boolean"):
        decode_fully(bytes(pu))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_clock_that_is_not_a_finite_number_is_a_protocol_error(bad):
    for msg in (wire.Keepalive(1, 2, True, bad), wire.Flood(V4.addr, 1, wire.FloodKind.HUNG, V6.addr, 1, bad)):
        with pytest.raises(wire.ProtocolError, match="finite"):
            decode_fully(body(msg))


@pytest.mark.parametrize("n", [0, 3, 5, 15, 17, 255])
def test_a_bad_address_length_is_a_protocol_error(n):
    b = bytearray(body(wire.CollReq(V4.addr, 1, 2)))
    assert b[2] == 4
    b[2] = n
    with pytest.raises(wire.ProtocolError):
        decode_fully(bytes(b))


def test_invalid_utf8_in_a_hostname_is_a_protocol_error():
    b = body(wire.ConnInit(PeerInfo(Addr("10.0.0.1", 5), 1, "abcd", 1), 1, 2))
    b = b.replace(b"abcd", b"\xff\xfe\xc3\x28")
    with pytest.raises(wire.ProtocolError, match="utf-8"):
        decode_fully(b)


def test_a_peer_with_port_zero_is_a_protocol_error():
    with pytest.raises(wire.ProtocolError):
        decode_fully(body(wire.ConnInit(PeerInfo(Addr("10.0.0.1", 0), 1, "h", 1), 1, 2)))


def test_wrong_magic_is_a_protocol_error():
    b = body(wire.Hello(b"n" * 16)).replace(wire.MAGIC, b"HTTP")
    with pytest.raises(wire.ProtocolError, match="magic"):
        decode_fully(b)


def test_a_rank_state_with_the_wrong_op_count_or_flags_is_a_protocol_error():
    good = body(wire.collresp(V4.addr, 1, 0, ((V4.addr, DATA),)))
    # The first rank state's flags: find them by encoding their fields (init state, async error, flags, op count).
    head = struct.pack("!BBBB", 0, 7, 0b101, N_OPS)
    at = good.index(head)
    for patch in (struct.pack("!BBBB", 0, 7, 0b101, N_OPS - 1), struct.pack("!BBBB", 0, 7, 8, N_OPS)):
        with pytest.raises(wire.ProtocolError, match="rank state"):
            decode_fully(good[:at] + patch + good[at + len(head) :])


@pytest.mark.parametrize(
    "msg",
    [
        wire.PeersUpdate((V4,), (V6.key,), (), True),
        wire.collresp(V4.addr, 1, 0, ((V4.addr, DATA),)),
    ],
    ids=["peersupdate", "collresp"],
)
def test_a_huge_count_is_refused_before_anything_is_allocated(msg):
    b = bytearray(body(msg))
    # Patch every 32-bit big-endian field in turn to 2**32-1; none may do anything but raise ProtocolError.
    for i in range(2, len(b) - 3):
        patched = bytes(b[:i]) + b"\xff\xff\xff\xff" + bytes(b[i + 4 :])
        try:
            decode_fully(patched)
        except wire.ProtocolError:
            pass


def test_encoding_refuses_what_the_decoder_could_not_read():
    with pytest.raises(ValueError):
        wire.encode(wire.Hello(b"short"))
    with pytest.raises(ValueError):
        wire.encode(wire.ConnInit(PeerInfo(Addr("10.0.0.1", 5), 1, "x" * 256, 1), 1, 2))


# ----------------------------------------------------------------------------------------------------------------
# The frame reader


def test_the_preauth_limit_refuses_a_big_frame_from_its_length_alone():
    reader = wire.FrameReader()
    assert reader.max_frame == wire.PREAUTH_MAX_FRAME
    with pytest.raises(wire.ProtocolError, match="exceeds"):
        list(reader.feed(struct.pack("!I", wire.PREAUTH_MAX_FRAME + 1)))


def test_a_frame_at_the_preauth_limit_is_waited_for():
    reader = wire.FrameReader()
    assert list(reader.feed(struct.pack("!I", wire.PREAUTH_MAX_FRAME) + b"\x01" * 10)) == []
    assert reader.buffered == 14


def test_every_handshake_message_fits_the_preauth_limit_but_a_table_does_not_have_to():
    for m in (wire.Hello(b"n" * 16), wire.Challenge(b"c" * 16, b"m" * 32), wire.Proof(b"p" * 32)):
        assert len(wire.encode(m)) - 4 <= wire.PREAUTH_MAX_FRAME
    big = wire.PeersUpdate(tuple(PeerInfo(Addr("10.0.0.1", 1000 + i), i, "h", i) for i in range(20)), (), (), True)
    with pytest.raises(wire.ProtocolError):
        list(wire.FrameReader().feed(wire.encode(big)))
    assert list(wire.FrameReader(wire.MAX_FRAME).feed(wire.encode(big))) == [big]


def test_raising_the_limit_after_authentication_admits_big_frames_mid_stream():
    reader = wire.FrameReader()
    hello = wire.encode(wire.Hello(b"n" * 16))
    ka = wire.encode(wire.Keepalive(1, 2, True))
    assert list(reader.feed(hello + ka[:3])) == [wire.Hello(b"n" * 16)]
    reader.max_frame = wire.MAX_FRAME
    assert list(reader.feed(ka[3:])) == [wire.Keepalive(1, 2, True)]


def test_the_authenticated_limit_is_enforced_too():
    reader = wire.FrameReader(wire.MAX_FRAME)
    with pytest.raises(wire.ProtocolError):
        list(reader.feed(struct.pack("!I", wire.MAX_FRAME + 1)))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=8), authenticated=st.booleans())
def test_arbitrary_bytes_in_arbitrary_chunks_raise_nothing_but_protocol_error(data, cuts, authenticated):
    reader = wire.FrameReader(wire.MAX_FRAME if authenticated else wire.PREAUTH_MAX_FRAME)
    bounds = sorted({0, len(data), *[min(c, len(data)) for c in cuts]})
    try:
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            for msg in reader.feed(data[lo:hi]):
                assert isinstance(msg, wire.Message.__args__)
    except wire.ProtocolError:
        pass


frames = st.sampled_from(MESSAGES).map(wire.encode)


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.lists(frames, max_size=4),
    junk=st.binary(min_size=1, max_size=64),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
)
def test_valid_frames_with_corrupted_bytes_raise_nothing_but_protocol_error(prefix, junk, flips, cuts):
    stream = bytearray(b"".join(prefix) + junk)
    for pos, x in flips:
        stream[pos % len(stream)] ^= x
    reader = wire.FrameReader(wire.MAX_FRAME)
    bounds = sorted({0, len(stream), *[min(c, len(stream)) for c in cuts]})
    try:
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            list(reader.feed(bytes(stream[lo:hi])))
    except wire.ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(msg=st.sampled_from(MESSAGES), pos=st.integers(0, 10_000), value=st.integers(0, 255))
def test_a_body_with_one_byte_changed_decodes_or_raises_protocol_error(msg, pos, value):
    b = bytearray(body(msg))
    b[pos % len(b)] = value
    try:
        out = decode_fully(bytes(b))
    except wire.ProtocolError:
        return
    # Whatever decodes must encode back to exactly these bytes (no two encodings of one message).
    assert body(out) == bytes(b)


addrs = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str)).flatmap(
    lambda host: st.integers(1, 65535).map(lambda port: Addr(host, port))
)
peers = st.builds(
    PeerInfo,
    addr=addrs,
    pid=st.integers(0, 2**32 - 1),
    hostname=st.text(max_size=60),
    incarnation=st.integers(0, 2**64 - 1),
    devices=st.lists(st.integers(0, 255), max_size=8).map(tuple),
    rank=st.integers(-(2**31), 2**31 - 1),
)
u64 = st.integers(0, 2**64 - 1)
keys = st.builds(PeerKey, addrs, u64)
messages = st.one_of(
    st.builds(wire.ConnInit, peers, u64, u64),
    st.builds(wire.ConnInitAck, st.sampled_from(list(wire.Nack)), st.none() | peers),
    st.builds(wire.Keepalive, u64, u64, st.booleans()),
    st.builds(
        wire.PeersUpdate,
        st.lists(peers, max_size=5).map(tuple),
        st.lists(keys, max_size=5).map(tuple),
        st.lists(keys, max_size=5).map(tuple),
        st.booleans(),
    ),
    st.builds(wire.Flood, addrs, u64, st.sampled_from(list(wire.FloodKind)), addrs, u64),
    st.builds(wire.CollReq, addrs, u64, st.integers(0, 2**32 - 1)),
    st.builds(
        wire.collresp,
        addrs,
        u64,
        st.integers(0, 2**32 - 1),
        st.lists(st.tuples(addrs, st.just(DATA) | st.just(ProcessData())), max_size=3).map(tuple),
    ),
)


@settings(max_examples=300, deadline=None)
@given(msg=messages)
def test_any_message_round_trips(msg):
    assert list(wire.FrameReader(wire.MAX_FRAME).feed(wire.encode(msg))) == [msg]
