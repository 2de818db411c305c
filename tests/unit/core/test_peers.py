"""Peers and the sorted, grow-only peer table."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.core.peers import Addr, PeerInfo, PeerTable, addr_set_hash, devices_text, table_hash


def p(host: str, port: int, pid: int = 1, inc: int = 1) -> PeerInfo:
    return PeerInfo(Addr(host, port), pid=pid, hostname="h", incarnation=inc)


def test_sort_order_is_ipv4_before_ipv6_then_ip_bytes_then_port():
    addrs = [Addr("::1", 1), Addr("10.0.0.10", 5), Addr("10.0.0.9", 7), Addr("10.0.0.9", 6), Addr("9.255.255.255", 9),
             Addr("fe80::1", 1), Addr("2001:db8::1", 65535), Addr("255.255.255.255", 1)]
    got = sorted(addrs, key=Addr.sort_key)
    assert got == [Addr("9.255.255.255", 9), Addr("10.0.0.9", 6), Addr("10.0.0.9", 7), Addr("10.0.0.10", 5),
                   Addr("255.255.255.255", 1), Addr("::1", 1), Addr("2001:db8::1", 65535), Addr("fe80::1", 1)]


def test_bytes_order_not_text_order():
    # As text "10.0.0.10" < "10.0.0.9"; as bytes 9 < 10.
    assert Addr("10.0.0.9", 1).sort_key() < Addr("10.0.0.10", 1).sort_key()
    assert Addr("10.0.0.1", 2).sort_key() < Addr("10.0.0.1", 10).sort_key()


def test_the_table_is_sorted_and_indexed():
    t = PeerTable()
    t.merge([p("10.0.0.2", 1), p("::1", 3), p("10.0.0.1", 9), p("10.0.0.1", 2)])
    assert [x.addr for x in t] == [Addr("10.0.0.1", 2), Addr("10.0.0.1", 9), Addr("10.0.0.2", 1), Addr("::1", 3)]
    assert t.index(Addr("10.0.0.2", 1)) == 2 and len(t) == 4
    assert Addr("::1", 3) in t and Addr("::1", 4) not in t
    assert t.get(Addr("::1", 3)).addr == Addr("::1", 3) and t.get(Addr("::1", 4)) is None
    assert t.entries() == list(t)


def test_merge_returns_only_new_entries_once_each():
    t = PeerTable()
    a, b, c = p("10.0.0.1", 1), p("10.0.0.1", 2), p("10.0.0.1", 3)
    assert t.merge([a, b]) == [a, b]
    assert t.merge([b, c, c, a]) == [c]
    assert t.merge([a, b, c]) == []
    assert len(t) == 3


def test_a_known_address_keeps_its_first_entry():
    t = PeerTable()
    first = p("10.0.0.1", 1, pid=10, inc=111)
    t.merge([first])
    h = t.hash
    assert t.merge([p("10.0.0.1", 1, pid=20, inc=222)]) == []
    assert t.get(Addr("10.0.0.1", 1)) == first and t.hash == h


def test_the_hash_changes_with_content():
    t = PeerTable()
    h0 = t.hash
    t.merge([p("10.0.0.1", 1)])
    h1 = t.hash
    t.merge([p("10.0.0.1", 2)])
    assert len({h0, h1, t.hash}) == 3
    assert table_hash([p("10.0.0.1", 1, inc=1)]) != table_hash([p("10.0.0.1", 1, inc=2)])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "192.168.0.1"]),
                          st.integers(1, 20), st.integers(1, 5)), max_size=30),
       st.randoms(use_true_random=False), st.integers(1, 5))
def test_the_table_hash_is_independent_of_merge_order_and_batching(entries, rnd, batches):
    peers = [p(h, port, inc=inc) for h, port, inc in entries]
    # Only the first entry of an address counts: keep one per address so every order sees the same set.
    unique = list({x.addr: x for x in reversed(peers)}.values())
    one, two = PeerTable(), PeerTable()
    one.merge(unique)
    shuffled = unique[:]
    rnd.shuffle(shuffled)
    cuts = sorted(rnd.randrange(len(shuffled) + 1) for _ in range(batches))
    for lo, hi in zip([0, *cuts], [*cuts, len(shuffled)]):
        two.merge(shuffled[lo:hi])
    assert one.hash == two.hash and list(one) == list(two)


def test_addr_set_hash_is_order_independent():
    a = [Addr("10.0.0.1", i) for i in range(10)]
    b = a[:]
    random.Random(3).shuffle(b)
    assert addr_set_hash(a) == addr_set_hash(b) != addr_set_hash(a[:-1])


def test_describe_names_the_devices_like_nccl():
    assert devices_text(()) == "CPU"
    assert devices_text((3,)) == "GPU 3"
    assert devices_text((0, 1)) == "GPUs 0,1"
    assert PeerInfo(Addr("10.0.0.1", 5), 42, "h", 1, (2,)).describe() == "Process 42 on node 10.0.0.1 managing GPU 2"
    assert str(Addr("10.0.0.1", 5)) == "10.0.0.1<5>"
