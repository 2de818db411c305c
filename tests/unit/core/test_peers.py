"""Peers, their keys and incarnations, and the sorted, grow-only peer table."""

import random

from hypothesis import given, settings, strategies as st

from rasd.core.peers import (
    _INSERT_MAX,
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


# --- the table against a naive reference (issue 30: sorted inserts, an incremental sum hash, copy on write) -------

_HOSTS = ["10.0.0.1", "10.0.0.2", "10.0.0.10", "::1", "192.168.0.1"]
_ENTRY = st.builds(
    lambda host, port, inc, pid: p(host, port, pid=pid, inc=inc),
    st.sampled_from(_HOSTS),
    st.integers(1, 20),
    st.integers(1, 6),
    st.integers(1, 2),  # a second entry for a known process (another pid) must be ignored: first seen wins
)
# Batches both at most and well over _INSERT_MAX new addresses (the re-sort path), duplicates within a batch included.
_WIDE = st.lists(_ENTRY, min_size=_INSERT_MAX + 1, max_size=3 * _INSERT_MAX, unique_by=lambda x: x.addr)
_BATCH = st.one_of(st.lists(_ENTRY, max_size=_INSERT_MAX), _WIDE).flatmap(
    lambda b: st.lists(st.sampled_from(b), max_size=8).map(lambda extra: b + extra) if b else st.just(b)
)


class _Reference:
    """A table built naively: every process as first seen, in the order heard."""

    def __init__(self, seen: dict[PeerKey, PeerInfo] | None = None) -> None:
        self.seen: dict[PeerKey, PeerInfo] = dict(seen or {})

    def merge(self, batch: list[PeerInfo]) -> list[PeerInfo]:
        new = []
        for x in batch:
            if x.key not in self.seen:
                self.seen[x.key] = x
                new.append(x)
        return new

    def copy(self) -> "_Reference":
        return _Reference(self.seen)

    def current(self) -> list[PeerInfo]:
        newest: dict[Addr, PeerInfo] = {}
        for x in self.seen.values():
            if x.addr not in newest or x.incarnation > newest[x.addr].incarnation:
                newest[x.addr] = x
        return sorted(newest.values(), key=PeerInfo.sort_key)


_UNKNOWN = [Addr(h, port) for h in [*_HOSTS, "10.0.0.3", "fe80::1"] for port in (0, 1, 20, 21, 65535)]


def _check_against(t: PeerTable, ref: _Reference) -> None:
    current = ref.current()
    listed = list(t)
    assert listed == current and len(t) == len(current)
    addresses = t.addresses()
    assert len(addresses) == len(current)
    assert [addresses[i] for i in range(len(addresses))] == [x.addr for x in listed]
    assert list(addresses) == [x.addr for x in listed] and addresses[1:3] == [x.addr for x in listed[1:3]]
    if listed:
        assert addresses[-1] == listed[-1].addr
    for i, x in enumerate(listed):
        assert t.index_of(x.addr) == i, x.addr
        assert t.get(x.addr) == x and x.addr in t and t.is_current(x.key)
    known = {x.addr for x in listed}
    for a in _UNKNOWN:
        if a not in known:
            assert t.index_of(a) is None and t.get(a) is None and a not in t
    everything = sorted(ref.seen.values(), key=lambda x: x.key.sort_key())
    assert t.all_entries() == everything
    assert set(t.former()) == set(everything) - set(current)
    for x in everything:
        assert t.entry(x.key) == x  # the first entry seen for that process, not a later one with another pid
    assert t.hash == table_hash(t.all_entries()) == table_hash(ref.seen.values())


@settings(max_examples=80, deadline=None)
@given(st.lists(_BATCH, max_size=6), st.randoms(use_true_random=False))
def test_merges_match_a_naive_reference(batches, rnd):
    """Random batches (new entries, newer and older incarnations, repeats, a second entry for a known process): after
    each merge the table is the reference's current entries in order, its hash the sum over every entry, its index
    and address view agree with iteration, and the merge returned each new entry once, in input order."""
    t, ref = PeerTable(), _Reference()
    for batch in batches:
        assert t.merge(batch) == ref.merge(batch)
        _check_against(t, ref)
    # The same processes merged in another order, in other batches, give the same table and hash.
    everything = list(ref.seen.values())
    rnd.shuffle(everything)
    other = PeerTable()
    cuts = sorted(rnd.randrange(len(everything) + 1) for _ in range(rnd.randrange(4)))
    for lo, hi in zip([0, *cuts], [*cuts, len(everything)], strict=True):
        other.merge(everything[lo:hi])
    _check_against(other, ref)
    assert other.hash == t.hash and list(other) == list(t)


def test_one_large_batch_with_replacements_inside_it_takes_the_re_sort_path():
    n = 2 * _INSERT_MAX
    batch = [p("10.0.0.2", port, inc=5) for port in range(n, 0, -1)]
    batch += [p("10.0.0.2", 3, inc=9), p("10.0.0.2", 4, inc=1), p("10.0.0.1", 7), p("10.0.0.2", 3, inc=9, pid=2)]
    t, ref = PeerTable(), _Reference()
    t.merge([p("10.0.0.2", 5, inc=1), p("::1", 1)])  # an entry that this batch replaces, and one after all of it
    ref.merge([p("10.0.0.2", 5, inc=1), p("::1", 1)])
    assert t.merge(batch) == ref.merge(batch) == batch[:-1]
    _check_against(t, ref)
    assert t.get(Addr("10.0.0.2", 3)).incarnation == 9 and t.get(Addr("10.0.0.2", 4)).incarnation == 5
    assert t.index_of(Addr("10.0.0.1", 7)) == 0 and t.index_of(Addr("::1", 1)) == len(t) - 1


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("copy"), st.integers(0, 4)),
        st.tuples(st.just("merge"), st.integers(0, 4), _BATCH),
    ),
    max_size=10,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_ENTRY, max_size=20), _OPS)
def test_copies_are_independent_whichever_side_changes(start, ops):
    """Copy on write: after ``b = a.copy()`` a merge into either leaves the other as it was (iteration, hash, len,
    get, former entries), copies of copies included."""
    first, first_ref = PeerTable(), _Reference()
    first.merge(start)
    first_ref.merge(start)
    tables, refs = [first], [first_ref]
    for op in ops:
        i = op[1] % len(tables)
        if op[0] == "copy":
            tables.append(tables[i].copy())
            refs.append(refs[i].copy())
        else:
            assert tables[i].merge(op[2]) == refs[i].merge(op[2])
        for t, ref in zip(tables, refs, strict=True):
            _check_against(t, ref)


def test_a_copy_shares_until_one_side_merges_and_then_the_other_is_unchanged():
    a = PeerTable()
    a.merge([p("10.0.0.1", port) for port in range(1, 6)])
    b = a.copy()
    before = (list(a), a.hash, len(a), a.former())
    assert b.merge([p("10.0.0.1", 3, inc=2), p("10.0.0.0", 9)]) == [p("10.0.0.1", 3, inc=2), p("10.0.0.0", 9)]
    assert (list(a), a.hash, len(a), a.former()) == before
    assert a.get(Addr("10.0.0.1", 3)).incarnation == 1 and a.get(Addr("10.0.0.0", 9)) is None
    assert a.index_of(Addr("10.0.0.1", 1)) == 0 and b.index_of(Addr("10.0.0.1", 1)) == 1
    after_b = (list(b), b.hash, len(b), b.former())
    a.merge([p("10.0.0.1", 1, inc=7), p("::1", 1)])  # now the other way round
    assert (list(b), b.hash, len(b), b.former()) == after_b
    assert b.get(Addr("::1", 1)) is None and b.get(Addr("10.0.0.1", 1)).incarnation == 1
    assert a.hash == table_hash(a.all_entries()) and b.hash == table_hash(b.all_entries())


def test_index_of_bisects_once_per_address_until_the_order_changes(monkeypatch):
    """Every relink looks up the position of every dead process, and every death relinks every node: at 16,384
    nodes a 1 % partition (160 deaths after a rack of 64) spent more CPU on those bisects than on its floods. The
    answers are kept until a merge changes the order; a copy shares them until either side merges."""
    t = PeerTable()
    t.merge([p("10.0.0.1", port) for port in range(1, 9)])
    bisects = []
    real = PeerTable._position
    monkeypatch.setattr(PeerTable, "_position", lambda self, order: bisects.append(order) or real(self, order))
    assert [t.index_of(Addr("10.0.0.1", port)) for port in (3, 5, 3, 5, 3)] == [2, 4, 2, 4, 2]
    assert len(bisects) == 2
    c = t.copy()
    assert c.index_of(Addr("10.0.0.1", 5)) == 4 and len(bisects) == 2  # shared with the copy
    assert t.merge([p("10.0.0.1", 4)]) == []  # nothing new: the order holds
    assert t.index_of(Addr("10.0.0.1", 5)) == 4 and len(bisects) == 2
    t.merge([p("10.0.0.0", 1)])  # one entry before them all: every position moves
    assert t.index_of(Addr("10.0.0.1", 5)) == 5 and t.index_of(Addr("10.0.0.0", 1)) == 0
    assert c.index_of(Addr("10.0.0.1", 5)) == 4 and c.index_of(Addr("10.0.0.0", 1)) is None  # the copy: unchanged
    t.merge([p("10.0.0.1", 5, inc=2)])  # a newer incarnation takes the same slot
    assert t.index_of(Addr("10.0.0.1", 5)) == 5 and t.index_of(Addr("10.0.0.9", 1)) is None
