"""Settings for the whole suite.

Hypothesis: the suite runs on shared 2-core machines (CI and development), where a test's speed says nothing about
the code. So no property test has a deadline and none fails the "too slow" health check; each test still chooses
its own number of examples. The profile is loaded here, before any test module is imported, because a
``settings(...)`` object in a test module takes the values it does not name from the profile active when it is
created.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("torchras", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("torchras")
