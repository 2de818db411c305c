"""Fixtures for multi-process tests: start gloo jobs of tests/inprocess/inprocess_workload.py, always clean them up."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from inprocess_jobs import Job


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``launch(scenario, world_size=4)`` starts a job; every trainer and monitor is killed at teardown."""
    jobs: list[Job] = []

    def start(scenario: dict, world_size: int = 4) -> Job:
        directory = tmp_path / f"job{len(jobs)}"
        directory.mkdir()
        job = Job(world_size, directory, scenario)
        jobs.append(job)
        return job.start()

    yield start
    for job in jobs:
        job.kill()
