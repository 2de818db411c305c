"""Peers, their keys and incarnations, and the sorted, grow-only peer table."""

import random

from hypothesis import given, settings, strategies as st

from rasd.core.peers import (
    INCARNATION_RANDOM_BITS,
    Addr,
    PeerInfo,
    PeerKey,
    PeerTable,
    devices_text,
    key_set_hash,
    new_incarnation,
    table_hash,
)


def p(host: str, port: int, pid: int = 1, inc: int = 1) -> PeerInfo:
    return PeerInfo(Addr(host, port), pid=pid, hostname="h", incarnation=inc)


def test_sort_order_is_ipv4_before_ipv6_then_ip_bytes_then_port():
    addrs = [
        Addr("::1", 1),
        Addr("10.0.0.10", 5),
        Addr("10.0.0.9", 7),
        Addr("10.0.0.9", 6),
        Addr("9.255.255.255", 9),
        Addr("fe80::1", 1),
        Addr("2001:db8::1", 65535),
        Addr("255.255.255.255", 1),
    ]
    got = sorted(addrs, key=Addr.sort_key)
    assert got == [
        Addr("9.255.255.255", 9),
        Addr("10.0.0.9", 6),
        Addr("10.0.0.9", 7),
        Addr("10.0.0.10", 5),
        Addr("255.255.255.255", 1),
        Addr("::1", 1),
        Addr("2001:db8::1", 65535),
        Addr("fe80::1", 1),
    ]


def test_bytes_order_not_text_order():
    # As text "10.0.0.10" < "10.0.0.9"; as bytes 9 < 10.
    assert Addr("10.0.0.9", 1).sort_key() < Addr("10.0.0.10", 1).sort_key()
    assert Addr("10.0.0.1", 2).sort_key() < Addr("10.0.0.1", 10).sort_key()


def test_the_table_is_sorted_and_indexed():
    t = PeerTable()
    t.merge([p("10.0.0.2", 1), p("::1", 3), p("10.0.0.1", 9), p("10.0.0.1", 2)])
    assert [x.addr for x in t] == [Addr("10.0.0.1", 2), Addr("10.0.0.1", 9), Addr("10.0.0.2", 1), Addr("::1", 3)]
    assert [x.addr for x in t].index(Addr("10.0.0.2", 1)) == 2 and len(t) == 4
    assert Addr("::1", 3) in t and Addr("::1", 4) not in t
    assert t.get(Addr("::1", 3)).addr == Addr("::1", 3) and t.get(Addr("::1", 4)) is None


def test_merge_returns_only_new_entries_once_each():
    t = PeerTable()
    a, b, c = p("10.0.0.1", 1), p("10.0.0.1", 2), p("10.0.0.1", 3)
    assert t.merge([a, b]) == [a, b]
    assert t.merge([b, c, c, a]) == [c]
    assert t.merge([a, b, c]) == []
    assert len(t) == 3


def test_a_known_process_keeps_its_first_entry():
    t = PeerTable()
    first = p("10.0.0.1", 1, pid=10, inc=111)
    t.merge([first])
    h = t.hash
    assert t.merge([p("10.0.0.1", 1, pid=20, inc=111)]) == []
    assert t.get(Addr("10.0.0.1", 1)) == first and t.hash == h


def test_two_entries_for_one_process_in_one_merge_gossip_what_is_stored():
    """A merge returns the diff a node gossips on: it must be the entry the table keeps. (Issue 12: the table once
    stored the last of two entries for one address and gossiped the first, so neighbours disagreed for good.)"""
    t = PeerTable()
    first, second = p("10.0.0.1", 1, pid=10, inc=111), p("10.0.0.1", 1, pid=20, inc=111)
    gossiped = t.merge([first, second, p("10.0.0.2", 1)])
    assert [x for x in gossiped if x.addr == first.addr] == [first]
    assert t.get(first.addr) == first and t.all_entries()[0] == first
    receiver = PeerTable()
    receiver.merge(gossiped)
    assert receiver.hash == t.hash


def test_a_newer_incarnation_at_an_address_is_current_and_the_older_one_former():
    t = PeerTable()
    old, new = p("10.0.0.1", 1, pid=10, inc=111), p("10.0.0.1", 1, pid=20, inc=222)
    other = p("10.0.0.2", 1)
    t.merge([old, other])
    h = t.hash
    assert t.merge([new]) == [new]
    assert t.get(old.addr) == new and list(t) == [new, other] and len(t) == 2
    assert t.former() == [old] and t.former(old.addr) == [old] and t.former(other.addr) == []
    assert t.entry(old.key) == old and t.entry(new.key) == new and t.entry(PeerKey(old.addr, 333)) is None
    assert t.is_current(new.key) and not t.is_current(old.key) and t.knows(old.key)
    assert t.is_outdated(old.key) and t.is_outdated(PeerKey(old.addr, 5)) and not t.is_outdated(new.key)
    assert t.hash != h and t.all_entries() == [old, new, other]
    # The older one arriving again, or after the newer one, changes nothing / is filed as former at once.
    assert t.merge([old, new]) == []
    late = PeerTable()
    assert late.merge([new, other]) == [new, other] and late.merge([old]) == [old]
    assert late.get(old.addr) == new and late.former() == [old] and late.hash == t.hash


def test_a_copy_is_independent():
    t = PeerTable()
    t.merge([p("10.0.0.1", 1, inc=1)])
    c = t.copy()
    c.merge([p("10.0.0.1", 1, inc=2)])
    assert t.get(Addr("10.0.0.1", 1)).incarnation == 1 and t.former() == []
    assert c.get(Addr("10.0.0.1", 1)).incarnation == 2 and c.hash != t.hash


def test_the_hash_changes_with_content():
    t = PeerTable()
    h0 = t.hash
    t.merge([p("10.0.0.1", 1)])
    h1 = t.hash
    t.merge([p("10.0.0.1", 2)])
    assert len({h0, h1, t.hash}) == 3
    assert table_hash([p("10.0.0.1", 1, inc=1)]) != table_hash([p("10.0.0.1", 1, inc=2)])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["10.0.0.1", "10.0.0.2", "::1", "192.168.0.1"]), st.integers(1, 20), st.integers(1, 5)
        ),
        max_size=30,
    ),
    st.randoms(use_true_random=False),
    st.integers(1, 5),
)
def test_the_table_is_independent_of_merge_order_and_batching(entries, rnd, batches):
    """Several incarnations per address included: whatever order the entries arrive in, every table that has heard
    the same processes has the same current entries, the same former ones and the same hash."""
    peers = [p(h, port, inc=inc) for h, port, inc in entries]
    # One entry per process (a process's record never changes): the first of each (address, incarnation).
    unique = list({x.key: x for x in reversed(peers)}.values())
    one, two = PeerTable(), PeerTable()
    one.merge(unique)
    shuffled = unique[:]
    rnd.shuffle(shuffled)
    cuts = sorted(rnd.randrange(len(shuffled) + 1) for _ in range(batches))
    for lo, hi in zip([0, *cuts], [*cuts, len(shuffled)], strict=True):
        two.merge(shuffled[lo:hi])
    assert one.hash == two.hash and list(one) == list(two) and one.former() == two.former()
    # The current entry of each address is its newest incarnation; every other one is former.
    newest = {}
    for x in unique:
        if x.addr not in newest or x.incarnation > newest[x.addr].incarnation:
            newest[x.addr] = x
    assert sorted(newest.values(), key=PeerInfo.sort_key) == list(two)
    assert {x.key for x in two.former()} == {x.key for x in unique} - {x.key for x in newest.values()}
    assert len(two.all_entries()) == len(unique)


def test_key_set_hash_is_order_independent_and_sees_the_incarnation():
    a = [PeerKey(Addr("10.0.0.1", i), 7) for i in range(10)]
    b = a[:]
    random.Random(3).shuffle(b)
    assert key_set_hash(a) == key_set_hash(b) != key_set_hash(a[:-1])
    assert key_set_hash([PeerKey(Addr("10.0.0.1", 1), 1)]) != key_set_hash([PeerKey(Addr("10.0.0.1", 1), 2)])


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 4.0e12 / 1000 - 2), st.floats(0.002, 1.0e6), st.integers(0, 2**32))
def test_a_later_start_gives_a_higher_incarnation_that_fits_the_wire(start, later, seed):
    # At least 2 ms later: 1 ms later can round into the same millisecond (1.0 + 0.001 s is 1000.999... ms), where
    # only the random bits differ (test_incarnations_of_one_millisecond_differ_by_their_random_bits).
    rng = random.Random(seed)
    first, second = new_incarnation(start, rng), new_incarnation(start + later, rng)
    assert 0 <= first < second < 2**64
    assert first >> INCARNATION_RANDOM_BITS == int(start * 1000)


def test_incarnations_of_one_millisecond_differ_by_their_random_bits():
    rng = random.Random(1)
    drawn = {new_incarnation(1_800_000_000.0, rng) for _ in range(100)}
    assert len(drawn) == 100
    assert PeerInfo(Addr("10.0.0.1", 5), 42, "h", 9).key == PeerKey(Addr("10.0.0.1", 5), 9)


def test_describe_names_the_devices_like_nccl():
    assert devices_text(()) == "CPU"
    assert devices_text((3,)) == "GPU 3"
    assert devices_text((0, 1)) == "GPUs 0,1"
    assert PeerInfo(Addr("10.0.0.1", 5), 42, "h", 1, (2,)).describe() == "Process 42 on node 10.0.0.1 managing GPU 2"
    assert str(Addr("10.0.0.1", 5)) == "10.0.0.1<5>"
