"""The pure pieces of the sharded state: where copies go, which commit a restore takes, the byte layout, and
``torch.distributed.checkpoint`` through the in-memory storage in one process."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given, settings, strategies as st

from inprocess.elastic import memory_storage, placement
from inprocess.elastic.placement import Held


def test_guards_are_the_next_ranks_of_the_ring_other_hosts_first() -> None:
    assert placement.guards(0, ["a"] * 4, 1) == [1]
    assert placement.guards(3, ["a"] * 4, 1) == [0]
    assert placement.guards(1, ["a"] * 4, 2) == [2, 3]
    hosts = ["a", "a", "b", "b"]
    assert placement.guards(0, hosts, 1) == [2]  # rank 1 shares rank 0's host
    assert placement.guards(2, hosts, 1) == [0]
    assert placement.guards(0, ["a"], 1) == []  # alone: nobody to guard it
    for rank in range(4):
        wards = placement.guarded_by(rank, hosts, 1)
        assert all(rank in placement.guards(ward, hosts, 1) for ward in wards)
    # with k = 1 every blob has one copy, and every rank keeps one copy
    assert sorted(len(placement.guarded_by(rank, ["a"] * 5, 1)) for rank in range(5)) == [1] * 5


def _ring(version: int, world: int, alive: list[int], committed: bool = True) -> list[list[Held]]:
    """What the ranks of ``alive`` hold of a commit written by ``world`` ranks with k = 1 on one host."""
    hosts = ["a"] * world
    return [
        [Held(version, 7, world, frozenset({rank, *placement.guarded_by(rank, hosts, 1)}), committed)] for rank in alive
    ]


def test_one_loss_is_restored_from_memory_two_neighbours_from_disk() -> None:
    choice = placement.choose(_ring(3, 4, [0, 1, 3]), [None] * 3)
    assert choice.source == "memory" and choice.version == 3 and choice.commits == 7 and choice.world == 4
    assert choice.holders[2] == (2,)  # rank 2's blob: the copy on old rank 3, now rank 2 of the new world
    non_neighbours = placement.choose(_ring(3, 4, [0, 2]), [None, None])  # 1 and 3 died: copies on 2 and 0
    assert non_neighbours.source == "memory"
    neighbours = placement.choose(_ring(3, 4, [0, 3]), [5, 6])  # 1 and 2 died: rank 1's only copy was on 2
    assert neighbours.source == "disk" and neighbours.disk_commits == 5 and neighbours.missing == (1,)
    assert placement.choose(_ring(3, 4, [0, 3]), [5, None]).source == "none"  # a rank sees no checkpoint
    assert placement.choose([[], []], [None, None]) == placement.Choice("none")  # a fresh job


def test_a_cut_commit_never_goes_back_behind_a_completed_one() -> None:
    # every rank holds version 4 whole (pending) and some completed it: version 4
    offers = [_ring(3, 4, [0])[0] + _ring(4, 4, [0], committed=False)[0], *_ring(4, 4, [1, 2, 3])]
    assert placement.choose(offers, [None] * 4).version == 4
    # version 4 reached only ranks 0 and 1 (the exchange was cut), nobody completed it: version 3
    cut = [_ring(3, 4, [r])[0] + (_ring(4, 4, [r], committed=False)[0] if r < 2 else []) for r in range(4)]
    assert placement.choose(cut, [None] * 4).version == 3
    # a newcomer holds nothing and changes nothing
    assert placement.choose([*_ring(4, 4, [0, 1, 2]), []], [None] * 4).version == 4


def test_serving_rank_prefers_the_requester_and_spreads_the_rest() -> None:
    assert placement.serving_rank(2, 1, (1, 3)) == 1
    served = {placement.serving_rank(0, requester, (0, 1)) for requester in (2, 3)}
    assert served == {0, 1}


def test_layout_aligns_every_item() -> None:
    offsets, total = placement.layout([3, 16, 1, 0, 5])
    assert offsets == [0, 16, 32, 48, 48] and total == 64


def test_dcp_through_the_blob_storage_in_one_process() -> None:
    saved = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "n": torch.tensor(5), "meta": {"lr": 0.1}}
    writer = memory_storage.BlobWriter(0)
    metadata = dcp.save(saved, storage_writer=writer, no_dist=True)
    items = {
        (location.owner, location.offset): writer.blob.tensor[location.offset : location.offset + location.size]
        for location in metadata.storage_data.values()
    }
    loaded = {"w": torch.zeros(3, 4), "n": torch.tensor(0), "meta": {"lr": 0.0}}
    dcp.load(loaded, storage_reader=memory_storage.BlobReader(metadata, items), no_dist=True)
    assert torch.equal(loaded["w"], saved["w"]) and int(loaded["n"]) == 5 and loaded["meta"] == {"lr": 0.1}
    saved["w"].add_(1)  # the blob is a copy, not the live tensor: a second load still gives the committed values
    again = {"w": torch.zeros(3, 4), "n": torch.tensor(0), "meta": {"lr": 0.0}}
    dcp.load(again, storage_reader=memory_storage.BlobReader(metadata, items), no_dist=True)
    assert torch.equal(again["w"], torch.arange(12, dtype=torch.float32).view(3, 4))


@settings(max_examples=300, deadline=None)
@given(
    world=st.integers(1, 9),
    k=st.integers(0, 3),
    host_count=st.integers(1, 3),
    data=st.data(),
)
def test_top_up_gives_every_blob_k_plus_1_holders_again(
    world: int, k: int, host_count: int, data: st.DataObject
) -> None:
    hosts = [f"h{rank % host_count}" for rank in range(world)]
    owners = data.draw(st.integers(1, 9))
    holders = {
        owner: tuple(sorted(data.draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=world))))
        for owner in range(owners)
    }
    added = placement.top_up(holders, hosts, k)
    for owner, have in holders.items():
        new = added.get(owner, [])
        assert not set(new) & set(have) and len(set(new)) == len(new)
        assert len(have) + len(new) == max(len(have), min(k + 1, world))
        uncovered = [rank for rank in range(world) if hosts[rank] not in {hosts[h] for h in have}]
        if new and uncovered:  # a host that holds no copy yet is taken first
            assert hosts[new[0]] not in {hosts[h] for h in have}


def test_top_up_after_a_kill_on_one_host() -> None:
    """World 4 → 3 (old rank 3 killed; k = 1): its blob is held by its guard only, and so is the blob it guarded."""
    holders = {0: (0, 1), 1: (1, 2), 2: (2,), 3: (0,)}  # old rank 2's guard was 3; old 3's copy is on 0
    assert placement.top_up(holders, ["a", "a", "a"], 1) == {2: [0], 3: [1]}
    assert placement.top_up(holders, ["a", "a", "a"], 0) == {}


@settings(max_examples=300, deadline=None)
@given(
    world=st.integers(2, 9),
    k=st.integers(1, 3),
    host_count=st.integers(1, 3),
    data=st.data(),
)
def test_any_k_losses_at_any_positions_restore_from_memory_and_again_after_the_top_up(
    world: int, k: int, host_count: int, data: st.DataObject
) -> None:
    """Whichever ranks die (rank 0, the last rank whose guard wraps round to rank 0, neighbours, a whole host), up
    to k of them: every blob of the commit still has a holder and the restore is from memory. The restore's top-up
    then gives the new world's ranks the copies the dead held, so up to k more losses during the recovery restore
    the same commit from memory again."""
    hosts = [f"h{rank % host_count}" for rank in range(world)]
    dead = data.draw(st.sets(st.integers(0, world - 1), max_size=min(k, world - 1)), label="dead")
    alive = [rank for rank in range(world) if rank not in dead]
    offers = [[Held(3, 7, world, frozenset({rank, *placement.guarded_by(rank, hosts, k)}), True)] for rank in alive]
    choice = placement.choose(offers, [None] * len(alive))
    assert choice.source == "memory" and choice.version == 3 and choice.world == world, (dead, choice)
    new_hosts = [hosts[rank] for rank in alive]
    added = placement.top_up(choice.holders, new_hosts, k)
    held = {
        new_rank: {
            owner for owner, ranks in choice.holders.items() if new_rank in ranks or new_rank in added.get(owner, [])
        }
        for new_rank in range(len(alive))
    }
    second = data.draw(st.sets(st.integers(0, len(alive) - 1), max_size=min(k, len(alive) - 1)), label="second")
    survivors = [new_rank for new_rank in range(len(alive)) if new_rank not in second]
    again = placement.choose(
        [[Held(3, 7, world, frozenset(held[r]), True)] for r in survivors], [None] * len(survivors)
    )
    assert again.source == "memory" and again.version == 3, (dead, second, held, again)
