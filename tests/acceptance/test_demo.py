"""The README's main job, run as a user runs it: ``rasd demo`` recovers from faults by itself.

Each test is one demo of 4 gloo processes under ``inprocess.Wrapper``, run by ``rasd launch`` as ``rasd demo``
starts it:

* a kill -9 healed back to 4 ranks with no command typed (issue 25): the survivors restart in place on 3 ranks,
  the launcher respawns the dead worker, and the replacement joins at a commit, with the model from the others'
  memory; with ``--model fsdp`` (FSDP2, ``fully_shard`` on a CPU device mesh: the sharded module rebuilt on 3
  ranks, then on 4) after a kill of rank 0. The same heal with torch's ``DistributedDataParallel`` (the README's
  ``kill:rank=2``) is the launcher's own test (tests/launch/test_launch_heal.py: a DDP job under ``rasd launch``,
  kill -9, respawned, admitted back at 4 ranks); here the demo's lines and status are what is added to it;
* ``--max-respawns 0`` (the job goes on smaller) with ``--model manual`` (hand-written all-reduces): kill -9 of
  initial rank 0 at step 20 (no rank is special: issue 10), then an exception on initial rank 1 at step 45;
* a skipped collective (one step under ``no_sync()`` on one rank of a DDP job), which wedges the job until
  COMM_STUCK restarts every rank.

The progress lines must show each restart and training going on, the demo must end with the right status, and
every line must be whole (no line interleaved with another's).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]

#: Every line the demo writes to its standard output; anything else is two lines run together, or a stray print.
LINES = [
    r"rasd demo: \d+ gloo processes train a small MLP .*Ctrl\+C stops it\.",
    r"step +\d+  world \(\d+ ranks, (DDP|FSDP2|hand-written all-reduces)\): loss \d+\.\d{4}",
    r"step +\d+  pair \d+(-\d+)?: mean loss \d+\.\d{4}",
    r"rank \d+: injecting (exception|kill|stop|skip|stall) at step \d+",
    r"restart \d+ after .*: \d+ ranks continue from step \d+, [\d.]+ s lost",
    r"joined as rank \d+ of \d+ at step \d+ \(the state came from the other ranks' memory\)",
]
RESTART = re.compile(r"^restart (\d+) after (.*): (\d+) ranks continue from step (\d+), [\d.]+ s lost$", re.MULTILINE)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def demo_command(*arguments: str) -> list[str]:
    """``rasd demo ARGUMENTS`` at 0.05 s a step (the ``rasd`` script is ``torchras.cli``)."""
    return [
        sys.executable,
        "-m",
        "torchras.cli",
        "demo",
        "--step-time",
        "0.05",
        "--addr",
        f"localhost:{free_port()}",
        *arguments,
    ]


def demo_environment(**extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
        **extra,
    )
    env.pop("TORCHRAS_LOG_LEVEL", None)
    return env


def assert_whole(out: str) -> None:
    broken = [line for line in out.splitlines() if not any(re.fullmatch(shape, line) for shape in LINES)]
    assert not broken, f"lines that are not whole demo lines: {broken}\n{out}"


def stop(demo: subprocess.Popen) -> None:
    """A demo that overran: Ctrl+C, then a second one (the launcher then kills its workers at once). Never SIGKILL
    to the launcher first: its workers would be left behind."""
    for _ in range(2):
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(10)
            except subprocess.TimeoutExpired:
                pass
    if demo.poll() is None:
        demo.kill()
        demo.wait()


def run_demo(*arguments: str, env: dict[str, str] | None = None) -> str:
    """``rasd demo ARGUMENTS`` to its end (``env``: more environment); its standard output once it ended
    successfully."""
    demo = subprocess.Popen(
        demo_command(*arguments),
        env=demo_environment(**(env or {})),
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = demo.communicate(timeout=400)
    finally:
        stop(demo)
    assert demo.returncode == 0, f"{out}\n{err[-3000:]}"
    assert_whole(out)
    return out


def run_demo_until_healed(tmp_path: Path, *arguments: str) -> tuple[str, str, int]:
    """``rasd demo ARGUMENTS`` (no --steps: it trains until stopped) until, after a replacement joined, the world
    trained a step at 4 ranks; then Ctrl+C, as a user stops it. Its standard output, its standard error and its
    status. Watched, not timed: however long the replacement takes to start on a loaded machine."""
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as stderr:
        demo = subprocess.Popen(
            demo_command(*arguments),
            env=demo_environment(),
            cwd=REPOSITORY,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        lines: list[str] = []
        overrun = threading.Timer(400, stop, [demo])  # a demo that never heals ends the loop below (EOF)
        overrun.start()
        try:
            assert demo.stdout is not None
            joined = False
            for line in demo.stdout:
                lines.append(line)
                joined = joined or line.startswith("joined as rank")
                if joined and re.match(r"step +\d+  world \(4 ranks, ", line):
                    break
            demo.send_signal(signal.SIGINT)  # Ctrl+C
            rest, _ = demo.communicate(timeout=120)
        finally:
            overrun.cancel()
            stop(demo)
    out = "".join(lines) + rest
    assert_whole(out)
    return out, errors.read_text(), demo.returncode


@pytest.mark.slow
def test_a_kill_of_rank_0_is_healed_back_to_4_ranks_with_no_command_typed(tmp_path):
    model, killed, name = "fsdp", 0, "FSDP2"
    out, err, status = run_demo_until_healed(tmp_path, "--model", model, "--inject", f"kill:rank={killed},step=20")
    restarts = RESTART.findall(out)
    assert [(count, world) for count, _, world, _ in restarts[:2]] == [("1", "3"), ("2", "4")], out
    assert restarts[0][1].startswith(f"PEER_DEAD of rank {killed}"), out
    assert int(restarts[0][3]) == 10, out  # the survivors resumed from the last commit before the kill
    assert restarts[1][1].startswith("JOIN_WAITING"), out  # the replacement, admitted at a commit
    assert re.search(r"^joined as rank 3 of 4 at step \d+ \(the state came from the other ranks' memory\)$", out, re.M)
    assert re.search(rf"^step +\d+  world \(3 ranks, {name}\): loss ", out, re.MULTILINE), out
    assert out.count("injecting kill") == 1, out  # the replacement never kills itself again
    # The launcher's event lines (stderr): the kill, the respawn, the admission, the world back to 4, the Ctrl+C.
    assert re.search(
        rf"rasd launch: worker {killed} \(pid \d+, rank {killed}\) ended: killed by SIGKILL; respawning", err
    )
    assert re.search(rf"rasd launch: worker {killed} respawned: pid \d+", err), err
    assert re.search(rf"rasd launch: worker {killed} \(pid \d+\) joined the job as rank 3 of 4", err), err
    assert "rasd launch: the job trains at 4 rank(s) now" in err, err
    assert "rasd launch: received SIGINT" in err, err
    assert status == 128 + signal.SIGINT, f"{out}\n{err[-3000:]}"


@pytest.mark.slow
def test_without_respawns_the_manual_model_restarts_in_place_after_a_kill_of_rank_0_and_an_exception():
    """One demo for two: ``--max-respawns 0`` and ``--model manual`` (each restart rebuilds no torch wrapper; the
    gradients are all-reduced by hand)."""
    out = run_demo(
        "--model",
        "manual",
        "--max-respawns",
        "0",
        "--steps",
        "60",
        "--inject",
        "kill:rank=0,step=20",
        "--inject",
        "exception:rank=1,step=45",
    )
    assert "all-reducing the gradients by hand" in out, out
    restarts = RESTART.findall(out)
    assert [(count, world) for count, _, world, _ in restarts] == [("1", "3"), ("2", "3")], out
    assert restarts[0][1].startswith("PEER_DEAD of rank 0"), out
    assert restarts[1][1].startswith("RuntimeError on rank 1: injected exception"), out
    # Resumed from the last in-memory commit (every 10 steps) before each fault, never from step 0.
    assert [int(step) for *_, step in restarts] == [10, 40], out
    assert re.search(r"^step    60  world \(3 ranks, hand-written all-reduces\): loss ", out, re.MULTILINE), out


@pytest.mark.slow
def test_a_rank_that_skips_one_ddp_all_reduce_wedges_the_job_until_comm_stuck_restarts_every_rank():
    # The stuck limit at 6 s instead of 20 (as tests/acceptance/test_user_jobs.py): the verdict is the same, sooner.
    out = run_demo("--steps", "40", "--inject", "skip:rank=1,step=25", env={"TORCHRAS_STUCK_LIMIT": "6"})
    assert "train a small MLP with DistributedDataParallel" in out, out
    restarts = RESTART.findall(out)
    assert [(count, world) for count, _, world, _ in restarts] == [("1", "4")], out
    assert restarts[0][1].startswith("COMM_STUCK on communicator "), out
    assert int(restarts[0][3]) == 20, out
    assert re.search(r"^step    40  world \(4 ranks, DDP\): loss ", out, re.MULTILINE), out


@pytest.mark.slow
def test_a_stalled_rank_is_shown_where_it_waits_by_stacks_the_verdict_the_restart_and_the_monitor():
    """Issue 28's scenario: ``rasd demo --inject stall:rank=2,step=30``. While rank 2 waits in the demo's stall
    (``time.sleep`` in ``_inject``), ``rascli --stacks`` shows it there and the other ranks together, inside the
    backward pass whose all-reduce waits for rank 2; then the restart line and the COMM_STUCK event of
    ``rascli -m`` name the same frame."""
    port = free_port()
    command = demo_command("--steps", "45", "--inject", "stall:rank=2,step=30")
    command[command.index("--addr") + 1] = f"localhost:{port}"
    env = demo_environment(TORCHRAS_STUCK_LIMIT="6")
    rascli = [sys.executable, "-m", "rascli.main", "-p", str(port), "--no-color"]
    demo = subprocess.Popen(command, env=env, cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = None
    try:
        assert demo.stdout is not None
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("step ") and monitor is None:
                monitor = subprocess.Popen(
                    [*rascli, "-m"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
            if line.startswith("rank 2: injecting stall"):
                break
        else:
            raise AssertionError("".join(lines))
        stacks = ""
        for _ in range(30):  # rank 2 reaches time.sleep right after the line; the others reach the all-reduce
            stacks = subprocess.run([*rascli, "--stacks"], env=env, capture_output=True, text=True, timeout=60).stdout
            if "_inject)" in stacks and "ranks 0,1,3 (" in stacks and "collective: not in" in stacks:
                break
        stalled = re.search(r"^rank 2 \(.*\n((?:    .*\n)+)", stacks, re.MULTILINE)
        assert stalled is not None and re.search(r"demo_worker\.py:(\d+) \(_inject\)\n$", stalled.group(1)), stacks
        frame = re.search(r"demo_worker\.py:(\d+) \(_inject\)\n$", stalled.group(1)).group(0).strip()  # type: ignore[union-attr]
        others = re.search(r"^ranks 0,1,3 \(.*\n((?:    .*\n)+)", stacks, re.MULTILINE)
        assert others is not None and "(backward)" in others.group(1), stacks
        # Which collective: DDP's all-reduce runs in C++, so the frames cannot say; the counters do (issue 42).
        inside = re.search(r"collective: inside AllReduce operation (\d+) of communicator (\w+) ", others.group(1))
        assert inside is not None, stacks
        number, comm = inside.groups()
        assert (
            f"collective: not in AllReduce operation {number} of communicator {comm}: never launched it, while ranks "
            "0,1,3 are inside it" in stalled.group(1)
        ), stacks
        out, err = demo.communicate(timeout=400)
        out = "".join(lines) + out
        assert demo.returncode == 0, f"{out}\n{err[-3000:]}"
        (restart,) = [m for m in RESTART.finditer(out) if m.group(2).startswith("COMM_STUCK")]
        assert "rank 2 in " in restart.group(2) and frame in restart.group(2), (frame, out)
        assert monitor is not None
        monitor.terminate()
        events, _ = monitor.communicate(timeout=30)
        stuck = [e for e in events.splitlines() if "] COMM_STUCK: " in e]
        assert stuck and all(frame in e for e in stuck if "rank 2 behind" in e), (frame, events)
        assert any("rank 2 behind" in e for e in stuck), events
    finally:
        stop(demo)
        if monitor is not None and monitor.poll() is None:
            monitor.kill()
