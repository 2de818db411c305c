"""Simulator sweeps (issue 14, item 4): random fault schedules, the mesh's properties checked at every step.

The library and its one-line reproduction are tests/reliability/sweep.py; bench/faults.py runs thousands of
seeds. Here: a few 64-node seeds, and a check that the checker does catch a violation.
"""

from __future__ import annotations

import pytest

import sweep


@pytest.mark.parametrize("seed", [1, 2])
def test_random_fault_schedules_keep_every_property(seed):
    out = sweep.check_seed(seed, n=64)
    assert out.violations == [], f"{out.violations[:5]}\nrepro: {out.repro()} --nodes 64"
    assert out.gathers >= 5 and out.steps >= 30


def test_the_checker_reports_a_partition_past_the_dead_limit_as_deaths_of_reachable_nodes(monkeypatch):
    # A partition longer than the dead limit makes each side declare the other dead: those nodes were alive and
    # never paused, so the property must flag it, with a reproduction line.
    t = sweep.SWEEP_TIMERS
    monkeypatch.setattr(
        sweep,
        "_schedule",
        lambda rng, n, timers: [(0.5, "partition", list(range(8))), (0.5 + 1.5 * t.dead, "heal", list(range(8)))],
    )
    out = sweep.check_seed(5, n=64)
    assert any("declared reachable node" in v for v in out.violations)
    assert out.repro() == "python tests/reliability/sweep.py --seed 5"
