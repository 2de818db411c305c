"""The STACKS report (docs/protocol.md §2.6): what one process answers (rasd.net.thread_stacks, read from this
test's own threads) and how the root folds every process's answer (rasd.report.stacks), without a socket."""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from polling import wait_for
from rasd.core.answer import Answer
from rasd.core.comms import N_OPS, OP_TYPES, CommRecord, RankRecord
from rasd.core.frames import POSITION_FRAMES, Frame
from rasd.core.peers import Addr, PeerInfo
from rasd.core.wire import MAX_ANSWER_BYTES
from rasd.net import thread_stacks as reading
from rasd.report import stacks

# --- the answers of a job of four processes, two per host --------------------------------------------------------

PEERS = [PeerInfo(Addr("10.0.0.1", 9000 + i), 100 + i, f"node{i // 2}", 1, rank=i) for i in range(4)]
ALL = [p.addr for p in PEERS]

MODULE = Frame("/src/train.py", 10, "<module>")
STEP = Frame("/src/train.py", 31, "step")
REDUCE = Frame("/torch/distributed/c10d.py", 2050, "all_reduce")
NEXT = Frame("/src/data.py", 88, "next_batch")
GET = Frame("/usr/lib/python3.11/queue.py", 171, "get")
#: Where most ranks are (inside the all-reduce), and where a straggler is (waiting for its data).
REDUCING = (MODULE, STEP, REDUCE)
LOADING = (MODULE, STEP, NEXT, GET)


def thread(frames: Sequence[Frame], name: str = "MainThread", main: bool = True, cut: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"thread": name, "main": main, "frames": [[f.file, f.line, f.function] for f in frames]}
    if cut:
        out["cut"] = True
    return out


def seen(i: int, age_s: float, frames: Sequence[Frame]) -> dict[str, Any]:
    """What an answer's ``last_seen`` says of process ``i``: where the mesh last saw it, ``age_s`` before."""
    p = PEERS[i]
    return {
        "host": p.hostname,
        "pid": p.pid,
        "rank": p.rank,
        "age_s": age_s,
        "frames": [[f.file, f.line, f.function] for f in frames],
    }


#: What ``stacks.comms_of`` gives: the counters an answer shares, and the seconds its own part says they stood.
Counters = tuple[list[dict[str, Any]], float]


def answer(
    i: int,
    *threads: dict[str, Any],
    last_seen: Sequence[dict[str, Any]] = (),
    comms: Counters | None = None,
) -> Answer:
    """Process ``i``'s answer as ``rasd.net.thread_stacks.answer`` writes it (by default: its main thread reducing)."""
    return answer_of(PEERS[i], *threads, last_seen=last_seen, comms=comms)


def packed(obj: object) -> bytes:
    """``obj`` as an answer's shared part carries it: JSON, compressed."""
    return zlib.compress(json.dumps(obj).encode())


#: The fields of an answer in its shared part; the others are its own.
SHARED = ("format", "threads", "comms")


def encode(doc: dict[str, Any]) -> Answer:
    """``doc`` as ``rasd.net.thread_stacks.answer`` splits it into the answer's two parts."""
    own = {key: value for key, value in doc.items() if key not in SHARED}
    return Answer(packed({key: doc[key] for key in SHARED if key in doc}), stacks.encode_own(own))


def decode(answer: Answer) -> dict[str, Any] | None:
    """Both parts of an answer as one object (None if its shared part is unreadable)."""
    shared, own = stacks.decode_shared(answer.shared), stacks.decode_own(answer.own)
    return None if shared is None or own is None else {**shared, **own}


def answer_of(
    p: PeerInfo,
    *threads: dict[str, Any],
    last_seen: Sequence[dict[str, Any]] = (),
    comms: Counters | None = None,
) -> Answer:
    doc: dict[str, Any] = {
        "format": stacks.FORMAT,
        "host": p.hostname,
        "pid": p.pid,
        "rank": p.rank,
        "wall": 1000.0,
        "threads": list(threads) or [thread(REDUCING)],
        "last_seen": list(last_seen),
    }
    if comms is not None:
        doc["comms"], doc["stood_s"] = list(comms[0]), comms[1]
    return encode(doc)


def fold(answers: dict[int, Answer], all_threads: bool = False, ranks: frozenset[int] | None = None) -> stacks.Stacks:
    return stacks.fold({PEERS[i].addr: a for i, a in answers.items()}, PEERS, ALL, 0.012, all_threads, ranks)


def ranks_of(group: stacks.Group) -> list[int]:
    return [p.rank for p in group.procs]


# --- fold ---------------------------------------------------------------------------------------------------------


def test_identical_stacks_fold_into_one_group_and_the_largest_comes_first():
    # The straggler answers first: the order of the groups is by size, not by arrival.
    folded = fold({2: answer(2, thread(LOADING)), 0: answer(0), 3: answer(3), 1: answer(1)})
    assert [(g.frames, ranks_of(g)) for g in folded.groups] == [(REDUCING, [0, 1, 3]), (LOADING, [2])]
    assert folded.answered == 4 and folded.missing == ()
    assert not any(g.cut for g in folded.groups)


def test_the_threads_of_one_process_stay_apart_unless_their_frames_are_identical():
    worker = (Frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"), NEXT, GET)
    other = (Frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"), Frame("/src/log.py", 5, "flush"))
    folded = fold(
        {
            0: answer(0, thread(REDUCING), thread(worker, "loader", main=False)),
            1: answer(1, thread(REDUCING), thread(worker, "prefetch", main=False)),
            2: answer(2, thread(REDUCING), thread(other, "logger", main=False)),
            3: answer(3, thread(REDUCING)),
        },
        all_threads=True,
    )
    groups = {g.frames: g for g in folded.groups}
    assert set(groups) == {REDUCING, worker, other}
    assert ranks_of(groups[REDUCING]) == [0, 1, 2, 3]
    assert sorted(groups[worker].threads, key=lambda t: t[0].rank) == [
        (stacks.Proc("node0", 100, 0), "loader"),
        (stacks.Proc("node0", 101, 1), "prefetch"),
    ]
    assert groups[other].threads == [(stacks.Proc("node1", 102, 2), "logger")]
    assert [len(g.threads) for g in folded.groups] == [4, 2, 1]


def test_a_rank_filter_keeps_only_those_ranks_stacks_and_missing_processes():
    folded = fold({0: answer(0), 1: answer(1, thread(LOADING)), 2: answer(2)}, ranks=frozenset({1, 2}))
    # Two groups of one: in rank order.
    assert [(g.frames, ranks_of(g)) for g in folded.groups] == [(LOADING, [1]), (REDUCING, [2])]
    assert folded.missing == ()  # rank 3 did not answer, but it was not asked about
    # The heading counts the processes asked about: 2 of 2, not rank 0's answer, which is not shown.
    assert render(folded).startswith("Stacks of 2 of 2 processes")
    missing = fold({0: answer(0), 1: answer(1)}, ranks=frozenset({1, 3}))
    assert [m.proc.rank for m in missing.missing] == [3]
    assert render(missing).startswith("Stacks of 1 of 2 processes")


def test_a_process_that_did_not_answer_is_missing_with_no_position_when_none_was_seen():
    folded = fold({0: answer(0), 1: answer(1), 2: answer(2)})
    assert folded.missing == (stacks.Missing(stacks.Proc("node1", 103, 3)),)
    assert folded.answered == 3


OWN_3 = stacks.encode_own({"host": "node1", "pid": 103, "rank": 3})
NO_THREADS = packed({"format": stacks.FORMAT, "threads": []})


@pytest.mark.parametrize(
    "unreadable",
    [
        Answer(),  # its provider failed (rasd.net.thread_stacks.provider)
        Answer(b"not json", OWN_3),
        Answer(zlib.compress(b"not json"), OWN_3),
        Answer(json.dumps({"format": stacks.FORMAT, "threads": []}).encode(), OWN_3),  # not compressed
        Answer(packed({"format": stacks.FORMAT - 1, "threads": []}), OWN_3),  # another version's
        Answer(packed({"format": stacks.FORMAT}), OWN_3),  # no threads
        Answer(packed([1, 2]), OWN_3),
        Answer(zlib.compress(b" " * (stacks.MAX_DECODED + 1)), OWN_3),  # a small part that would inflate past the bound
        Answer(zlib.compress(b"{}")[:-2], OWN_3),  # cut short
        Answer(NO_THREADS, b""),  # no own part
        Answer(NO_THREADS, OWN_3[:10]),  # cut short
        Answer(NO_THREADS, OWN_3[:-1]),  # its host's name cut short
        Answer(NO_THREADS, OWN_3 + b"not json"),
        Answer(NO_THREADS, OWN_3 + b"[1, 2]"),
        Answer(NO_THREADS, OWN_3 + b'{"phase": {"name": "x"}}'),  # a phase without its seconds and limit
        Answer(own=OWN_3),  # no shared part
    ],
)
def test_an_unreadable_or_foreign_answer_counts_as_missing(unreadable: Answer):
    folded = fold({0: answer(0), 1: answer(1), 2: answer(2), 3: unreadable})
    assert [m.proc.rank for m in folded.missing] == [3] and folded.answered == 3
    assert [ranks_of(g) for g in folded.groups] == [[0, 1, 2]]


def test_a_missing_process_gets_the_freshest_position_any_answer_saw_of_it():
    older = (MODULE, STEP)
    folded = fold(
        {
            0: answer(0, last_seen=[seen(3, 7.5, older)]),
            1: answer(1, last_seen=[seen(3, 1.5, LOADING)]),  # the freshest
            2: answer(2, last_seen=[seen(3, 4.0, older), seen(1, 0.5, older)]),  # rank 1 answered: not missing
        }
    )
    assert folded.missing == (stacks.Missing(stacks.Proc("node1", 103, 3), LOADING, 1.5),)


def test_a_missing_process_the_table_does_not_know_is_left_out():
    stranger = Addr("10.0.0.9", 9999)
    folded = stacks.fold({p.addr: answer(p.rank) for p in PEERS}, PEERS, [*ALL, stranger], 0.01, False)
    assert folded.missing == ()


# --- render_text and render_json ----------------------------------------------------------------------------------


def render(folded: stacks.Stacks) -> str:
    return stacks.render_text(folded)


def test_the_text_names_each_group_and_lists_its_frames_outermost_first_then_who_is_not_answering():
    folded = fold(
        {
            0: answer(0),
            1: answer(1),
            2: answer(2, thread(LOADING[2:], cut=True), last_seen=[seen(3, 1.5, LOADING[-2:])]),
        }
    )
    assert render(folded) == (
        "Stacks of 3 of 4 processes (main threads), gathered in 12.0 ms; identical stacks folded\n"
        "\n"
        "ranks 0,1 (2 processes on node0, thread MainThread):\n"
        "    /src/train.py:10 (<module>)\n"
        "    /src/train.py:31 (step)\n"
        "    /torch/distributed/c10d.py:2050 (all_reduce)\n"
        "\n"
        "rank 2 (node1:102, thread MainThread):\n"
        "    ... (outermost frames left out)\n"
        "    /src/data.py:88 (next_batch)\n"
        "    /usr/lib/python3.11/queue.py:171 (get)\n"
        "\n"
        "Not answering (stopped, its RAS thread starved by a GIL hog, or dead and not yet known):\n"
        "    rank 3 (node1:103): last seen 1.5 s before, in "
        "/src/data.py:88 (next_batch) -> /usr/lib/python3.11/queue.py:171 (get)\n"
    )


def test_the_text_of_every_thread_says_so_and_a_process_never_seen_has_no_position():
    folded = fold({0: answer(0, thread(()), thread(REDUCING, "loader", main=False))}, all_threads=True)
    text = render(folded)
    assert text.startswith("Stacks of 1 of 4 processes (every thread), gathered in 12.0 ms")
    assert "rank 0 (node0:100, thread MainThread):\n    (no Python frames)\n" in text
    assert "rank 0 (node0:100, thread loader):\n    /src/train.py:10 (<module>)\n" in text
    assert text.endswith(
        "    rank 1 (node0:101): no position seen\n"
        "    rank 2 (node1:102): no position seen\n"
        "    rank 3 (node1:103): no position seen\n"
    )


def test_json_carries_the_same_groups_and_missing_processes():
    folded = fold(
        {
            2: answer(2, thread(LOADING, cut=True)),
            0: answer(0),
            1: answer(1, last_seen=[seen(3, 2.25, LOADING)]),
        }
    )
    doc = json.loads(stacks.render_json(folded, "node0", 100, 1234.5))["stacks"]
    assert (doc["host"], doc["pid"], doc["timestamp"], doc["all_threads"], doc["answered_count"]) == (
        "node0",
        100,
        1234.5,
        False,
        3,
    )
    assert doc["collection_time_sec"] == pytest.approx(0.012)
    frames = [{"file": f.file, "line": f.line, "function": f.function} for f in LOADING]
    assert doc["groups"] == [
        {
            "processes": [{"host": "node0", "pid": 100, "rank": 0}, {"host": "node0", "pid": 101, "rank": 1}],
            "threads": ["MainThread"],
            "cut": False,
            "collectives": [],
            "frames": [{"file": f.file, "line": f.line, "function": f.function} for f in REDUCING],
        },
        {
            "processes": [{"host": "node1", "pid": 102, "rank": 2}],
            "threads": ["MainThread"],
            "cut": True,
            "collectives": [],
            "frames": frames,
        },
    ]
    assert doc["missing"] == [
        {"host": "node1", "pid": 103, "rank": 3, "last_seen": {"age_sec": 2.25, "frames": frames}}
    ]
    no_position = json.loads(stacks.render_json(fold({0: answer(0)}), "node0", 100, 0.0))["stacks"]["missing"]
    assert [m["last_seen"] for m in no_position] == [None, None, None]


def test_a_heading_names_at_most_sixteen_ranks_and_four_hosts():
    many = [PeerInfo(Addr("10.0.1.1", 9000 + i), 200 + i, f"host{i // 4}", 1, rank=i) for i in range(20)]
    data = {p.addr: answer_of(p) for p in many}
    (group,) = stacks.fold(data, many, [p.addr for p in many], 0.0, False).groups
    assert stacks.heading(group) == (
        "ranks 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,... "
        "(20 processes on host0, host1, host2, host3 and 1 more hosts, thread MainThread)"
    )


# --- what one process answers (rasd.net.thread_stacks), read from this test's threads ---------------------------------

ME = PEERS[0]


@pytest.fixture
def helper() -> Iterator[Callable[[Callable[[threading.Event], None], str], threading.Thread]]:
    """``helper(target, name)`` runs ``target(stop)`` in a daemon thread; each is stopped and joined at the end."""
    stop = threading.Event()
    started: list[threading.Thread] = []

    def start(target: Callable[[threading.Event], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
        t.start()
        started.append(t)
        return t

    yield start
    stop.set()
    for t in started:
        t.join(10)


def _stack_of(name: str, all_threads: bool = True) -> list[list[Any]] | None:
    return next((t["frames"] for t in reading.thread_stacks(all_threads) if t["thread"] == name), None)


def test_a_thread_blocked_in_a_queue_shows_queue_get_among_its_innermost_frames(helper):
    q: queue.Queue[int] = queue.Queue()

    def consume(stop: threading.Event) -> None:
        q.get()

    helper(consume, "loader")
    try:
        # Until the thread is inside get (it is started, but may not have reached it yet).
        frames = wait_for(
            lambda: _stack_of("loader"),
            lambda f: f is not None and any(fn == "get" for _, _, fn in f[-3:]),
            30,
            0.02,
            what="the loader thread blocked in queue.get",
        )
    finally:
        q.put(0)
    assert frames is not None
    get = next(f for f in frames[-3:] if f[2] == "get")
    assert get[0].endswith("/queue.py")
    functions = [f[2] for f in frames]
    assert functions.index("consume") < functions.index("get")  # outermost first


def test_the_main_thread_comes_first_and_alone_unless_every_thread_is_asked(helper):
    helper(lambda stop: stop.wait(), "idle")
    wait_for(lambda: _stack_of("idle"), lambda f: f is not None, 30, 0.02, what="the idle thread")
    main_only = reading.thread_stacks(False)
    assert [(t["thread"], t["main"]) for t in main_only] == [(threading.main_thread().name, True)]
    every = reading.thread_stacks(True)
    assert every[0]["main"] and not any(t["main"] for t in every[1:])
    assert "idle" in [t["thread"] for t in every[1:]]


def test_the_main_position_is_a_few_innermost_frames_this_test_among_them():
    position = reading.main_position()
    assert 0 < len(position) <= POSITION_FRAMES
    assert all(isinstance(f, Frame) for f in position)
    assert any(
        f.function == "test_the_main_position_is_a_few_innermost_frames_this_test_among_them" and f.file == __file__
        for f in position
    )
    assert position[-1].function == "main_position"  # the innermost last: the reading itself


def _recurse_through_a_long_chain_of_calls_then_wait(depth: int, stop: threading.Event) -> None:
    """A deep stack of frames with a long name (each ~120 bytes in an answer), then a wait until the test ends."""
    if depth:
        _recurse_through_a_long_chain_of_calls_then_wait(depth - 1, stop)
    else:
        stop.wait()


RECURSE = _recurse_through_a_long_chain_of_calls_then_wait.__name__


def _deep(helper: Callable[..., threading.Thread], name: str, depth: int) -> None:
    """A helper thread ``depth`` calls deep (under the recursion limit of 1000), waiting at the bottom."""
    helper(lambda stop: _recurse_through_a_long_chain_of_calls_then_wait(depth, stop), name)
    wait_for(
        lambda: _stack_of(name),
        lambda f: f is not None and f[-1][2] == "wait",  # only the deepest call waits
        30,
        0.02,
        what=f"the {name} thread at its full depth",
    )


def _fits(data: Answer) -> dict[str, Any]:
    assert 0 < data.size <= MAX_ANSWER_BYTES
    doc = decode(data)
    assert doc is not None
    return doc


def test_a_very_deep_stack_is_cut_from_its_outermost_end_to_fit_one_answer(helper, monkeypatch):
    # Keep every frame, as without the per-thread cap; 900 frames of ~120 bytes are more than an answer holds once
    # the bound on its decompressed size is 64 KiB (1 MiB in use: a deeper stack than Python's recursion limit).
    monkeypatch.setattr(reading, "STACK_FRAMES", 100_000)
    monkeypatch.setattr(stacks, "MAX_DECODED", 64 * 1024)
    _deep(helper, "deep", 900)
    data = reading.answer(ME, True)
    doc = _fits(data)
    (deep,) = (t for t in doc["threads"] if t["thread"] == "deep")
    assert deep["cut"] is True and 0 < len(deep["frames"]) < 900
    # The innermost frames are kept: where the thread waits (Event.wait, Condition.wait), the recursion above it.
    assert [f[2] for f in deep["frames"][-3:]] == [RECURSE, "wait", "wait"]
    assert doc["threads"][0]["main"] and "cut" not in doc["threads"][0]
    # What the root reads of it: a group marked as cut, which the text says.
    folded = stacks.fold({ME.addr: data}, [ME], [ME.addr], 0.0, True)
    assert [g.cut for g in folded.groups if g.threads[0][1] == "deep"] == [True]
    assert "    ... (outermost frames left out)\n" in stacks.render_text(folded)


def test_many_deep_threads_fit_one_answer_whole_with_the_default_cap(helper):
    for n in range(12):  # 12 threads of 64 frames of ~120 bytes: 92 KB of JSON, compressed within one answer
        _deep(helper, f"deep-{n}", 200)
    data = reading.answer(ME, True)
    doc = _fits(data)
    deep = [t for t in doc["threads"] if t["thread"].startswith("deep-")]
    assert len(deep) == 12 and all(len(t["frames"]) == reading.STACK_FRAMES for t in deep)
    assert not any(t.get("cut") for t in deep) and all(t["frames"][-1][2] == "wait" for t in deep)
    assert doc["threads"][0]["main"]
    assert len(data.shared) < len(json.dumps(doc)) / 4  # stacks repeat themselves: compressed, a quarter or less


def test_the_answer_says_who_answers_and_folds_with_the_same_stack_of_another_process():
    answers = {p.addr: reading.provider(p, False, list)() for p in PEERS[:2]}  # one line: identical stacks
    docs = [decode(a) for a in answers.values()]
    assert [(d["host"], d["pid"], d["rank"], d["format"]) for d in docs] == [
        ("node0", 100, 0, stacks.FORMAT),
        ("node0", 101, 1, stacks.FORMAT),
    ]
    folded = stacks.fold(answers, PEERS[:2], [p.addr for p in PEERS[:2]], 0.0, False)
    (group,) = folded.groups
    assert ranks_of(group) == [0, 1] and group.frames[-1].function == "thread_stacks"


def test_the_answer_carries_its_processs_collective_counters_and_the_fold_names_the_collective():
    """``provider``'s ``comms`` are the records a status gather takes (``ProcessData.comms``)."""
    records = {0: record(0, 7, inside=True), 1: record(1, 7, inside=False)}

    def comms_of(rank: int) -> tuple[CommRecord, ...]:
        return (records[rank],)

    answers = {p.addr: reading.provider(p, False, list, lambda p=p: comms_of(p.rank))() for p in PEERS[:2]}
    assert [decode(a)["comms"][0]["comm"] for a in answers.values()] == [f"{WORLD:016x}"] * 2
    folded = stacks.fold(answers, PEERS[:2], [p.addr for p in PEERS[:2]], 0.0, False)
    assert sorted(c.state for g in folded.groups for c in g.collectives) == [stacks.INSIDE, stacks.NOT_LAUNCHED]


def test_the_answer_carries_the_last_positions_it_was_given():
    last = [seen(3, 2.0, LOADING)]
    doc = decode(reading.provider(ME, False, lambda: last)())
    assert doc is not None
    assert doc["last_seen"] == last


def test_two_processes_in_the_same_place_share_their_answers_shared_part_byte_for_byte():
    """What lets the relays carry one stack for thousands of ranks: nothing of a process's own is in the shared part,
    and its own part is small (host, pid, rank, clock; how long its collective stood)."""
    records = {p.rank: (record(p.rank, 32, inside=True, idle_ms=21_000 + 37 * p.rank),) for p in PEERS}
    answers = [reading.answer(p, False, (), records[p.rank]) for p in PEERS[:2]]
    assert answers[0].shared == answers[1].shared and answers[0].own != answers[1].own
    own = stacks.decode_own(answers[1].own)
    assert own is not None and sorted(own) == ["host", "pid", "rank", "stood_s", "wall"]
    assert (own["host"], own["pid"], own["rank"], own["stood_s"]) == ("node0", 101, 1, 21.037)
    assert len(answers[1].own) < 40


def test_positions_of_others_too_large_for_half_an_answer_are_left_out_and_the_stacks_kept():
    frames = [Frame(f"/src/module_{i}.py", i, "f" * 200) for i in range(POSITION_FRAMES)]
    many = [seen(i % 4, 1.0, frames) for i in range(200)]  # far more than half of MAX_ANSWER_BYTES
    data = reading.answer(ME, False, many)
    doc = _fits(data)
    assert "last_seen" not in doc and doc["threads"][0]["frames"]
    few = reading.answer(ME, False, many[:1])
    assert _fits(few)["last_seen"] == many[:1]


def _broken_last_seen() -> list[dict[str, Any]]:
    raise RuntimeError("the mesh's table is being rebuilt")


def _broken_frames() -> dict[int, Any]:
    raise RuntimeError("no frames to read")


@pytest.mark.parametrize("breaks", ["last_seen", "frames"])
def test_a_provider_that_cannot_read_answers_empty_and_warns_once(breaks: str, monkeypatch, caplog):
    if breaks == "frames":
        monkeypatch.setattr(sys, "_current_frames", _broken_frames)
    make = reading.provider(ME, True, _broken_last_seen if breaks == "last_seen" else list)
    with caplog.at_level(logging.DEBUG, logger="rasd"):
        assert make() == Answer()
    warnings = [r for r in caplog.records if r.name == "rasd" and r.levelno >= logging.WARNING]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert "stacks" in warnings[0].getMessage() and warnings[0].exc_info is not None


def test_a_declared_phase_travels_with_the_answer_and_the_report_names_it():
    """``rasd.phase`` (issue 39): the process that declared one says so in its answer, and the folded report lists
    it, read from this test's own process."""
    import rasd

    with rasd.phase("checkpoint", limit=900):
        mine = decode(reading.answer(PEERS[0], all_threads=False))
    assert mine is not None and mine["phase"]["name"] == "checkpoint" and mine["phase"]["limit"] == 900.0
    assert "phase" not in decode(reading.answer(PEERS[0], all_threads=False))  # the phase has ended
    doc = dict(mine, phase={"name": "checkpoint", "seconds": 45.25, "limit": 900.0})
    folded = fold({0: encode(doc), 1: answer(1), 2: answer(2), 3: answer(3)})
    assert [(p.proc.rank, p.name) for p in folded.phases] == [(0, "checkpoint")]
    text = stacks.render_text(folded)
    assert (
        "In a phase their code declared (rasd.phase):\n    rank 0 (node0:100): checkpoint, for 45.2 s (limit 900 s)"
        in text
    )
    assert json.loads(stacks.render_json(folded, "h", 1, 0.0))["stacks"]["phases"][0]["name"] == "checkpoint"


def test_a_bad_phase_limit_is_one_warning_and_the_busy_limit(caplog: pytest.LogCaptureFixture) -> None:
    import rasd
    from rasd.net import work

    with caplog.at_level(logging.WARNING, logger="rasd"), rasd.phase("eval", limit="soon"):  # type: ignore[arg-type]
        declared = work.declared_phase()
    assert declared is not None and declared.limit == 0.0
    assert [r.getMessage() for r in caplog.records] == [
        "rasd.phase('eval', limit='soon'): the limit is not a number of seconds; using the busy limit"
    ]


# --- the collective each rank is in (issue 42, item 1) ---------------------------------------------------------------

WORLD = 0xBBF5_0000_1234_ABCD
ALLREDUCE = OP_TYPES.index("AllReduce")
BARRIER = OP_TYPES.index("Barrier")


def record(rank: int, reduced: int, inside: bool, idle_ms: int = 21_000) -> CommRecord:
    """A process's rank of the world communicator: ``reduced`` all-reduces completed, and one more launched when
    ``inside``; one barrier done."""
    launched = [0] * N_OPS
    completed = [0] * N_OPS
    launched[ALLREDUCE] = reduced + (1 if inside else 0)
    completed[ALLREDUCE] = reduced
    launched[BARRIER] = completed[BARRIER] = 1
    rank_record = RankRecord(rank, launched=tuple(launched), completed=tuple(completed), idle_ms=idle_ms)
    return CommRecord(WORLD, 4, (rank_record,))


def counters(rank: int, reduced: int, inside: bool, idle_ms: int = 21_000) -> Counters:
    """What the answer of that process carries (``stacks.comms_of``)."""
    return stacks.comms_of([record(rank, reduced, inside, idle_ms)])


def test_ranks_inside_an_all_reduce_and_the_rank_that_never_launched_it_are_named_on_their_stacks():
    """The demo's DDP stall: ranks 0, 1 and 3 inside AllReduce 33 of the world communicator (DDP's reducer runs it in
    C++: their frames show only backward), rank 2 stalled before launching it."""
    backward = (MODULE, STEP, Frame("/torch/autograd/graph.py", 829, "_engine_run_backward"))
    answers = {
        i: answer(i, thread(backward), comms=counters(i, 32, inside=True, idle_ms=21_000 + i * 100)) for i in (0, 1, 3)
    }
    answers[2] = answer(2, thread(LOADING), comms=counters(2, 32, inside=False))
    folded = fold(answers)
    inside, behind = folded.groups
    assert ranks_of(inside) == [0, 1, 3] and ranks_of(behind) == [2]
    comm = f"{WORLD:016x}"
    assert inside.collectives == (stacks.Collective(stacks.INSIDE, comm, "AllReduce", 33),)
    assert inside.collective_s == pytest.approx(21.3)
    assert behind.collectives == (stacks.Collective(stacks.NOT_LAUNCHED, comm, "AllReduce", 33),)
    text = stacks.render_text(folded)
    assert (
        f"ranks 0,1,3 (3 processes on node0, node1, thread MainThread):\n"
        f"    collective: inside AllReduce operation 33 of communicator {comm} (launched, not completed), for 21.3 s\n"
        f"    /src/train.py:10 (<module>)\n"
    ) in text
    assert (
        f"rank 2 (node1:102, thread MainThread):\n"
        f"    collective: not in AllReduce operation 33 of communicator {comm}: never launched it, while ranks 0,1,3 "
        f"are inside it\n"
    ) in text
    groups = json.loads(stacks.render_json(folded, "node0", 100, 0.0))["stacks"]["groups"]
    assert groups[0]["collectives"] == [
        {
            "state": "inside",
            "communicator": comm,
            "op": "AllReduce",
            "operation": 33,
            "seconds": 21.3,
            "inside_ranks": [0, 1, 3],
        }
    ]
    assert groups[1]["collectives"][0]["state"] == "not_launched" and groups[1]["collectives"][0]["seconds"] is None


def test_ranks_inside_the_same_collective_with_the_same_frames_fold_and_other_collectives_split_them():
    answers = {i: answer(i, comms=counters(i, 10, inside=True)) for i in (0, 1)}
    answers[2] = answer(2, comms=counters(2, 11, inside=True))  # the same frames, the next all-reduce
    answers[3] = answer(3)  # an answer of an older rasd: no counters
    folded = fold(answers)
    assert [ranks_of(g) for g in folded.groups] == [[0, 1], [2], [3]]
    assert [g.collectives[0].number if g.collectives else None for g in folded.groups] == [11, 12, None]


def test_a_rank_that_never_launched_an_operation_of_that_type_is_not_in_the_first_one():
    """A stall before the first all-reduce (a first step): the stalled rank's counters have no AllReduce at all."""
    answers = {i: answer(i, comms=counters(i, 0, inside=True)) for i in (0, 1, 3)}
    answers[2] = answer(2, thread(LOADING), comms=counters(2, 0, inside=False))
    behind = next(g for g in fold(answers).groups if ranks_of(g) == [2])
    assert behind.collectives == (stacks.Collective(stacks.NOT_LAUNCHED, f"{WORLD:016x}", "AllReduce", 1),)


def test_a_collective_is_named_only_once_its_counters_have_stood_a_second():
    """A healthy job passes through collectives many times a second: its identical stacks stay one group."""
    answers = {i: answer(i, comms=counters(i, 10, inside=i % 2 == 0, idle_ms=30)) for i in range(4)}
    (group,) = fold(answers).groups
    assert ranks_of(group) == [0, 1, 2, 3] and group.collectives == ()


def test_threads_other_than_the_main_one_carry_no_collective_and_malformed_counters_make_an_answer_unreadable():
    worker = thread(LOADING, name="loader", main=False)
    folded = fold({0: answer(0, thread(REDUCING), worker, comms=counters(0, 5, inside=True))}, all_threads=True)
    by_thread = {g.threads[0][1]: g for g in folded.groups}
    assert by_thread["MainThread"].collectives and not by_thread["loader"].collectives
    unknown = [{**counters(1, 5, inside=True)[0][0], "ops": [[N_OPS + 3, 1, 0]]}]  # a type of a newer version
    (group,) = fold({1: answer(1, comms=(unknown, 21.0))}).groups
    assert group.collectives == ()
    malformed = [{**counters(1, 5, inside=True)[0][0], "ops": [[1, 2]]}]
    assert fold({1: answer(1, comms=(malformed, 21.0))}).answered == 0


def test_the_counters_an_answer_carries_put_communicators_with_an_operation_in_flight_first_and_are_bounded():
    idle = [CommRecord(i, 2, (RankRecord(0),)) for i in range(stacks.MAX_COMMS + 8)]
    busy = CommRecord(WORLD, 4, (RankRecord(1, launched=(1,) + (0,) * (N_OPS - 1)),))
    carried, stood_s = stacks.comms_of([*idle, busy])
    assert len(carried) == stacks.MAX_COMMS and carried[0]["comm"] == f"{WORLD:016x}"
    assert carried[0]["ops"] == [[0, 1, 0]] and carried[1]["ops"] == []  # only the types launched
    assert stood_s == 0.0 and not carried[0]["stood"]  # in flight, but for less than STOOD_S
    standing = CommRecord(WORLD, 4, (RankRecord(1, launched=(1,) + (0,) * (N_OPS - 1), idle_ms=21_300),))
    carried, stood_s = stacks.comms_of([*idle, standing])
    assert carried[0]["stood"] and stood_s == 21.3
    # Nothing of a rank's own (its rank in the communicator, how long to the millisecond) is in the shared part:
    # ranks inside one operation share it byte for byte.
    other = CommRecord(WORLD, 4, (RankRecord(2, launched=(1,) + (0,) * (N_OPS - 1), idle_ms=24_100),))
    assert stacks.comms_of([other])[0] == stacks.comms_of([standing])[0]
