"""inprocess.elastic in a real 4-rank gloo job under inprocess.Wrapper: restore from memory after a kill -9, after
a commit cut by an exception on one rank, and after a hang (SIGSTOP, found by the mesh's PEER_HUNG): every survivor
resumes from the same (the most advanced) commit.

Run as a script, this file is one rank of the job (the workload); as a test module, it launches the job.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inprocess_jobs import diagnostics, reap

STEPS = 12
KILL = {"iteration": 0, "rank": 3, "step": 5}  # kill -9 before the collective of step 5 (last commit: step 4)
CUT = {"iteration": 1, "rank": 1, "commit": 8}  # rank 1's commit of step 8 raises half-way; the others commit it
HANG = {"iteration": 2, "rank": 2, "step": 10}  # SIGSTOP before the collective of step 11 (last commit: step 10)
#: The mesh's timers at half their defaults: PEER_HUNG after 5 s of silence instead of 10 (docs/operations.md §1).
TIMEOUT_FACTOR = "0.5"


# ---- the workload (one rank) ----------------------------------------------------------------------------------


class Marker:
    """A plain state value whose copy fails on cue: the fault in the middle of a commit."""

    def __init__(self) -> None:
        self.fail = False

    def __deepcopy__(self, memo: dict) -> Marker:
        if self.fail:
            wait_for_the_others_commit()  # they need no collective for it
            raise RuntimeError("injected fault inside commit()")
        return Marker()


def wait_for_the_others_commit() -> None:
    """(In the rank whose commit is cut) until every other live rank has written its commit of that step."""
    sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the polling helper
    from polling import wait_until

    out = json.loads(os.environ["ELASTIC_TEST_SCENARIO"])["out"]
    cut = ("commit", CUT["iteration"], CUT["commit"])

    def committed(rank: int) -> bool:
        with open(out.format(rank=rank)) as lines:
            for line in lines:
                try:
                    item = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if (item["event"], item.get("iteration"), item.get("step")) == cut:
                    return True
        return False

    others = [rank for rank in range(4) if rank not in (KILL["rank"], CUT["rank"])]
    wait_until(lambda: all(committed(rank) for rank in others), 60, 0.05, what="the other ranks' commit")


def workload() -> None:
    scenario = json.loads(os.environ["ELASTIC_TEST_SCENARIO"])
    initial_rank = int(os.environ["RANK"])
    out = open(scenario["out"].format(rank=initial_rank), "a", buffering=1)  # noqa: SIM115 - written until exit

    def emit(**fields: object) -> None:
        out.write(json.dumps(dict(fields, initial_rank=initial_rank, time=time.time())) + "\n")

    import torch
    import torch.distributed as dist

    import inprocess
    from inprocess.elastic import TorchState
    from inprocess_jobs import data_parallel_step, model_hash

    seconds = datetime.timedelta(seconds=1)
    app_store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        initial_rank == 0,
        timeout=60 * seconds,
        wait_for_workers=False,
    )
    torch.manual_seed(1000 + initial_rank)  # different initial weights on every rank: the first sync equalises
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = TorchState(model, optimizer, step=0, marker=Marker())
    state.register_reset_callbacks([lambda: emit(event="reset", world_size=dist.get_world_size())])

    @inprocess.Wrapper(
        store_kwargs={"port": scenario["wrapper_port"], "timeout": 60 * seconds},
        monitor_thread_interval=0.1 * seconds,
        monitor_process_interval=0.1 * seconds,
        progress_watchdog_interval=0.1 * seconds,
        heartbeat_interval=0.5 * seconds,
        heartbeat_timeout=20 * seconds,
        soft_timeout=30 * seconds,
        hard_timeout=40 * seconds,
        barrier_timeout=80 * seconds,
        completion_timeout=80 * seconds,
        last_call_wait=0.1 * seconds,
        termination_grace_time=0.5 * seconds,
        monitor_process_pidfile=scenario["pidfile"],
    )
    def train(call_wrapper: inprocess.CallWrapper) -> None:
        iteration = call_wrapper.iteration
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"pg{iteration}", app_store),
            rank=rank,
            world_size=world_size,
            timeout=120 * seconds,
        )
        outcome = state.sync()
        emit(
            event="synced",
            iteration=iteration,
            step=state.step,
            hash=model_hash(model),
            source=outcome.source,
            broadcast=outcome.broadcast,
            restored=outcome.restored,
            reset=outcome.reset,
            commits=outcome.commits,
        )
        while state.step < STEPS:
            if (iteration, initial_rank, state.step) == (KILL["iteration"], KILL["rank"], KILL["step"]):
                os.kill(os.getpid(), signal.SIGKILL)
            if (iteration, initial_rank, state.step) == (HANG["iteration"], HANG["rank"], HANG["step"]):
                emit(event="stopping", iteration=iteration, step=state.step)
                os.kill(os.getpid(), signal.SIGSTOP)
            data_parallel_step(model, optimizer, state.step, rank, world_size, features=32)
            state.step += 1
            if state.step % 2 == 0:
                state.marker.fail = (iteration, initial_rank, state.step) == (
                    CUT["iteration"],
                    CUT["rank"],
                    CUT["commit"],
                )
                state.commit()
                emit(event="commit", iteration=iteration, step=state.step, hash=model_hash(model))
        emit(event="done", iteration=iteration, step=state.step, hash=model_hash(model), world_size=world_size)
        dist.destroy_process_group()

    train()


# ---- the test -------------------------------------------------------------------------------------------------

sys.path.insert(0, str(Path(__file__).parent))


def start_job(directory: Path, world_size: int) -> list[subprocess.Popen]:
    from inprocess_jobs import REPOSITORY, free_ports

    master_port, wrapper_port = free_ports(2)
    scenario = {
        "out": str(directory / "rank{rank}.jsonl"),
        "pidfile": str(directory / "monitor{rank}.pid"),
        "wrapper_port": wrapper_port,
    }
    processes = []
    for rank in range(world_size):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
            ELASTIC_TEST_SCENARIO=json.dumps(scenario),
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
            TORCH_CPP_LOG_LEVEL="ERROR",
            TORCHRAS_TIMEOUT_FACTOR=TIMEOUT_FACTOR,
        )
        with open(directory / f"rank{rank}.stderr", "w") as log:  # the rank writes to its own copy
            processes.append(
                subprocess.Popen([sys.executable, __file__], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
    return processes


def read_events(directory: Path, rank: int) -> list[dict]:
    path = directory / f"rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def stop(processes: list[subprocess.Popen], directory: Path) -> None:
    reap(processes, directory, "monitor*.pid")


@pytest.mark.slow
def test_restore_from_memory_after_a_kill_a_commit_cut_by_an_exception_and_a_hang(tmp_path: Path) -> None:
    processes = start_job(tmp_path, 4)
    try:
        codes = []
        for rank in (0, 1, 3):
            try:
                codes.append(processes[rank].wait(240))
            except subprocess.TimeoutExpired:
                codes.append(None)
        assert codes == [0, 0, -signal.SIGKILL], diagnostics(tmp_path)
        # The stopped rank was left behind: still stopped (or ended by its own monitor process); never finished.
        assert processes[2].poll() in (None, -signal.SIGKILL, -signal.SIGTERM), diagnostics(tmp_path)
        events = {rank: read_events(tmp_path, rank) for rank in range(4)}

        def one(rank: int, event: str, iteration: int) -> dict:
            found = [item for item in events[rank] if item["event"] == event and item["iteration"] == iteration]
            assert len(found) == 1, (rank, event, iteration, diagnostics(tmp_path))
            return found[0]

        def commit_hash(rank: int, iteration: int, step: int) -> str:
            found = [
                item["hash"]
                for item in events[rank]
                if item["event"] == "commit" and item["iteration"] == iteration and item["step"] == step
            ]
            assert len(found) == 1, (rank, iteration, step, diagnostics(tmp_path))
            return found[0]

        # Iteration 0: different initial weights; the first sync broadcasts rank 0's (lowest rank, equal commits).
        first = [one(rank, "synced", 0) for rank in range(4)]
        assert {item["hash"] for item in first} == {first[0]["hash"]} and {item["source"] for item in first} == {0}
        assert all(item["broadcast"] and not item["restored"] for item in first)

        # Kill -9 of rank 3 at step 5: every survivor restored the commit of step 4 from memory. Every survivor held
        # the same commit, so nothing was broadcast; the reset callbacks saw the new world size.
        after_kill = [one(rank, "synced", 1) for rank in range(3)]
        step4 = commit_hash(0, 0, 4)
        for item in after_kill:
            assert (item["step"], item["hash"], item["restored"], item["reset"], item["broadcast"]) == (
                4,
                step4,
                True,
                True,
                False,
            ), item
        resets = [[item for item in events[rank] if item["event"] == "reset"] for rank in range(3)]
        assert [[item["world_size"] for item in found] for found in resets] == [[3, 3, 2], [3, 3, 2], [3, 3]], resets

        # Rank 1's commit of step 8 was cut: it still held step 6, the others step 8. The most advanced commit
        # wins: rank 0 sends it, every rank resumes at step 8 with the weights committed there.
        assert not [
            item for item in events[1] if item["event"] == "commit" and item["iteration"] == 1 and item["step"] == 8
        ]
        after_cut = [one(rank, "synced", 2) for rank in range(3)]
        step8 = commit_hash(0, 1, 8)
        assert commit_hash(2, 1, 8) == step8
        for item in after_cut:
            assert (item["step"], item["hash"], item["source"], item["broadcast"]) == (8, step8, 0, True), item
        assert after_cut[1]["restored"] and after_cut[1]["commits"] == after_cut[0]["commits"]

        # Rank 2 stopped before the collective of step 11: PEER_HUNG terminated it, and the two others restored
        # the commit of step 10 from memory (both held it: nothing broadcast) and finished at 2 ranks.
        assert [item["step"] for item in events[2] if item["event"] == "stopping"] == [10]
        after_hang = [one(rank, "synced", 3) for rank in range(2)]
        step10 = commit_hash(0, 2, 10)
        for item in after_hang:
            assert (item["step"], item["hash"], item["restored"], item["broadcast"]) == (10, step10, True, False), item
        done = [one(rank, "done", 3) for rank in range(2)]
        assert {(item["step"], item["hash"], item["world_size"]) for item in done} == {(STEPS, done[0]["hash"], 2)}
    finally:
        stop(processes, tmp_path)


if __name__ == "__main__":
    workload()
