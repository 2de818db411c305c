"""A kill -9 healed back to full size: ``rasd launch`` against a whole-job restart by torchrun, in one run.

4 gloo ranks on the CPU train a small MLP with torch's ``DistributedDataParallel`` (``tests/launch/heal_job.py``, a
user-shaped script: 50 ms steps, a commit every 5 steps). Initial rank 2 kills itself (SIGKILL) before step 44,
3 steps after a commit, about 2 s into steady training. Measured from its clock just before the kill, on the
workers' own records:

    (a) survivors train   every rank of the first world after the kill has completed a step in it
    (b) back to 4         every rank of the first 4-rank world after the kill has completed a step in it
    redone                steps trained again: the step at the kill minus the step the job resumed from

Systems, every one in this same run:

    rasd launch    ``rasd launch --nproc-per-node 4``; the script wraps its training in this repository's
                   ``inprocess.Wrapper`` with ``inprocess.elastic.TorchState`` (state in memory, nothing on disk):
                   the survivors restart in place, the launcher respawns the dead worker, which joins at the
                   next commit and receives the model by ``state.sync()``
    torchrun       ``torchrun --standalone --nproc-per-node 4 --max-restarts 1``, the same script without a
                   Wrapper: rank 0 saves a ``torch.save`` checkpoint at every commit, torchrun ends the three
                   survivors and starts 4 new processes, which load it
    nvrx           nvidia-resiliency-ext 0.4.1's ``inprocess.Wrapper`` under the same torchrun command (a venv
                   made as bench/time_lost.py makes it, sharing this venv's torch), with the same checkpoint:
                   torchrun still ends every worker when one exits, so its Wrapper cannot keep the survivors

It also times ``python -c "import torch"`` in the same run: issue 25's target for (b) is that plus 5 s.

    .venv/bin/python bench/heal.py                 # every system, 2 samples each: about 3 min on 2 cores
    .venv/bin/python bench/heal.py --samples 1 --only torchras

Prints a table, then, as its last line, one JSON object: ``{system}_{figure}_s`` (medians), ``import_torch_s``.

``--group`` (issue 40) measures the other rows instead: scripts that know nothing of torchras, restarted as a group.
A plain DDP script (``tests/launch/plain_ddp_job.py``, 4 gloo ranks, a ``torch.save`` checkpoint every 5 steps)
and a PyTorch Lightning script (``tests/launch/lightning_job.py``, ``strategy="ddp"`` on the CPU, 2 ranks,
``ModelCheckpoint(save_last=True)``, ``fit(ckpt_path="last")``); rank 1 is killed (SIGKILL) or wedged (blocks in
``time.sleep``) in the first attempt; under ``rasd launch --max-restarts 2`` and ``torchrun --standalone
--max-restarts 2``, the same options, in the same run. The figure: seconds from the fault (the rank's own clock just
before it) to training again (every rank of a later attempt has completed a step), or ``-`` with what happened when
the job did not train again within ``GROUP_CAP_S`` of the fault (a wedge under torchrun waits for gloo's timeout,
30 minutes).

    .venv/bin/python bench/heal.py --group --samples 1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
JOB = REPOSITORY / "tests" / "launch" / "heal_job.py"
WORLD = 4
KILL_RANK, KILL_STEP = 2, 43
AFTER = 10  # steps at full size after (b) before the job is told to finish
CAP_S = 180.0
SYSTEMS = ("torchras", "torchrun", "nvrx")


@dataclass
class Sample:
    survivors_s: float | None
    full_s: float | None
    redone: int | None
    replacement_start_s: float | None  # torchras: the replacement's interpreter started, after the kill
    replacement_imported_s: float | None  # ... it had imported torch
    replacement_synced_s: float | None  # ... it was admitted and had the model (state.sync() returned)
    checkpoint_read: bool
    world_after: int | None
    note: str = ""


def command(system: str, out: Path, nvrx_python: str | None) -> list[str]:
    job = [str(JOB), "--out", str(out), "--kill", f"{KILL_RANK}:{KILL_STEP}", "--steps", str(KILL_STEP + 10)]
    job += ["--step-time", "0.05", "--commit-every", "5"]
    if system == "torchras":
        return [sys.executable, "-m", "torchras.cli", "launch", f"--nproc-per-node={WORLD}", *job]
    python = nvrx_python if system == "nvrx" else sys.executable
    assert python is not None
    launcher = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}", "--max-restarts=1"]
    wrapper = "nvrx" if system == "nvrx" else "none"
    return [*launcher, *job, "--wrapper", wrapper, "--checkpoint", str(out / "checkpoint.pt")]


def records(out: Path) -> list[dict]:
    found: list[dict] = []
    for path in out.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                pass  # a line being written
    return sorted(found, key=lambda item: item["time"])


def worlds_after(found: list[dict], since: float) -> list[tuple[float, int]]:
    """(time every rank of it had completed a step, its size) for each world (iteration) that trained after
    ``since``, in order."""
    firsts: dict[tuple[int, int], dict[int, float]] = {}
    for item in found:
        if item["event"] == "step" and item["time"] > since:
            firsts.setdefault((item["iteration"], item["world"]), {}).setdefault(item["pid"], item["time"])
    complete = [(max(by_pid.values()), world) for (_, world), by_pid in firsts.items() if len(by_pid) >= world]
    return sorted(complete)


def measure(found: list[dict]) -> Sample | None:
    kills = [item for item in found if item["event"] == "killing" and item.get("reason") != "die"]
    if not kills:
        return None
    killed = kills[0]["time"]
    worlds = worlds_after(found, killed)
    survivors = worlds[0][0] - killed if worlds else None
    full = next((at - killed for at, world in worlds if world == WORLD), None)
    synced = [item for item in found if item["event"] == "synced" and item["time"] > killed]
    redone = (kills[0]["step"] - synced[0]["step"]) if synced else None
    starts = [item for item in found if item["event"] == "start" and item.get("replacement")]
    started = starts[0]["started"] - killed if starts else None
    imported = starts[0]["time"] - killed if starts else None
    pid = starts[0]["pid"] if starts else None
    joined = [item["time"] - killed for item in found if item["event"] == "synced" and item["pid"] == pid]
    return Sample(
        survivors_s=survivors,
        full_s=full,
        redone=redone,
        replacement_start_s=started,
        replacement_imported_s=imported,
        replacement_synced_s=joined[0] if joined else None,
        checkpoint_read=any(item["event"] == "loaded" for item in found),
        world_after=worlds[0][1] if worlds else None,
    )


def run(system: str, nvrx_python: str | None, folder: Path) -> Sample:
    out = folder / system
    out.mkdir(parents=True)
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
    with open(out / "launcher.log", "wb") as log:
        process = subprocess.Popen(
            command(system, out, nvrx_python), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + CAP_S
    sample = None
    try:
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
            found = records(out)
            sample = measure(found)
            if sample is not None and sample.full_s is not None:
                last = max((item["step"] for item in found if item["event"] == "step"), default=0)
                if last >= KILL_STEP + AFTER:
                    break
        (out / "finish").touch()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    sample = measure(records(out))
    if sample is None:
        tail = (out / "launcher.log").read_text(errors="replace")[-1500:]
        note = f"no kill recorded; launcher exited {process.returncode}: {tail}"
        return Sample(None, None, None, None, None, None, False, None, note=note)
    if sample.full_s is None:
        sample.note = f"not back to {WORLD} ranks within {CAP_S:.0f} s (launcher exit {process.returncode})"
    return sample


def import_torch_seconds(samples: int = 3) -> float:
    times = []
    for _ in range(samples):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.monotonic() - start)
    return statistics.median(times)


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


# ---- group restarts of scripts without torchras (--group, issue 40) -------------------------------------------

#: script, ranks, the step before which rank 1 is killed or wedged, steps in all
GROUP_JOBS = {"ddp": ("plain_ddp_job.py", 4, 15, 40), "lightning": ("lightning_job.py", 2, 12, 30)}
GROUP_FAULTS = ("kill", "stall")
GROUP_LAUNCHERS = ("rasd launch", "torchrun")
GROUP_CAP_S = 120.0


def group_command(launcher: str, job: str, fault: str, out: Path) -> list[str]:
    script, nproc, at, steps = GROUP_JOBS[job]
    options = ["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=2"]
    head = ["-m", "torchras.cli", "launch"] if launcher == "rasd launch" else ["-m", "torch.distributed.run"]
    argv = [sys.executable, *head, *options, str(JOB.parent / script), "--out", str(out), "--steps", str(steps)]
    if job == "ddp":
        argv += ["--checkpoint", str(out / "ckpt.pt")]
    return [*argv, f"--{fault}", f"1:{at}"]


def group_sample(launcher: str, job: str, fault: str, folder: Path) -> tuple[float | None, str]:
    """Seconds from the fault to every rank of a later attempt having trained a step; or None and why not."""
    out = folder / f"{job}-{fault}-{launcher.replace(' ', '-')}"
    out.mkdir(parents=True)
    nproc = GROUP_JOBS[job][1]
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
    with open(out / "launcher.log", "wb") as log:
        process = subprocess.Popen(
            group_command(launcher, job, fault, out), env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    fault_at: float | None = None
    figure: float | None = None
    deadline = time.monotonic() + CAP_S + GROUP_CAP_S
    try:
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.5)
            found = records(out)
            faults = [r["time"] for r in found if r["event"] in ("killing", "stalling")]
            if faults and fault_at is None:
                fault_at = faults[0]
                deadline = time.monotonic() + GROUP_CAP_S
            if fault_at is None:
                continue
            firsts: dict[int, float] = {}
            for r in found:
                if r["event"] == "step" and r.get("attempt", 0) >= 1 and r["time"] > fault_at:
                    firsts.setdefault(r["pid"], r["time"])
            if len(firsts) >= nproc:
                figure = max(firsts.values()) - fault_at
                break
    finally:
        code = process.poll()  # before the bench stops it: None, still waiting
        if code is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
    if figure is not None:
        return figure, ""
    text = (out / "launcher.log").read_text(errors="replace")
    why = "connectFullMesh failed" if "connectFullMesh" in text else ""
    if fault_at is None:
        return None, f"no fault recorded (exit {process.returncode})"
    state = f"exited {code}" if code is not None else f"still waiting {GROUP_CAP_S:.0f} s after the fault"
    return None, f"not training again: {state}" + (f" ({why})" if why else "")


def group_rows(samples: int, launchers: tuple[str, ...] = GROUP_LAUNCHERS) -> None:
    load_before = os.getloadavg()[0]
    results: dict[tuple[str, str, str], list[tuple[float | None, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-heal-group-") as folder:
        for index in range(samples):
            for job in GROUP_JOBS:
                for fault in GROUP_FAULTS:
                    for launcher in launchers:
                        sample = group_sample(launcher, job, fault, Path(folder) / str(index))
                        results.setdefault((job, fault, launcher), []).append(sample)
                        print(f"  {job} {fault} {launcher} sample {index + 1}: {sample}", file=sys.stderr, flush=True)
    after = os.getloadavg()[0]
    print(f"\nfault to training again; medians of {samples}; load {load_before:.1f} before, {after:.1f} after\n")
    print(f"{'script':<10} {'fault':<7} {'launcher':<12} {'seconds':>8}  note")
    figures: dict[str, float | None] = {}
    for (job, fault, launcher), values in results.items():
        value = median([v for v, _ in values])
        notes = "; ".join(sorted({note for _, note in values if note}))
        cell = f"{value:>6.2f} s" if value is not None else f"{'-':>8}"
        print(f"{job:<10} {fault:<7} {launcher:<12} {cell}  {notes}")
        figures[f"{job}_{fault}_{launcher.replace(' ', '_')}_s"] = round(value, 2) if value is not None else None
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--only", choices=SYSTEMS, action="append")
    parser.add_argument("--nvrx-venv", type=Path, default=Path("/tmp/torchras-bench-nvrx-venv"))
    parser.add_argument("--group", action="store_true", help="the group-restart rows of scripts without torchras")
    parser.add_argument("--launcher", choices=GROUP_LAUNCHERS, action="append", help="--group: only these")
    args = parser.parse_args()
    if args.group:
        group_rows(args.samples, tuple(args.launcher or GROUP_LAUNCHERS))
        return
    systems = args.only or list(SYSTEMS)
    nvrx = None
    if "nvrx" in systems:
        sys.path.insert(0, str(Path(__file__).parent))
        from time_lost import nvrx_python

        try:
            nvrx = nvrx_python(args.nvrx_venv)
        except (subprocess.CalledProcessError, OSError) as error:
            print(f"nvrx: no venv ({error}); left out", file=sys.stderr)
            systems.remove("nvrx")
    load_before = os.getloadavg()[0]
    importing = import_torch_seconds()
    results: dict[str, list[Sample]] = {system: [] for system in systems}
    with tempfile.TemporaryDirectory(prefix="bench-heal-") as folder:
        for index in range(args.samples):
            for system in systems:  # interleaved: a change of load hits every system alike
                sample = run(system, nvrx, Path(folder) / f"{index}")
                results[system].append(sample)
                print(f"  {system} sample {index + 1}: {sample}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]
    figures: dict[str, float | int | None] = {"import_torch_s": round(importing, 2)}
    print(f"\nkill -9 of rank {KILL_RANK} of {WORLD} (gloo, DDP) at step {KILL_STEP}; medians of {args.samples}")
    print(f"python -c 'import torch': {importing:.2f} s (target for (b): {importing + 5:.1f} s)")
    print(f"load average {load_before:.1f} before, {load_after:.1f} after\n")
    print(
        f"{'system':<10} {'(a) survivors train':>20} {'(b) back to 4':>14} {'redone':>7} {'respawn':>8}  "
        "checkpoint  note"
    )
    for system, samples in results.items():
        survivors = median([s.survivors_s for s in samples])
        full = median([s.full_s for s in samples])
        redone = median([float(s.redone) for s in samples if s.redone is not None])
        respawn = median([s.replacement_start_s for s in samples])
        world = samples[0].world_after
        read = any(s.checkpoint_read for s in samples)
        notes = "; ".join(sorted({s.note for s in samples if s.note}))

        def cell(value: float | None, width: int) -> str:
            return f"{value:>{width - 2}.2f} s" if value is not None else f"{'-':>{width}}"

        survivors_text = cell(survivors, 14) + (f" at {world}" if world else "     ")
        print(
            f"{system:<10} {survivors_text:>20} {cell(full, 14)} {redone if redone is not None else '-':>7} "
            f"{cell(respawn, 8)}  {'read' if read else 'none':<10}  {notes}"
        )
        figures[f"{system}_survivors_train_s"] = round(survivors, 2) if survivors is not None else None
        figures[f"{system}_back_to_full_s"] = round(full, 2) if full is not None else None
        figures[f"{system}_steps_redone"] = redone
        if system == "torchras":
            for name, values in (
                ("started", [s.replacement_start_s for s in samples]),
                ("imported_torch", [s.replacement_imported_s for s in samples]),
                ("admitted_synced", [s.replacement_synced_s for s in samples]),
            ):
                value = median(values)
                figures[f"torchras_replacement_{name}_s"] = round(value, 2) if value is not None else None
    for system in ("torchrun", "nvrx"):
        ours, theirs = figures.get("torchras_back_to_full_s"), figures.get(f"{system}_back_to_full_s")
        if isinstance(ours, float) and isinstance(theirs, float) and ours > 0:
            figures[f"{system}_over_torchras_full"] = round(theirs / ours, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
