"""``rasd demo`` ends on a fault that every restart meets, instead of restarting it for ever (issue 27).

The fault is the one users met: numpy missing. torch imports without it, but its object collectives need it
(``broadcast_object_list``, in ``state.sync()``), so every restart iteration fails the same way, on the ranks that
receive. Before, the demo restarted for ever (21 restarts in 30 s); now, after ``REPEATS`` (3) iterations that the
same exception ended with no step completed, every worker's Wrapper gives up (the Wrapper's own policy,
``inprocess.repeated_faults``, on by default), every worker exits with status 1, one rank says once what the error
was, with its traceback, the launcher (plain ``rasd launch``, which ends a job whose Wrapper gave up)
respawns nothing and the demo's status is 1.

numpy is a dependency of the distribution, so the test takes it away as a broken environment would: a ``numpy``
package first on ``PYTHONPATH`` whose import fails as a missing package's does. Nothing in the demo knows of it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess.repeated_faults import DEFAULT_LIMIT as REPEATS
from launching import free_port

REPOSITORY = Path(__file__).resolve().parents[2]
#: Far longer than the demo needs (seconds of start-up, then about a second per restart): it is not a speed test.
DEADLINE_S = 300


def without_numpy(folder: Path) -> Path:
    """A folder whose ``numpy`` package fails to import as an absent one does."""
    package = folder / "numpy"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n')
    return folder


@pytest.mark.slow
def test_a_fault_that_every_restart_meets_ends_the_demo_with_that_error(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        TORCH_CPP_LOG_LEVEL="ERROR",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(without_numpy(tmp_path / "broken")), str(REPOSITORY), os.environ.get("PYTHONPATH")])
        ),
    )
    env.pop("TORCHRAS_LOG_LEVEL", None)
    command = [sys.executable, "-m", "torchras.cli", "demo", "--steps", "40", "--step-time", "0.05"]
    demo = subprocess.Popen(
        [*command, "--addr", f"localhost:{free_port()}"],
        env=env,
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = demo.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        demo.kill()  # a demo that loops: say so, with what it printed
        out, err = demo.communicate()
        pytest.fail(f"the demo still ran after {DEADLINE_S} s: it loops\n{out}\n{err[-3000:]}")
    report = f"{out}\n{err[-4000:]}"
    assert demo.returncode == 1, report

    # Said once, by the rank whose decision every rank followed (inprocess.repeated_faults): the error, where it
    # was raised, how many times, that a restart does not heal it, and its traceback.
    said = re.findall(
        r"^\[rank \d\] ERROR giving up: RuntimeError: Numpy is not available \(raised at (.*?)\) ended (\d+) restart",
        err,
        re.M,
    )
    assert len(said) == 1, report
    location, count = said[0]
    assert location.endswith(", in _tensor_to_object") and "distributed_c10d.py:" in location, report
    assert int(count) == REPEATS, report
    assert "with no progress between them" in err and "a restart does not heal it" in err, report
    assert "a missing dependency" in err, report
    traceback = err[err.index("giving up: RuntimeError") :].splitlines()
    closing = next(line for line in traceback[1:] if not line.startswith(" ") and not line.startswith("Traceback"))
    assert closing == "RuntimeError: Numpy is not available", report  # its traceback follows it, whole
    assert not re.search(r"^step ", out, re.M), report  # no training step ever completed

    # Every worker ended with status 1, none was respawned, and the launcher said why the job ended.
    ended = re.findall(r"^rasd launch: worker (\d) \(pid \d+, rank \d\) ended: (.*)$", err, re.M)
    assert sorted(local for local, _ in ended) == ["0", "1", "2", "3"], report
    assert all(how == "exit code 1; not respawned: its Wrapper gave up" for _, how in ended), report
    assert len(re.findall(r"its inprocess\.Wrapper gave up: the job ends; no worker is respawned", err)) == 1, report
    assert not re.search(r"respawning it|respawned: pid", err), report
    # rasd launch's own last line for a job whose Wrapper gave up: why (the Wrapper's reason), and status 1.
    last = err.rstrip().splitlines()[-1]
    assert re.fullmatch(
        r"rasd launch: every worker has exited: the job gave up \(worker \d's inprocess\.Wrapper, pid \d+: "
        r"RepeatedFault: RuntimeError: Numpy is not available \(raised at .*\) ended 3 restart iterations in a row "
        r"with no progress\): status 1",
        last,
    ), report
