"""Settings for the whole suite.

Hypothesis: the suite runs on shared 2-core machines (CI and development), where a test's speed says nothing about
the code. So no property test has a deadline and none fails the "too slow" health check; each test still chooses
its own number of examples. The profile is loaded here, before any test module is imported, because a
``settings(...)`` object in a test module takes the values it does not name from the profile active when it is
created.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("torchras", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("torchras")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that have slow tests (real processes, simulations) first, each file's tests in their order.

    The three workers take whole files, the next one as each finishes (pyproject.toml). A long file handed out last
    keeps one worker busy while the others wait for the run to end; handed out first, it runs while the thousands
    of quick tests fill the other workers, and those quick files even the end out. Every worker sorts its
    collection the same way, which pytest-xdist requires."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort: the order within each part is kept
