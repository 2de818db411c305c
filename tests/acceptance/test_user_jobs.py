"""A user's DDP and FSDP2 script (``user_job.py``) under plain ``torchrun``, 4 gloo ranks, changed only by wrapping
its training function in ``inprocess.Wrapper``:

- rank 0 writing a checkpoint for 10 s (``torch.save``, again and again; DDP) or evaluating an unsharded copy of the
  weights for 10 s (FSDP2), more than two idle limits, while the others wait in ``dist.barrier()``, at the default
  limits, is SLOW in the report (rank 0 working), never COMM_STUCK: no restart (issue 39, "first, do no harm");
- a rank blocked in one long call (``time.sleep``, ``queue.Queue.get``, a socket read) is named in the report while
  it is blocked (COMM_STUCK: the rank behind), the restart that verdict causes reaches it, and the job finishes all
  its steps at full size in the same processes: nobody is killed, torchrun never tears the job down;
- the report then counts every collective the restarted job performed, DDP's buckets and FSDP2's gathers included,
  equal to what torch's own records say (the group's sequence number, the Flight Recorder's entries by name).

Deadlines are generous (2 shared cores); speed is measured in bench/time_lost.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launching import free_base_port, free_port
from polling import wait_for, wait_until
from ras_client import ask, json_status

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("user_job.py")
REPOSITORY = Path(__file__).resolve().parents[2]
WORLD = 4
#: The report's names for the Flight Recorder's gloo ops in a DDP or FSDP2 job (gloo runs reduce_scatter as an
#: all-reduce and records it so; the hooks see FSDP2's reduce_scatter_tensor call itself).
FR_NAME = {"gloo:all_reduce": "AllReduce", "gloo:broadcast": "Broadcast", "gloo:all_gather": "AllGather"}


class Job:
    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.out = tmp / "out"
        self.out.mkdir()
        self.port = free_port()
        master = free_base_port()
        self.log = open(tmp / "torchrun.log", "w")  # noqa: SIM115 - closed in stop()
        environ = dict(os.environ, TORCHRAS_ADDR=f"127.0.0.1:{self.port}", PYTHONUNBUFFERED="1", **(env or {}))
        environ["PYTHONPATH"] = os.pathsep.join([str(REPOSITORY), environ.get("PYTHONPATH", "")])
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}"]
        cmd += ["--master-addr=127.0.0.1", f"--master-port={master}", str(SCRIPT), "--out", str(self.out), *args]
        self.proc = subprocess.Popen(
            cmd, env=environ, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.tmp = tmp

    def results(self, deadline: float) -> dict[int, dict]:
        """Every rank's results, once each has written them (whole: user_job.py renames a finished file)."""

        def finished() -> dict[int, Path] | None:
            done = {int(p.stem[4:]): p for p in self.out.glob("rank*.json")}
            if len(done) == WORLD:
                return done
            assert self.proc.poll() is None, f"torchrun ended with {self.proc.returncode}:\n{self.logs()}"
            return None

        done = wait_until(finished, deadline, 0.5, what=lambda: f"the job to finish:\n{self.logs()}")
        return {r: json.loads(p.read_text()) for r, p in done.items()}

    def logs(self) -> str:
        self.log.flush()
        return (self.tmp / "torchrun.log").read_text()[-6000:]

    def report(self) -> dict:
        return json_status(self.port)

    def stop(self) -> int | None:
        (self.out / "release").touch()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
            return None
        finally:
            self.log.close()


def _world_comm(report: dict) -> dict:
    comms = [c for c in report["communicators"] if c["size"] == WORLD]
    assert comms, report
    return comms[-1]


def _check_counts(job: Job, results: dict[int, dict]) -> None:
    """Every rank's counts in the report equal what torch recorded; DDP's / FSDP2's own collectives included."""
    expected = {rank: res["seq"] for rank, res in results.items()}

    def counted(comm: dict) -> bool:
        totals = {r["rank"]: sum(r["collective_counts"].values()) for r in comm["ranks"]}
        settled = all(r["collective_counts"] == r["completed_counts"] for r in comm["ranks"])
        return settled and totals == expected

    # A quiet job's records are read at the next gather or two. Past the deadline, the asserts below say what
    # differs.
    try:
        comm = wait_for(lambda: _world_comm(job.report()), counted, 20, 1.0, what="the counts to settle")
    except AssertionError:
        comm = _world_comm(job.report())
    for rank_doc in comm["ranks"]:
        res = results[rank_doc["rank"]]
        counts = rank_doc["collective_counts"]
        assert sum(counts.values()) == res["seq"], (rank_doc, res)  # every collective, none twice
        assert counts == rank_doc["completed_counts"], rank_doc  # the job is idle: all completed
        recorded: dict[str, int] = {}
        for name, n in res["fr_names"].items():
            recorded[FR_NAME[name]] = recorded.get(FR_NAME[name], 0) + n
        # The hooks type FSDP2's reduce_scatter_tensor as ReduceScatter where gloo records an all_reduce.
        reported = {op: n for op, n in counts.items() if n}
        if "ReduceScatter" in reported:
            reported["AllReduce"] = reported.get("AllReduce", 0) + reported.pop("ReduceScatter")
        assert reported == recorded, (rank_doc["rank"], counts, res)
        assert counts["AllReduce"] + counts["ReduceScatter"] >= res["steps"], counts  # the gradients of each step


@pytest.mark.parametrize(("model", "kind", "phase"), [("ddp", "sleep", "checkpoint"), ("fsdp", "queue", "evaluate")])
def test_a_rank_blocked_in_a_call_is_named_and_the_job_heals_in_place(
    tmp_path: Path, model: str, kind: str, phase: str
) -> None:
    """The issue's job: named while blocked, healed in place, and, once done, every collective of the restarted
    groups counted (the report equals torch's records; DDP's buckets and FSDP2's gathers included). A socket read
    and the other blocking calls: tests/inprocess/test_wake_jobs.py. First, at step 8, a healthy slow phase on rank
    0 while the others wait in a barrier, more than two idle limits long: a checkpoint (``torch.save`` for 10 s,
    DDP) or an evaluation (forward passes of an unsharded copy for 10 s, FSDP2): SLOW, and no restart for it.
    Default limits throughout."""
    args = ("--model", model, "--steps", "60", "--block", kind, "--block-rank", "2", "--block-step", "15")
    args += (f"--{phase}-step", "8", f"--{phase}-seconds", "10")
    started, ended = {
        "checkpoint": ("checkpointing", "checkpoint written"),
        "evaluate": ("evaluating", "evaluation done"),
    }[phase]
    job = Job(tmp_path, *args)
    try:
        slow = wait_for(
            lambda: _world_comm(job.report()).get("stuck") if started in job.logs() else None,
            lambda stuck: stuck is not None and stuck["state"] == "SLOW",
            120,
            0.5,
            what=lambda: f"the report to show the {phase} phase as SLOW:\n{job.logs()}",
            retry_on=(AssertionError, OSError, ValueError),
        )
        assert slow["global_ranks_behind"] == [0] and slow["ranks_working"] == [0], slow
        wait_until(lambda: ended in job.logs(), 120, 0.5, what=f"the {phase} phase to end")
        assert "COMM_STUCK" not in job.logs(), job.logs()

        def stuck_now() -> dict | None:
            assert not list(job.out.glob("rank*.json")), f"the job ended before rank 2 was named:\n{job.logs()}"
            try:
                return _world_comm(job.report()).get("stuck")
            except (AssertionError, OSError, ValueError):
                return None  # no report yet, or none with the world's communicator in it

        named = wait_for(
            stuck_now,
            lambda stuck: stuck is not None and stuck["global_ranks_behind"] == [2],
            150,
            0.5,
            what=lambda: f"the report to name rank 2 as behind:\n{job.logs()}",
        )
        # DDP's first bucket all-reduce, or FSDP2's first all-gather of the forward pass: the others wait inside it.
        assert named["op"] == ("AllReduce" if model == "ddp" else "AllGather"), named
        assert named["global_ranks_inside"] == [0, 1, 3], named
        # Where rank 2 is: the verdict carries its position from the sweep that made it (issue 28), and STACKS,
        # asked while it is blocked, folds the others together and shows rank 2 in user_job.py's block().
        (where,) = named["positions_behind"]
        assert where["rank"] == 2 and any(f["function"] == "block" for f in where["frames"]), where
        stacks = ask(job.port, b"STACKS\n")
        blocked = stacks.split("\nrank 2 (", 1)[1].split("\n\n", 1)[0]
        assert re.search(r"user_job\.py:\d+ \(block\)", blocked), stacks
        assert "ranks 0,1,3 (3 processes" in stacks, stacks
        # DIAGNOSTICS reads each training process's torch (imported, CUDA never started from the RAS thread).
        diag = ask(job.port, b"DIAGNOSTICS\n")
        assert f"NCCL DIAG [OK]   torch version: {torch.__version__} consistent across 4 ranks\n" in diag, diag
        assert "NCCL DIAG [INFO] GPU inventory: no CUDA device: a CPU-only torch build across 4 ranks\n" in diag, diag
        results = job.results(deadline=150)
        assert {r["steps"] for r in results.values()} == {60}, results
        assert {r["world"] for r in results.values()} == {WORLD}, results
        assert all(r["iteration"] >= 1 for r in results.values()), results  # restarted in place ...
        assert {r["iteration"] for r in results.values()} == {1}, results  # once, for the wedge: not for the phase
        logs = job.logs()
        assert "blocking in " + kind in logs
        assert "hard timeout" not in logs.lower() and "SIGKILL" not in logs, logs  # ... nobody killed
        _check_counts(job, results)
        text = ask(job.port, b"STATUS\n")
        assert "Collectives counted from process-group records (sequence numbers, native Flight Recorder)" in text
        # The restart came from the mesh's COMM_STUCK verdict (not a local timeout), and it reached rank 2 in its
        # blocking call through the wake: nobody was left behind.
        assert re.search(r"Last restart: COMM_STUCK .*rank 2 behind.*; no rank terminated", text), text
        # The restart's log line names the same frame as the verdict.
        assert re.search(r"COMM_STUCK .*rank 2 behind.*rank 2 in .*user_job\.py:\d+ \(block\)", logs), logs
    finally:
        assert job.stop() == 0, job.logs()
