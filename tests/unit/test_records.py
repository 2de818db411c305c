"""rasd.torch.records: counting what a process group performed beneath the Python hooks, from its sequence number
and the Flight Recorder, with a fake group and a fake recorder (the real ones: tests/acceptance/test_user_jobs.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rasd.core.comms import OP_TYPES
from rasd.core.registry import LocalComm
from rasd.torch.records import FR_READ_EVERY, RecordCounter, op_of

ALLREDUCE, BROADCAST, ALLGATHER, OTHER = (OP_TYPES.index(n) for n in ("AllReduce", "Broadcast", "AllGather", "Other"))


class FakeGroup:
    group_name = "0"

    def __init__(self) -> None:
        self.seq = 0

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


class FakeRecorder:
    """A Flight Recorder ring of ``size`` entries."""

    def __init__(self, size: int = 100) -> None:
        self.size = size
        self.entries: list[dict[str, Any]] = []
        self.dumps = 0

    def record(self, seq_id: int, name: str, retired: bool = True, group: str = "0", created: int = 10) -> None:
        entry = {"collective_seq_id": seq_id, "profiling_name": name, "retired": retired, "state": "scheduled"}
        entry.update(process_group=[group, "default_pg"], time_created_ns=created, is_p2p=False)
        self.entries = (self.entries + [entry])[-self.size :]

    def retire(self, seq_id: int) -> None:
        for e in self.entries:
            if e["collective_seq_id"] == seq_id:
                e["retired"] = True

    def dump(self, recorder: str | None = None) -> str:
        """The native recorder's JSON (a torch 2.13 dump: there is no other recorder to ask for)."""
        if recorder is not None:
            raise TypeError("_dump_fr_trace_json() got an unexpected keyword argument 'backend'")
        self.dumps += 1
        return json.dumps({"entries": self.entries})


def setup(size: int = 100) -> tuple[RecordCounter, FakeGroup, FakeRecorder, LocalComm]:
    recorder = FakeRecorder(size)
    counter = RecordCounter(flight_recorder=True, dump=recorder.dump)
    group, comm = FakeGroup(), LocalComm(comm_hash=1, size=4, rank=0)
    counter.add(group, comm, created_ns=5)
    return counter, group, recorder, comm


def beneath(group: FakeGroup, recorder: FakeRecorder, name: str, retired: bool = True) -> None:
    """A collective torch issued from C++ (DDP's reducer): the sequence number moves, the hooks see nothing."""
    group.seq += 1
    recorder.record(group.seq, name, retired)


def hooked(group: FakeGroup, recorder: FakeRecorder, comm: LocalComm, op: int, name: str) -> None:
    """A collective through torch.distributed's Python function, as the hooks count it."""
    before = group.seq
    comm.launch(op)
    group.seq += 1
    recorder.record(group.seq, name)
    comm.complete(op)
    comm.hooked_seqs.append(before + 1)
    comm.hooked_seq += 1


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("gloo:all_reduce", "AllReduce"),
        ("nccl:all_reduce", "AllReduce"),
        ("gloo:broadcast", "Broadcast"),
        ("nccl:_allgather_base", "AllGather"),
        ("nccl:all_gather_into_tensor_coalesced", "AllGather"),
        ("nccl:reduce_scatter_tensor_coalesced", "ReduceScatter"),
        ("nccl:_reduce_scatter_base", "ReduceScatter"),
        ("gloo:all_to_all", "AllToAll"),
        ("nccl:all_to_all", "AllToAll"),
        ("gloo:reduce", "Reduce"),
        ("gloo:gather", "Gather"),
        ("gloo:scatter", "Scatter"),
        ("gloo:barrier", "Barrier"),
        ("nccl:coalesced", "Other"),
        ("mystery:thing", "Other"),
        ("", "Other"),
    ],
)
def test_flight_recorder_names_map_to_op_types(name: str, op: str) -> None:
    assert OP_TYPES[op_of(name)] == op


def test_collectives_beneath_the_hooks_are_counted_by_type_and_completion() -> None:
    counter, group, recorder, comm = setup()
    for _ in range(3):
        beneath(group, recorder, "gloo:broadcast")  # DDP's start-up
    for _ in range(5):
        beneath(group, recorder, "gloo:all_reduce")  # its buckets
    counter.refresh(now=0.0)
    launched, completed = comm.counts()
    assert launched[BROADCAST] == completed[BROADCAST] == 3
    assert launched[ALLREDUCE] == completed[ALLREDUCE] == 5
    assert sum(launched) == group.seq


def test_nothing_is_counted_twice_when_the_hooks_saw_the_call() -> None:
    counter, group, recorder, comm = setup()
    hooked(group, recorder, comm, ALLREDUCE, "gloo:all_reduce")
    beneath(group, recorder, "gloo:all_reduce")
    hooked(group, recorder, comm, BROADCAST, "gloo:broadcast")
    counter.refresh(now=0.0)
    launched, completed = comm.counts()
    assert launched[ALLREDUCE] == 2 and launched[BROADCAST] == 1
    assert sum(launched) == group.seq == 3
    assert launched == completed


def test_a_hooked_call_in_flight_is_never_taken_for_one_beneath() -> None:
    counter, group, recorder, comm = setup()
    comm.hooked_from = group.seq  # the Python all_reduce has begun and is blocked inside torch
    comm.launch(ALLREDUCE)
    group.seq += 1
    recorder.record(group.seq, "gloo:all_reduce", retired=False)
    counter.refresh(now=0.0)
    counter.refresh(now=1.0)  # quiet: read again
    launched, completed = comm.counts()
    assert launched[ALLREDUCE] == 1 and completed[ALLREDUCE] == 0
    assert sum(launched) == 1


def test_an_unfinished_collective_counts_as_launched_until_it_is_seen_finished() -> None:
    counter, group, recorder, comm = setup()
    beneath(group, recorder, "gloo:all_reduce")
    beneath(group, recorder, "gloo:all_reduce", retired=False)  # others wait in it for a stuck rank
    counter.refresh(now=0.0)
    launched, completed = comm.counts()
    assert (launched[ALLREDUCE], completed[ALLREDUCE]) == (2, 1)
    recorder.retire(2)
    counter.refresh(now=1.0)  # quiet since the read: read once more
    launched, completed = comm.counts()
    assert (launched[ALLREDUCE], completed[ALLREDUCE]) == (2, 2)


def test_unread_collectives_count_under_the_last_type_read_until_the_next_read() -> None:
    counter, group, recorder, comm = setup()
    beneath(group, recorder, "gloo:all_reduce")
    counter.refresh(now=0.0)
    assert recorder.dumps == 1
    beneath(group, recorder, "gloo:all_gather")
    beneath(group, recorder, "gloo:all_gather")
    counter.refresh(now=1.0)  # still moving, before the next periodic read: an estimate, the total exact
    assert recorder.dumps == 1
    launched, completed = comm.counts()
    assert launched[ALLREDUCE] == 3 and completed[ALLREDUCE] == 1
    counter.refresh(now=2.0)  # quiet: the recorder tells
    assert recorder.dumps == 2
    launched, completed = comm.counts()
    assert launched[ALLREDUCE] == completed[ALLREDUCE] == 1
    assert launched[ALLGATHER] == completed[ALLGATHER] == 2


def test_the_recorder_is_read_rarely_while_collectives_keep_moving() -> None:
    counter, group, recorder, comm = setup()
    now = 0.0
    for _ in range(100):
        beneath(group, recorder, "gloo:all_reduce")
        counter.refresh(now)
        now += 0.5
    assert recorder.dumps <= 100 * 0.5 / FR_READ_EVERY + 1
    assert sum(comm.counts()[0]) == group.seq


def test_entries_lost_from_the_ring_count_with_the_next_one_read() -> None:
    counter, group, recorder, comm = setup(size=4)
    beneath(group, recorder, "gloo:broadcast")
    counter.refresh(now=0.0)
    for _ in range(10):  # more than the ring holds before the next read
        beneath(group, recorder, "gloo:all_reduce")
    counter.refresh(now=FR_READ_EVERY)
    launched, completed = comm.counts()
    assert launched[BROADCAST] == 1 and launched[ALLREDUCE] == 10
    assert launched == completed


def test_older_groups_of_the_same_name_are_not_counted() -> None:
    counter, group, recorder, comm = setup()
    recorder.record(1, "gloo:broadcast", created=1)  # the destroyed group "0" of the previous restart iteration
    beneath(group, recorder, "gloo:all_reduce")
    counter.refresh(now=0.0)
    launched, _ = comm.counts()
    assert launched[ALLREDUCE] == 1 and launched[BROADCAST] == 0


def test_without_a_flight_recorder_the_total_is_exact_and_the_type_is_other() -> None:
    group, comm = FakeGroup(), LocalComm(comm_hash=1, size=4, rank=0)
    counter = RecordCounter(flight_recorder=False)
    counter.add(group, comm, created_ns=0)
    group.seq += 7
    counter.refresh(now=0.0)
    launched, completed = comm.counts()
    assert launched[OTHER] == completed[OTHER] == 7  # nothing will ever say they are unfinished
    assert "sequence numbers only" in counter.describe()


def test_a_torch_without_sequence_numbers_falls_back_to_the_hooks() -> None:
    counter = RecordCounter(flight_recorder=True, dump=lambda: "{}")
    comm = LocalComm(comm_hash=1, size=4, rank=0)
    counter.add(object(), comm, created_ns=0)
    assert not counter.groups
    assert "Python hooks only" in counter.describe()
    counter.refresh(now=0.0)
    assert comm.counts() == (tuple(comm.launched), tuple(comm.completed))


def test_a_recorder_that_cannot_be_read_leaves_the_totals_and_says_so_once() -> None:
    def broken() -> str:
        raise RuntimeError("no recorder")

    counter = RecordCounter(flight_recorder=True, dump=broken)
    group, comm = FakeGroup(), LocalComm(comm_hash=1, size=4, rank=0)
    counter.add(group, comm, created_ns=0)
    group.seq = 3
    counter.refresh(now=0.0)
    assert not counter.flight_recorder
    assert sum(comm.counts()[0]) == 3


def test_a_group_made_after_a_recent_read_gets_its_own_first_read() -> None:
    """A restart's new groups: their collectives beneath the hooks are typed at once, not 30 s later as Other."""
    counter, group, recorder, comm = setup()
    beneath(group, recorder, "gloo:broadcast")
    counter.refresh(now=0.0)
    assert recorder.dumps == 1
    new_group, new_comm = FakeGroup(), LocalComm(comm_hash=2, size=4, rank=0)
    new_group.group_name = "1"
    counter.add(new_group, new_comm, created_ns=20)
    new_group.seq += 1
    recorder.record(1, "gloo:all_reduce", group="1", created=30)
    counter.refresh(now=1.0)
    assert recorder.dumps == 2
    launched, completed = new_comm.counts()
    assert launched[ALLREDUCE] == completed[ALLREDUCE] == 1 and launched[OTHER] == 0


def test_a_move_is_dated_by_the_poll_that_saw_it_not_by_the_next_snapshot() -> None:
    """The ranks' idle time dates a stall for the stuck detector: the snapshot 5 s later must not move it."""
    counter, group, recorder, comm = setup()
    beneath(group, recorder, "gloo:all_reduce")
    counter.poll(now=10.0)
    assert comm.last_change == 10.0
    counter.poll(now=10.5)  # nothing moved
    counter.refresh(now=15.0)  # the sweep's snapshot
    assert comm.last_change == 10.0
    beneath(group, recorder, "gloo:all_reduce")
    counter.refresh(now=16.0)  # a move no poll saw yet: dated by the snapshot
    assert comm.last_change == 16.0


# --- which Flight Recorder: torch 2.15's hook-based recorders beside the native one (fakes of each API shape) ----


class NamedGroup(FakeGroup):
    def __init__(self, name: str, backend: str) -> None:
        super().__init__()
        self.group_name = name
        self.backend = backend


class Recorders:
    """torch 2.15's shape: the native recorder (gloo, legacy NCCL) and one hook-based recorder per backend that does
    not record natively (``nccl2``), read with ``_dump_fr_trace_json(backend=...)``. ``hooked`` False: torch 2.13's
    and 2.14's, whose dump takes no ``backend``."""

    def __init__(self, hooked: bool = True) -> None:
        self.native, self.nccl2 = FakeRecorder(), FakeRecorder()
        self.hooked = hooked

    def dump(self, recorder: str | None = None) -> str:
        if recorder is None:
            return self.native.dump()
        if not self.hooked:
            raise TypeError("_dump_fr_trace_json() got an unexpected keyword argument 'backend'")
        assert recorder == "nccl2"
        return self.nccl2.dump()

    @staticmethod
    def recorder_of(pg: NamedGroup) -> str | None:
        return pg.backend if pg.backend == "nccl2" else None  # torch attached a FlightRecorderHook to nccl2 groups


def two_groups(hooked: bool) -> tuple[RecordCounter, Recorders, dict[str, tuple[NamedGroup, LocalComm]]]:
    recorders = Recorders(hooked)
    counter = RecordCounter(flight_recorder=True, dump=recorders.dump, recorder_of=recorders.recorder_of)
    groups = {}
    for i, backend in enumerate(("gloo", "nccl2")):
        group, comm = NamedGroup(str(i), backend), LocalComm(comm_hash=10 + i, size=4, rank=0)
        counter.add(group, comm, created_ns=5)
        groups[backend] = (group, comm)
    return counter, recorders, groups


def test_a_group_of_a_backend_without_native_recording_is_counted_from_its_hook_based_recorder() -> None:
    counter, recorders, groups = two_groups(hooked=True)
    gloo, gloo_comm = groups["gloo"]
    nccl2, nccl2_comm = groups["nccl2"]
    gloo.seq += 1
    recorders.native.record(gloo.seq, "gloo:broadcast", group="0")
    for _ in range(2):  # DDP's buckets on nccl2: entries named by the backend, finished as "completed"
        nccl2.seq += 1
        recorders.nccl2.record(nccl2.seq, "nccl2:all_reduce", group="1")
    nccl2.seq += 1
    recorders.nccl2.record(nccl2.seq, "nccl2:_all_gather_base", retired=False, group="1")  # in flight
    counter.refresh(1.0)
    assert gloo_comm.beneath_launched[BROADCAST] == gloo_comm.beneath_completed[BROADCAST] == 1
    assert nccl2_comm.beneath_launched[ALLREDUCE] == nccl2_comm.beneath_completed[ALLREDUCE] == 2
    assert (nccl2_comm.beneath_launched[ALLGATHER], nccl2_comm.beneath_completed[ALLGATHER]) == (1, 0)
    assert "(sequence numbers, native Flight Recorder, nccl2's hook-based Flight Recorder)" in counter.describe()
    recorders.nccl2.retire(3)
    counter.refresh(2.0)  # gone quiet with one pending: read again
    assert nccl2_comm.beneath_completed[ALLGATHER] == 1
    journal = json.loads(counter.dump_every())["entries"]  # what the verdict journal reads: both recorders
    assert sorted(e["profiling_name"] for e in journal) == [
        "gloo:broadcast",
        "nccl2:_all_gather_base",
        "nccl2:all_reduce",
        "nccl2:all_reduce",
    ]


def test_a_torch_whose_dump_takes_no_backend_counts_those_groups_as_other_and_reads_the_native_one(caplog) -> None:
    counter, recorders, groups = two_groups(hooked=False)
    gloo, gloo_comm = groups["gloo"]
    nccl2, nccl2_comm = groups["nccl2"]
    gloo.seq += 1
    recorders.native.record(gloo.seq, "gloo:all_reduce", group="0")
    nccl2.seq += 1
    with caplog.at_level("INFO", logger="rasd"):
        counter.refresh(1.0)
        counter.refresh(40.0)
    assert gloo_comm.beneath_launched[ALLREDUCE] == 1  # the native recorder is read as before
    assert nccl2_comm.beneath_unread == 1 and nccl2_comm.beneath_unread_op == OTHER  # the total exact, the type not
    assert sum("nccl2's hook-based Flight Recorder cannot be read" in r.message for r in caplog.records) == 1
    assert counter.flight_recorder and "(sequence numbers, native Flight Recorder)" in counter.describe()


@pytest.mark.slow  # a real process group
def test_the_installed_torch_is_read_by_feature_detection(tmp_path) -> None:
    """Against the torch installed here (2.13 on this project's machines): a gloo group writes to the native
    recorder, which reads; whether a hook-based recorder exists is what the dump's ``backend`` argument says."""
    import torch
    import torch.distributed as dist

    from rasd.torch import records

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        dist.all_reduce(torch.ones(2))
        assert records._recorder_of(group) is None
        native = json.loads(records._dump_flight_recorder())
        assert any(e["profiling_name"] == "gloo:all_reduce" for e in native.get("entries", []))
        try:  # 2.15 on: a JSON dump of nccl2's hook-based recorder (empty here); before: no such argument
            assert isinstance(json.loads(records._dump_flight_recorder("nccl2")), dict)
        except TypeError as no_backend:
            assert "backend" in str(no_backend), (torch.__version__, no_backend)
    finally:
        dist.destroy_process_group()
