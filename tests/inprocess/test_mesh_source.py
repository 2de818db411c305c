"""``inprocess.mesh_source.MeshFaultSource.handle``: which mesh verdicts become which Wrapper faults.

No processes: a real in-memory store (``inprocess.store.HashStore``) holds what the ranks of a call publish, the
events are the ones a RAS node emits (``rasd.core.events.Event``), and a small recording sink stands for the
running ``CallWrapper``. Communicator membership comes from this process's ``rasd.torch`` hooks registry, as in
a training process. tests/inprocess/test_mesh_restarts.py runs the same path end to end in real jobs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from inprocess import fault_source, mesh_source
from inprocess.store import HashStore
from rasd.core.events import Event, Kind
from rasd.core.peers import Addr, PeerInfo
from rasd.core.registry import LocalComm

REPOSITORY = Path(__file__).resolve().parents[2]
ME = 0  # the initial rank of the process whose source is under test


class RecordingSink:
    """Stands for the running ``CallWrapper``: records the verdicts it is given and accepts them all."""

    def __init__(self, iteration: int = 0) -> None:
        self.iteration = iteration
        self.verdicts: list[fault_source.ExternalVerdict] = []

    def report_fault(self, verdict: fault_source.ExternalVerdict) -> bool:
        self.verdicts.append(verdict)
        return True


def peer(port: int, incarnation: int, pid: int = 4711, host: str = "10.0.0.3") -> PeerInfo:
    return PeerInfo(addr=Addr(host, port), pid=pid, hostname="node3", incarnation=incarnation)


def publish(store: HashStore, who: PeerInfo, initial_rank: int) -> None:
    """What a rank's source writes at the start of a call: which mesh peer it is."""
    key = mesh_source.PEER_KEY.format(host=who.addr.host, port=who.addr.port, incarnation=who.incarnation)
    store.set(key, str(initial_rank))


def verdict(kind: Kind, about: PeerInfo | None, details: str = "peer silent for 2s") -> Event:
    return Event(kind=kind, at=1.0, addr=None if about is None else about.addr, peer=about, details=details)


def stuck(comm_hash: int, ranks: tuple[int, ...] = (2,)) -> Event:
    return Event(
        kind=Kind.COMM_STUCK,
        at=1.0,
        comm_hash=comm_hash,
        ranks=ranks,
        details="AllReduce operation 7 stuck; rank 2 behind (not launched); ranks 0,1,3 inside it",
    )


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink(iteration=3)


@pytest.fixture
def store() -> HashStore:
    return HashStore()


@pytest.fixture
def source(sink: RecordingSink, store: HashStore) -> Iterator[mesh_source.MeshFaultSource]:
    source = mesh_source.MeshFaultSource(sink, store, ME)
    yield source
    source.close()


@pytest.fixture
def registry() -> Iterator:
    """This process's communicator registry (``rasd.torch`` hooks, counting only: no RAS node is started)."""
    import rasd.torch

    already = rasd.torch.installed()
    hooks = rasd.torch.install(start_mesh=False)
    held: list[LocalComm] = []

    def hold(comm_hash: int) -> LocalComm:
        comm = hooks.registry.register(LocalComm(comm_hash=comm_hash, size=4, rank=ME))
        held.append(comm)
        return comm

    yield hold
    for comm in held:
        hooks.registry.unregister(comm)
    if already is None:
        rasd.torch.uninstall()


# ---- peer verdicts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Kind.PEER_DEAD, Kind.PEER_HUNG])
def test_a_peer_verdict_names_the_initial_rank_the_peer_published(source, sink, store, kind):
    dead = peer(41000, incarnation=17)
    publish(store, dead, initial_rank=2)
    publish(store, peer(41001, incarnation=18), initial_rank=1)
    assert source.handle(verdict(kind, dead)) is True
    [applied] = sink.verdicts
    assert applied.kind is fault_source.VerdictKind(kind.value)
    assert applied.ranks == frozenset({2}) and applied.iteration_ranks == frozenset()
    # Applied to the newest iteration the rank took part in (the Wrapper finds it), not to the sink's current one.
    assert applied.iteration == fault_source.LATEST_ITERATION
    assert applied.reason == f"{kind.value} of rank 2 (Process 4711 on node 10.0.0.3 managing CPU): peer silent for 2s"


def test_a_peer_nobody_published_is_not_ours(source, sink, store):
    publish(store, peer(41000, incarnation=17), initial_rank=2)
    # Another job's process, and a process on another host with the same port.
    assert source.handle(verdict(Kind.PEER_DEAD, peer(42000, incarnation=17))) is False
    assert source.handle(verdict(Kind.PEER_DEAD, peer(41000, incarnation=17, host="10.0.0.4"))) is False
    assert sink.verdicts == []


def test_death_is_keyed_by_incarnation(source, sink, store):
    """A process that reuses a dead predecessor's address is another peer: a verdict about the predecessor's
    incarnation does not touch the successor's rank, and the successor's own verdict names its own rank."""
    predecessor, successor = peer(41000, incarnation=17), peer(41000, incarnation=99)
    publish(store, successor, initial_rank=3)
    assert source.handle(verdict(Kind.PEER_DEAD, predecessor)) is False
    assert sink.verdicts == []
    assert source.handle(verdict(Kind.PEER_DEAD, successor)) is True
    assert [v.ranks for v in sink.verdicts] == [frozenset({3})]


def test_a_verdict_about_this_process_is_left_to_the_others(source, sink, store):
    me = peer(41000, incarnation=17)
    publish(store, me, initial_rank=ME)
    assert source.handle(verdict(Kind.PEER_HUNG, me)) is False  # e.g. after a pause this process survived
    assert source.handle(verdict(Kind.PEER_DEAD, me, "this process was declared dead by the job")) is False
    assert sink.verdicts == []


def test_a_clean_exit_never_restarts(source, sink, store):
    left = peer(41000, incarnation=17)
    publish(store, left, initial_rank=2)
    assert source.handle(verdict(Kind.PEER_LEFT, left, "process left the job")) is False
    assert sink.verdicts == []


@pytest.mark.parametrize(
    "kind", [Kind.PEER_NEW, Kind.PEER_UNRESPONSIVE, Kind.PEER_RECOVERED, Kind.COMM_RECOVERED, Kind.RESTART]
)
def test_events_that_are_no_verdicts_do_nothing(source, sink, store, kind):
    other = peer(41000, incarnation=17)
    publish(store, other, initial_rank=2)
    assert source.handle(verdict(kind, other)) is False
    assert sink.verdicts == []


def test_a_peer_verdict_without_a_peer_is_ignored(source, sink):
    assert source.handle(verdict(Kind.PEER_DEAD, None)) is False
    assert sink.verdicts == []


def test_a_closed_source_acts_on_nothing(sink, store):
    dead = peer(41000, incarnation=17)
    publish(store, dead, initial_rank=2)
    source = mesh_source.MeshFaultSource(sink, store, ME)
    source.close()
    assert source.handle(verdict(Kind.PEER_DEAD, dead)) is False
    assert sink.verdicts == []


# ---- communicator verdicts ----------------------------------------------------------------------------------------


def test_comm_stuck_is_acted_on_by_members_once_per_communicator(source, sink, registry):
    held, other = 0x1234_5678_9ABC_DEF0, 0x0FED_CBA9_8765_4321
    assert source.handle(stuck(held)) is False  # not a member (yet): the members act
    registry(held)
    assert source.handle(stuck(held, ranks=(2, 0, 1, 3))) is True
    [applied] = sink.verdicts
    assert applied.kind is fault_source.VerdictKind.COMM_STUCK
    # In the current iteration, naming nobody to terminate; the ranks involved in the iteration's numbering.
    assert applied.iteration == sink.iteration and applied.ranks == frozenset()
    assert applied.iteration_ranks == frozenset({0, 1, 2, 3})
    assert applied.reason.startswith(f"COMM_STUCK on communicator {held:016x}: AllReduce operation 7 stuck; rank 2 ")
    assert source.handle(stuck(held)) is False  # a refresh of the same verdict: its restart is under way
    assert len(sink.verdicts) == 1
    assert source.handle(stuck(other)) is False  # another process's communicator
    registry(other)
    assert source.handle(stuck(other)) is True
    assert len(sink.verdicts) == 2


def test_comm_stuck_about_a_destroyed_communicator_is_late(source, sink, registry):
    """The communicator of a finished iteration is destroyed by the restart; its verdict, arriving late, finds no
    member (the new iteration's communicator has another hash: hashes carry the iteration)."""
    import rasd.torch
    from rasd.torch.hooks import _hash

    old, new = _hash(0, "world", 4), _hash(1, "world", 4)
    assert old != new
    comm = registry(old)
    rasd.torch.installed().registry.unregister(comm)  # destroy_process_group at the restart
    registry(new)
    assert source.handle(stuck(old)) is False
    assert sink.verdicts == []


def test_comm_stuck_without_a_communicator_is_ignored(source, sink, registry):
    registry(0x42)
    assert source.handle(Event(kind=Kind.COMM_STUCK, at=1.0, details="?")) is False
    assert sink.verdicts == []


# ---- the table and the switch -------------------------------------------------------------------------------------


def documented_verdicts() -> dict[str, tuple[str, str]]:
    """docs/inprocess.md's verdict table: verdict -> (terminated ranks, who restarts)."""
    text = (REPOSITORY / "docs" / "inprocess.md").read_text()
    start = text.index("What each verdict does")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        match = re.match(r"\| `(\w+)` \|[^|]*\| ([^|]+) \| ([^|]+) \|$", line.strip())
        if match:
            rows[match[1]] = (match[2].strip(), match[3].strip())
    return rows


def test_the_verdict_table_is_the_documented_one():
    documented = documented_verdicts()
    assert set(documented) == set(mesh_source.VERDICT_RULES) == {"PEER_DEAD", "PEER_HUNG", "COMM_STUCK", "PEER_LEFT"}
    for name, rule in mesh_source.VERDICT_RULES.items():
        terminated, restarts = documented[name]
        assert rule.terminated == terminated, name
        # The code's short form is the start of the documented text (which goes on to explain).
        assert restarts.startswith(rule.restarts.split(";")[0]), (name, rule.restarts, restarts)
        assert (rule.kind is None) == (restarts == "nobody"), name
        if rule.kind is not None:
            assert rule.kind.value == name
            assert rule.kind.terminates == (terminated != "none"), name
    assert set(mesh_source.VERDICT_RULES) <= {kind.value for kind in Kind}


def test_the_wiring_is_off_with_torchras_enable_0(monkeypatch, sink, store):
    monkeypatch.setenv("TORCHRAS_ENABLE", "0")
    assert mesh_source.mesh_enabled() is False
    source = mesh_source.MeshFaultSource(sink, store, ME)
    assert source.start(store) is False
    assert source.runtime is None
    monkeypatch.setenv("TORCHRAS_ENABLE", "1")
    assert mesh_source.mesh_enabled() is True
    monkeypatch.delenv("TORCHRAS_ENABLE")
    assert mesh_source.mesh_enabled() is True
