"""The wire's caches of table entries (issue 30): decoded entries by their bytes (``_PEERS``) and the bytes of encoded
ones (``_PEER_BYTES``). A cache must never change what decodes, nor let a malformed entry through: every test runs
with both caches empty and then full of the same entries, and the module's caches and bound are restored after it."""

import pytest
from hypothesis import given, settings, strategies as st

from rasd.core import wire
from rasd.core.peers import Addr, PeerInfo, PeerKey

V4 = PeerInfo(Addr("10.1.2.3", 40001), pid=4242, hostname="node-a", incarnation=2**64 - 1, devices=(0, 3), rank=17)
V6 = PeerInfo(Addr("fe80::1", 65535), pid=1, hostname="ünï-cödé", incarnation=0, devices=(), rank=-1)
V4B = PeerInfo(Addr("10.1.2.4", 1), pid=7, hostname="node-b", incarnation=12345, devices=(1, 2, 3, 4, 5, 6, 7), rank=3)
PEERS = (V4, V6, V4B)
UPDATE = wire.PeersUpdate(PEERS, (V4.key,), (PeerKey(V6.addr, 9),), full=True)

#: A PEERSUPDATE body: version, type, ``full``, the entry count (u32), then the entries.
FIRST_ENTRY = 1 + 1 + 1 + 4


@pytest.fixture(autouse=True)
def cold(monkeypatch):
    """Empty caches of the module's own, at its default bound (the simulator raises it for the whole process)."""
    monkeypatch.setattr(wire, "_PEERS", {})
    monkeypatch.setattr(wire, "_PEER_BYTES", {})
    monkeypatch.setattr(wire, "PEER_CACHE_MAX", 1 << 14)


def body(msg) -> bytes:
    b = wire.encode(msg)[4:]
    # Longer than the frames decoded whole from a cache of their own (``_decode_recurring``): the entry caches are
    # what these tests reach.
    assert len(b) > wire._RECURRING_MAX
    return b


def entry_bytes(p: PeerInfo) -> bytes:
    return wire.encode_peer(p)[1:]  # less the record's version byte


def test_a_peers_update_round_trips_with_the_caches_cold_and_warm():
    cold_body = body(UPDATE)
    assert set(wire._PEER_BYTES) == set(PEERS)  # each entry's bytes are kept as encoded
    assert wire.decode_body(cold_body) == UPDATE
    assert set(wire._PEERS) == {entry_bytes(p) for p in PEERS} and set(wire._PEERS.values()) == set(PEERS)
    warm_body = body(UPDATE)
    assert warm_body == cold_body
    assert wire.decode_body(warm_body) == UPDATE
    # Cached bytes are the bytes a cold encoder writes.
    for p in PEERS:
        assert wire._PEER_BYTES[p] == entry_bytes(p)
        assert cold_body.count(entry_bytes(p)) == 1


def test_decoding_a_frame_twice_gives_the_same_objects():
    b = body(UPDATE)
    first, second = wire.decode_body(b), wire.decode_body(b)
    assert first == second
    assert all(x is y for x, y in zip(first.peers, second.peers, strict=True))
    # Across message types too: the entry of a handshake is the table's.
    hello = wire.decode_body(wire.encode(wire.ConnInit(V4B, 1, 2))[4:])
    assert hello.info is first.peers[2]
    assert wire.decode_peer(wire.encode_peer(V6)) is first.peers[1]


def _cuts_inside_entries() -> list[int]:
    """Every cut of UPDATE's body inside its entries, the host-name and devices bytes of each among them."""
    b = body(UPDATE)
    cuts, at = [], FIRST_ENTRY
    for p in PEERS:
        e = entry_bytes(p)
        assert b[at : at + len(e)] == e
        name = at + 1 + e[0] + 18  # the host name's length byte
        devices = name + 1 + len(p.hostname.encode())  # the devices' count byte
        inside = range(at + 1, at + len(e))
        assert {name, name + 1, devices, devices + 1, at + len(e) - 1} <= set(inside) or not p.devices
        cuts += inside
        at += len(e)
    return cuts


@pytest.mark.parametrize("warm", [False, True])
def test_an_entry_cut_short_is_a_protocol_error(warm):
    b = body(UPDATE)
    if warm:
        wire.decode_body(b)
        wire.decode_peer(wire.encode_peer(V4))
        assert len(wire._PEERS) == len(PEERS)
    for cut in _cuts_inside_entries():
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(b[:cut])
    for p in PEERS:
        record = wire.encode_peer(p)
        for cut in range(1, len(record)):
            with pytest.raises(wire.ProtocolError):
                wire.decode_peer(record[:cut])
    # Nothing cut short was cached: only whole entries (those before a cut), each under its own bytes.
    assert wire._PEERS.items() <= {entry_bytes(p): p for p in PEERS}.items()
    assert wire.decode_body(b) == UPDATE


@pytest.mark.parametrize("warm", [False, True])
def test_an_entry_with_port_zero_is_refused_and_not_cached(warm):
    zero = PeerInfo(Addr("10.9.9.9", 0), pid=5, hostname="zero-port-host", incarnation=77, devices=(0,), rank=1)
    b = body(wire.PeersUpdate((V4, zero, V6), (), (), full=False))
    if warm:
        wire.decode_body(body(UPDATE))
    for _ in range(2):  # and again, after the first attempt
        with pytest.raises(wire.ProtocolError, match="port 0"):
            wire.decode_body(b)
        assert entry_bytes(zero) not in wire._PEERS
        assert zero not in wire._PEERS.values()
        with pytest.raises(wire.ProtocolError, match="port 0"):
            wire.decode_peer(wire.encode_peer(zero))


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("n", [0, 3, 5, 15, 17, 255])
def test_a_bad_address_length_in_an_entry_is_a_protocol_error(warm, n):
    if warm:
        wire.decode_body(body(UPDATE))
    b = bytearray(body(UPDATE))
    assert b[FIRST_ENTRY] == 4
    b[FIRST_ENTRY] = n
    before = dict(wire._PEERS)
    for _ in range(2):
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(bytes(b))
        record = bytearray(wire.encode_peer(V4))
        record[1] = n
        with pytest.raises(wire.ProtocolError):
            wire.decode_peer(bytes(record))
    assert before == wire._PEERS


def test_a_small_bound_keeps_the_caches_small_and_decoding_right(monkeypatch):
    monkeypatch.setattr(wire, "PEER_CACHE_MAX", 4)
    many = tuple(
        PeerInfo(Addr(f"10.0.{i // 4}.1", 20000 + i % 4), pid=100 + i, hostname=f"h{i // 4}", incarnation=i, rank=i)
        for i in range(10)
    )
    msg = wire.PeersUpdate(many, (), (), full=True)
    for _ in range(3):
        b = body(msg)
        assert len(wire._PEER_BYTES) <= 4
        assert wire.decode_body(b) == msg
        assert len(wire._PEERS) <= 4
    for p in many:
        assert wire.decode_peer(wire.encode_peer(p)) == p
        assert len(wire._PEERS) <= 4 and len(wire._PEER_BYTES) <= 4
    assert set(wire._PEERS.values()) <= set(many)


_PEER = st.builds(
    PeerInfo,
    addr=st.builds(
        Addr,
        st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "2001:db8::7"]),
        st.integers(1, 65535),
    ),
    pid=st.integers(0, 2**32 - 1),
    hostname=st.text(max_size=12).filter(lambda s: len(s.encode()) <= 255),
    incarnation=st.integers(0, 2**64 - 1),
    devices=st.lists(st.integers(0, 255), max_size=8).map(tuple),
    rank=st.integers(-(2**31), 2**31 - 1),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(_PEER, min_size=3, max_size=8), st.integers(0, 10**6), st.integers(1, 8))
def test_any_entries_round_trip_and_any_cut_is_an_error_cold_or_warm(peers, cut, bound):
    wire._PEERS.clear()
    wire._PEER_BYTES.clear()
    wire.PEER_CACHE_MAX = bound  # restored by the fixture
    msg = wire.PeersUpdate(tuple(peers), (), (), full=False)
    b = wire.encode(msg)[4:]
    end = FIRST_ENTRY + sum(len(entry_bytes(p)) for p in peers)
    at = FIRST_ENTRY + cut % (end - FIRST_ENTRY)  # a cut inside the entries
    for _ in range(2):  # cold, then warm
        assert wire.encode(msg)[4:] == b
        assert wire.decode_body(b) == msg
        with pytest.raises(wire.ProtocolError):
            wire.decode_body(b[:at])
        assert len(wire._PEERS) <= bound and len(wire._PEER_BYTES) <= bound
