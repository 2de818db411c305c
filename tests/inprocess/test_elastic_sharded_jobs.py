"""A user's FSDP2 script (``fsdp_job.py``, written from the README's pattern: ``ShardedState`` with a build function)
recovers in place, its sharded state from the ranks' memory or, past the redundancy, from disk:

- under plain ``torchrun``, a rank stalled in a call (COMM_STUCK): one restart, the world stays 4, the state
  restored is bit for bit the commit made before the fault, and the final parameters are those of the training
  without a fault (computed in one process, ``fsdp_job.trained_alone``: the same up to the order of sums);
- under ``rasd launch``, a kill -9 (FSDP2 + TP on a 2-D mesh, rank 0): the survivors reshard the
  commit to 3 ranks from memory, reading the blobs of the processes beside them in place (no byte over the
  network); a second kill during the recovery (rank 1, rank 0's guard) still restores from memory, the restore
  having topped the copies up; the replacements join and the commit is resharded to 4 from memory, the job
  finishes at 4 with the parameters of the training without a fault;
- under ``rasd launch``, two neighbouring ranks killed at once with k = 1, the last rank among them (rank 2's blob
  and its only copy, on rank 3, are gone; rank 3's copy is on rank 0, round the ring): the survivors load the disk
  checkpoint (``checkpoint_dir``), then grow back to 4; in this job no process can map another's blobs, so the
  newcomer's restore fetches its bytes over the network.

Between them the kills take every rank position of the world of 4 (0; 1 during the recovery; 2 and 3 at once);
which positions any k losses may take and still restore from memory, before and after the restore's top-up, is
``test_elastic_placement.py``'s property. Each test checks that no process of the job is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))

from launching import Launch, free_base_port, job_processes
from polling import wait_until

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).with_name("fsdp_job.py"))
REPOSITORY = Path(__file__).resolve().parents[2]
STEPS = ["--steps", "21"]
FAULT_STEP = 14  # before step 14's forward pass: the last commit is step 12 (every 3 steps)


def events(out: Path) -> dict[str, list[dict]]:
    return {path.stem: [json.loads(line) for line in path.read_text().splitlines()] for path in out.glob("*.jsonl")}


def torchrun(tmp_path: Path, name: str, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path / name
    out.mkdir()
    run_id = f"fsdp-{uuid.uuid4().hex[:8]}"
    environ = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONUNBUFFERED="1")
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", f"--rdzv-id={run_id}"]
    command += ["--master-addr=127.0.0.1", f"--master-port={free_base_port()}", JOB, "--out", str(out), *args]
    with open(tmp_path / f"{name}.log", "w") as log:
        try:
            done = subprocess.run(command, env=environ, stdout=log, stderr=subprocess.STDOUT, timeout=300)
        finally:
            wait_until(lambda: not job_processes(run_id), 30, 0.5, what=lambda: f"left: {job_processes(run_id)}")
    assert done.returncode == 0, (tmp_path / f"{name}.log").read_text()[-5000:]
    return out, done


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    """The final parameters of the same training in one process (``fsdp_job.trained_alone``): what a run without a
    fault computes, up to the order of floating-point sums (7e-8 apart after 21 steps), in milliseconds."""
    sys.path.insert(0, str(Path(JOB).parent))
    import fsdp_job

    return fsdp_job.trained_alone(int(STEPS[1]))


def committed(lines: list[dict], step: int) -> str:
    """The digest of the full parameters that these events' commit of ``step`` recorded (before any fault)."""
    (digest,) = {item["digest"] for item in lines if item["event"] == "commit" and item["step"] == step}
    return digest


def assert_final(out: Path, reference: dict[str, torch.Tensor]) -> None:
    final = torch.load(out / "final.pt")
    assert sorted(final) == sorted(reference)
    for key, value in reference.items():
        torch.testing.assert_close(final[key], value, rtol=1e-4, atol=1e-6)


def syncs(lines: list[dict]) -> list[dict]:
    return [item for item in lines if item["event"] == "sync"]


def test_torchrun_a_stalled_rank_restarts_once_from_memory(tmp_path: Path, reference: dict) -> None:
    out, _ = torchrun(tmp_path, "out", *STEPS, "--fault", f"stall:2:{FAULT_STEP}")
    found = events(out)
    assert sorted(found) == ["rank0", "rank1", "rank2", "rank3"], found
    for name, lines in found.items():
        restored = syncs(lines)[1:]
        assert len(restored) == 1, (name, lines)  # one restart
        (sync,) = restored
        assert sync["source"] == "memory" and sync["world"] == 4 and sync["step"] == FAULT_STEP - 2, sync
        assert sync["digest"] == committed(lines, FAULT_STEP - 2), (sync, lines)  # bit for bit what was committed
        assert lines[-1]["event"] == "done", lines[-1]
    assert len({lines[-1]["digest"] for lines in found.values()}) == 1, found
    assert_final(out, reference)


@pytest.mark.parametrize(("tp", "victim"), [(True, 0)], ids=["fsdp2+tp-rank0"])
def test_rasd_launch_kill_reshards_to_three_and_back_to_four_from_memory(
    tmp_path: Path, reference: dict, tp: bool, victim: int
) -> None:
    """FSDP2 + TP on a (2, 2) mesh with rank 0 killed: the survivors train on as FSDP2 alone at 3 ranks (2 does not
    divide 3: the build function's choice) and on the 2-D mesh again at 4, both from memory, to the parameters of
    the run without a fault (TP and 3 ranks sum in another order: compared within tolerance). Then, during the
    recovery (after the restore, before the next commit), rank 1 is killed too: it was rank 0's guard, the only
    other holder of rank 0's blob, so the state survives only because the restore topped the copies up
    (``placement.top_up``); the restore after it is again from memory, at the same step. FSDP2 alone at 4 restores
    from memory in the stalled-rank test above, to the exact digest (``tp=False`` runs this kill on FSDP2 alone: one
    parameter set here, for the suite's time)."""
    out = tmp_path / "out"
    out.mkdir()
    faults = ["--fault", f"kill:{victim}:{FAULT_STEP}", "--fault", f"kill:{victim + 1}:{FAULT_STEP - 1}:1"]
    argv = ["--nproc-per-node", "4", JOB, "--out", str(out), *STEPS, *faults]
    launch = Launch(tmp_path, *argv, "--min-world", "4", *(["--tp"] if tp else []))
    try:
        assert launch.wait(300) == 0, launch.tail()
        launch.assert_nothing_left()
    finally:
        launch.close()
    found = events(out)
    for rank in (victim + 1, victim + 2, victim + 3):
        shrunk = syncs(found[f"rank{rank}"])[1]  # the first restart: the kill
        assert shrunk["source"] == "memory" and shrunk["world"] == 3 and shrunk["step"] == FAULT_STEP - 2, shrunk
        assert shrunk["fetched"] == 0, shrunk  # one machine: every byte read in place
        assert shrunk["digest"] == committed(found[f"rank{rank}"], FAULT_STEP - 2), shrunk
    assert sum(syncs(found[f"rank{rank}"])[1]["mapped"] for rank in (1, 2, 3)) > 0  # the dead rank's blob, in place
    survivors = [found[f"rank{rank}"] for rank in (victim + 2, victim + 3)]
    joiners = [lines for name, lines in found.items() if name.startswith("joiner")]
    for lines in survivors:
        again = syncs(lines)[2]  # the second kill, before any commit since the restore: the same commit, in memory
        assert again["source"] == "memory" and again["step"] == FAULT_STEP - 2, again
        last = syncs(lines)[-1]
        assert last["source"] == "memory" and last["world"] == 4, last
    assert joiners and all(sync["source"] == "memory" for lines in joiners for sync in syncs(lines)), joiners
    assert any(sync["mapped"] > 0 and sync["fetched"] == 0 for lines in joiners for sync in syncs(lines)), joiners
    digests = {lines[-1]["digest"] for lines in [*survivors, *joiners]}
    assert len(digests) == 1 and all(lines[-1]["event"] == "done" for lines in [*survivors, *joiners]), found
    assert {lines[-1]["world"] for lines in [*survivors, *joiners]} == {4}, found
    assert_final(out, reference)


def test_rasd_launch_two_neighbours_killed_with_k_1_take_the_disk_path(tmp_path: Path, reference: dict) -> None:
    out = tmp_path / "out"
    out.mkdir()
    faults = ["--fault", f"kill:2:{FAULT_STEP}", "--fault", f"kill:3:{FAULT_STEP}"]
    argv = ["--nproc-per-node", "4", JOB, "--out", str(out), *STEPS, *faults, "--no-map"]
    launch = Launch(tmp_path, *argv, "--min-world", "4", "--checkpoint-dir", str(tmp_path / "checkpoints"))
    try:
        assert launch.wait(300) == 0, launch.tail()
        launch.assert_nothing_left()
    finally:
        launch.close()
    found = events(out)
    (shrunk,) = [sync for sync in syncs(found["rank0"]) if sync["iteration"] > 0 and sync["world"] < 4]
    assert shrunk["source"] == "disk" and shrunk["world"] in (2, 3) and shrunk["step"] == FAULT_STEP - 2, shrunk
    assert shrunk["digest"] == committed(found["rank0"], FAULT_STEP - 2), shrunk
    assert "the memory lost the blobs of rank(s) [2]" in launch.err() + launch.out(), launch.tail()
    finished = [lines[-1] for lines in found.values() if lines[-1]["event"] == "done"]
    assert len(finished) == 4 and {item["world"] for item in finished} == {4}, found
    joined = [sync for name, lines in found.items() if name.startswith("joiner") for sync in syncs(lines)]
    assert joined and all(sync["source"] == "memory" and sync["mapped"] == 0 for sync in joined), joined
    assert any(sync["fetched"] > 0 for sync in joined), joined  # a newcomer holds nothing: it fetched by network
    assert_final(out, reference)
