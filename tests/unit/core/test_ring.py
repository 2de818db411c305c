"""Link selection: ring neighbours, chained fallbacks over unhealthy peers, host skipping, express links."""

import math

from hypothesis import given, settings, strategies as st

from rasd.core import ring


def links(n, me, dead=(), bad=(), per_host=1, express=True):
    order = list(range(n))
    return ring.links(order, me, set(dead).__contains__, set(bad).__contains__, lambda i: f"h{i // per_host}", express)


def test_one_peer_has_no_links():
    assert links(1, 0) == set()


def test_two_peers_link_to_each_other_once():
    assert links(2, 0) == {1} and links(2, 1) == {0}


def test_neighbours_and_wrap_around():
    assert links(5, 2) == {1, 3}
    assert links(5, 0) == {4, 1}
    assert links(5, 4) == {3, 0}


def test_dead_peers_are_skipped_as_if_absent():
    assert links(6, 2, dead={3}) == {1, 4}
    assert links(6, 0, dead={5, 4}) == {3, 1}
    assert links(3, 0, dead={1, 2}) == set()
    assert links(3, 0, dead={1}) == {2}


def test_an_unhealthy_primary_gets_a_fallback_beyond_it():
    assert links(8, 2, bad={3}) == {1, 3, 4}
    assert links(8, 2, bad={1}) == {0, 1, 3}


def test_fallbacks_chain_while_they_are_unhealthy():
    assert links(10, 2, bad={3, 4, 5}) == {1, 3, 4, 5, 6}


def test_fallbacks_skip_dead_peers():
    assert links(10, 2, dead={4}, bad={3}) == {1, 3, 5}


def test_a_fallback_of_a_fallback_on_another_host_skips_the_rest_of_that_host():
    # 4 hosts of 4 processes; me is 1 (host 0). Host 1 (4..7) is all silent, and so is my successor 2, 3.
    got = links(16, 1, bad={2, 3, 4, 5, 6, 7}, per_host=4)
    # 2 and 3 on my own host are walked one by one; 4 and 5 are the first two fallbacks on host 1, the rest of
    # host 1 is skipped.
    assert got == {0, 2, 3, 4, 5, 8}


def known(n, me, bad, healthy, per_host):
    order = list(range(n))
    host = lambda i: f"h{i // per_host}"  # noqa: E731 - a one-line key
    return ring.links(order, me, set().__contains__, set(bad).__contains__, host, False, set(healthy).__contains__)


def test_a_host_with_two_unhealthy_processes_keeps_only_those_known_healthy():
    # With a notion of "known healthy" (links.py: heard, not delayed), a host cut off whole is crossed at once: once
    # two of its processes were unhealthy, the rest of it that nobody vouches for (6, 7) is skipped too.
    assert known(16, 1, bad={2, 3, 4, 5}, healthy={0}, per_host=4) == {0, 2, 3, 4, 5, 8}
    # Without it (every peer not unhealthy counts as healthy) the walk stops at 6.
    assert links(16, 1, bad={2, 3, 4, 5}, per_host=4) == {0, 2, 3, 4, 5, 6}


def test_a_live_process_between_silent_ones_is_not_skipped_after_one_silent_process_of_its_host():
    # 2 hosts of 4; 0, 1, 3, 4, 7 silent; 2, 5, 6 live. 5 walks back over 4 (own host) and 3 (host 0, the second
    # fallback): one silent process of host 0 is not enough to skip 2, which nobody else links to.
    got = known(8, 5, bad={0, 1, 3, 4, 7}, healthy={6}, per_host=4)
    assert 2 in got


def test_host_skipping_keeps_a_healthy_process_of_that_host():
    got = links(16, 1, bad={2, 3, 4, 5, 7}, per_host=4)
    assert got == {0, 2, 3, 4, 5, 6}  # 5 is the second silent one of host 1, 6 is healthy: the walk stops there


def test_the_walk_is_bounded_by_max_fallbacks():
    n = 100
    bad = set(range(n)) - {0}
    got = links(n, 0, bad=bad, express=False)
    forward = {i for i in got if i <= n // 2}
    backward = got - forward
    # The primary plus at most MAX_FALLBACKS beyond it, in each direction.
    assert len(forward) == len(backward) == ring.MAX_FALLBACKS + 1
    assert forward == set(range(1, ring.MAX_FALLBACKS + 2))


def test_a_whole_ring_unhealthy_never_links_to_self():
    assert 0 not in links(5, 0, bad={1, 2, 3, 4})
    assert links(5, 0, bad={1, 2, 3, 4}) == {1, 2, 3, 4}


def test_no_express_links_below_the_threshold():
    n = ring.EXPRESS_MIN_PEERS - 1
    assert links(n, 10) == {9, 11}


def test_express_links_at_the_threshold():
    n = ring.EXPRESS_MIN_PEERS
    stride = math.isqrt(n)
    assert links(n, 10) == {9, 11, 10 + stride, 10 - stride}
    assert links(n, 10, express=False) == {9, 11}


def test_express_links_skip_dead_peers_and_wrap():
    n = 200
    dead = set(range(100, 200, 2))  # 50 dead, 150 live
    stride = math.isqrt(n)  # the table's size: deaths do not move the skip links
    me = 0
    got = links(n, me, dead=dead)
    assert stride in got and n - stride - 1 in got  # 186 is dead: the first live one beyond it, wrapping
    assert not got & dead
    assert links(n, 151, dead=dead) == {149, 153, 151 + stride, 151 - stride}
    # Below the threshold by deaths, the express links go away.
    assert links(n, 0, dead=set(range(60, 200))) == {1, 59}


def test_a_death_moves_no_skip_link_but_its_own():
    n = 1024
    before = links(n, 500)
    assert links(n, 500, dead=set(range(600, 664))) == before  # a rack of 64 elsewhere
    assert links(n, 500, dead={532}) == (before - {532}) | {533}


def test_an_unhealthy_express_peer_is_bridged_one_step_further():
    n = 100
    stride = math.isqrt(n)
    got = links(n, 0, bad={stride})
    assert {stride, stride + 1} <= got


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 150), per_host=st.integers(1, 8), express=st.booleans())
def test_links_never_include_self_or_excluded_peers(data, n, per_host, express):
    me = data.draw(st.integers(0, n - 1))
    others = [i for i in range(n) if i != me]
    dead = set(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else set()
    bad = set(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else set()
    got = links(n, me, dead=dead, bad=bad, per_host=per_host, express=express)
    assert me not in got
    assert not got & dead
    live = set(others) - dead
    # Everyone has at least one link while anyone else is alive; the ring neighbours are always among them.
    if live:
        assert got
        after = next(i % n for i in range(me + 1, me + n) if i % n in live)
        before = next(i % n for i in range(me - 1, me - n, -1) if i % n in live)
        assert after in got and before in got
    # Bounded: two walks of at most 1 + MAX_FALLBACKS, plus 4 express links, plus the far links of a cut-off node.
    assert len(got) <= 2 * (ring.MAX_FALLBACKS + 1) + 4 + ring.FAR_LINKS
    # Healthy peers end a walk: with nobody unhealthy the links are the neighbours (and express ones).
    if not bad:
        assert len(got) <= 4


def test_a_node_whose_every_link_is_unhealthy_links_far_across_the_table():
    # Sweep seed 3152: in the middle of a cut-off region by address, its walks and skip links all end inside it.
    n = 1024
    region = set(range(256, 440)) - {357}
    got = links(n, 357, bad=region, per_host=8)
    far = {(357 + k * n // (ring.FAR_LINKS + 1)) % n for k in range(1, ring.FAR_LINKS + 1)}
    assert far <= got and not far & region
    # One healthy link (the region ends next door) and there are none; nor without express links.
    assert not far & links(n, 357, bad=region - set(range(358, 440)), per_host=8)
    assert not far & links(n, 357, bad=region, per_host=8, express=False)
    # Fallbacks still connecting (neither healthy nor unhealthy) do not hold the far links back; at start-up, with
    # no link known healthy and none unhealthy, there are none.
    order = list(range(n))
    walking = {355, 359}
    got = ring.links(
        order,
        357,
        set().__contains__,
        (region - walking).__contains__,
        lambda i: f"h{i // 8}",
        True,
        lambda i: i not in region,
    )
    assert far <= got
    assert not far & ring.links(
        order, 357, set().__contains__, set().__contains__, lambda i: f"h{i // 8}", True, lambda i: False
    )
    # Dead peers are not counted in the spread, and never chosen.
    dead = set(range(0, 1024, 3)) - region - {357}
    assert not links(n, 357, dead=dead, bad=region, per_host=8) & dead


def test_it_works_on_any_sortable_item():
    order = ["a", "b", "c", "d"]
    got = ring.links(order, 0, lambda x: x == "b", lambda x: x == "c", lambda x: "h", True)
    assert got == {"c", "d"}


def _skip_targets(n, me, dead):
    """The skip links by their definition: the first live peer at or beyond ``isqrt(n)`` positions each way."""
    stride = max(2, math.isqrt(n))
    out = set()
    for direction in (1, -1):
        at = (me + direction * stride) % n
        while at in dead:
            at = (at + direction) % n
        out.add(at)
    return out - {me}


def _ring_neighbours(n, me, dead):
    live = [i for i in range(n) if i not in dead and i != me]
    after = next(i % n for i in range(me + 1, me + n) if i % n not in dead)
    before = next(i % n for i in range(me - 1, me - n, -1) if i % n not in dead)
    return {after, before} if live else set()


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(ring.EXPRESS_MIN_PEERS, 300), per_host=st.integers(1, 8))
def test_deaths_away_from_a_nodes_skip_targets_and_neighbours_leave_its_links_alone(data, n, per_host):
    """Issue 30: the stride counts the whole table, so a death moves a node's skip links only if it is one of them
    (or a ring neighbour: then its walks change). With nobody unhealthy, a node's links are its ring neighbours and
    its skip targets; further deaths elsewhere change none of them while enough peers live for skip links."""
    me = data.draw(st.integers(0, n - 1), label="me")
    spare = n - ring.EXPRESS_MIN_PEERS  # deaths that keep the live count at the threshold
    others = [i for i in range(n) if i != me]
    dead = set(data.draw(st.lists(st.sampled_from(others), unique=True, max_size=spare // 2), label="dead"))
    targets = _skip_targets(n, me, dead)
    neighbours = _ring_neighbours(n, me, dead)
    before = links(n, me, dead=dead, per_host=per_host)
    assert before == targets | neighbours
    free = [i for i in others if i not in dead | targets | neighbours]
    more = set(data.draw(st.lists(st.sampled_from(free), unique=True, max_size=spare - len(dead)), label="more"))
    after = links(n, me, dead=dead | more, per_host=per_host)
    assert after == before
    assert _skip_targets(n, me, dead | more) == targets
    # The same with the dead positions given (the O(log N) path the node takes).
    order = list(range(n))
    excluded = dead | more
    given_at = ring.links(
        order,
        me,
        excluded.__contains__,
        set().__contains__,
        lambda i: f"h{i // per_host}",
        True,
        excluded_at=sorted(excluded),
    )
    assert given_at == before
