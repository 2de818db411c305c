"""``rascli --stacks --native`` (rascli/native.py): reading py-spy's dump, explaining why a process cannot be read,
and folding identical native stacks. The dump of real processes is in test_rascli_swarm.py."""

from __future__ import annotations

from rascli import native

#: ``py-spy dump --native --pid 4242`` of a process whose main thread sleeps and whose loader thread waits in a queue.
DUMP = """\
Process 4242: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    clock_nanosleep (libc.so.6)
    time_sleep (libpython3.11.so.1.0)
    wait (train.py:3)
    <module> (train.py:4)
    0x7f5fe9a4524a (libc.so.6)
Thread 4250 (idle): "loader"
    pthread_cond_wait (libc.so.6)
    get (queue.py:171)
"""


def test_the_main_threads_frames_come_outermost_first_and_other_threads_only_when_asked() -> None:
    (main,) = native.parse(DUMP, 4242, all_threads=False)
    assert (main.tid, main.state, main.name) == (4242, "idle", "MainThread")
    assert main.frames[0] == "0x7f5fe9a4524a (libc.so.6)" and main.frames[-1] == "clock_nanosleep (libc.so.6)"
    every = native.parse(DUMP, 4242, all_threads=True)
    assert [t.name for t in every] == ["MainThread", "loader"]
    assert native.parse("Process 1: nothing\n", 1, all_threads=False) == ()


def test_a_refused_ptrace_gets_one_line_that_says_what_allows_it() -> None:
    line = native.explain(1, "Error: Permission Denied: Try running again with elevated permissions\n")
    assert line.startswith("ptrace is not allowed (") and "CAP_SYS_PTRACE" in line and "ptrace_scope" in line
    assert native.explain(1, "Error: No such process (os error 3)\n").startswith("the process is gone")
    assert native.explain(3, "") == "py-spy: py-spy exited with status 3"


def test_the_report_names_its_processes_by_rank() -> None:
    doc = {
        "stacks": {
            "groups": [
                {"processes": [{"host": "a", "pid": 10, "rank": 1}, {"host": "a", "pid": 11, "rank": 0}]},
                {"processes": [{"host": "b", "pid": 12, "rank": 2}]},
            ]
        }
    }
    assert [(t.rank, t.pid) for t in native.targets(doc)] == [(0, 11), (1, 10), (2, 12)]


def test_identical_native_stacks_fold_whatever_py_spys_sample_of_their_state() -> None:
    """py-spy's idle/active is the OS state at the instant of the dump: a thread sleeping in a loop is caught awake
    now and then. The same frames fold into one group whose label says who was in which state."""

    def dump(rank: int, state: str) -> native.Dump:
        frames = ("0x7f01 (libc.so.6)", "clock_nanosleep (libc.so.6)")
        return native.Dump(native.Target(rank, "here", 100 + rank), (native.NativeThread(rank, state, "Main", frames),))

    states = ["idle", "active", "active", "idle"]
    report = native.NativeReport("py-spy 0.4.3", tuple(dump(r, s) for r, s in enumerate(states)), (), 0.2)
    text = native.render_text(report)
    assert 'ranks 0,1,2,3 (4 processes on here, thread "Main", active on ranks 1,2; idle on ranks 0,3):' in text, text
    assert text.count("clock_nanosleep") == 1


def test_identical_native_stacks_fold_whatever_the_address_of_an_unnamed_frame() -> None:
    def dump(rank: int, address: str, innermost: str) -> native.Dump:
        thread = native.NativeThread(100 + rank, "idle", "MainThread", (f"{address} (libc.so.6)", innermost))
        return native.Dump(native.Target(rank, "here", 100 + rank), (thread,), seconds=0.2)

    report = native.NativeReport(
        "py-spy 0.4.3",
        (
            dump(0, "0x7f01", "clock_nanosleep (libc.so.6)"),
            dump(1, "0x7f99", "clock_nanosleep (libc.so.6)"),
            dump(3, "0x7f55", "recv (libc.so.6)"),
            native.Dump(native.Target(4, "here", 104), error="the process is gone (py-spy: No such process)"),
        ),
        (native.Target(2, "there", 7),),
        1.5,
    )
    text = native.render_text(report)
    assert (
        'ranks 0,1 (2 processes on here, thread "MainThread", idle):\n    0x... (libc.so.6)\n    clock_nanosleep'
        in text
    )
    assert 'rank 3 (here:103, thread "MainThread", tid 103, idle):\n    0x... (libc.so.6)\n    recv (libc.so.6)' in text
    assert "    rank 4 (here:104): the process is gone" in text
    assert "    rank 2 (there:7): on another host; run rascli --stacks --native on there" in text
    doc = native.as_json(report)
    assert [p["rank"] for p in doc["processes"]] == [0, 1, 3, 4] and doc["elsewhere"] == [
        {"rank": 2, "host": "there", "pid": 7}
    ]
    missing = native.render_text(native.NativeReport("", (), (), 0.0, missing_tool=True))
    assert missing.startswith("Native frames: py-spy is not installed (pip install py-spy")
