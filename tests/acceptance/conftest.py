"""The acceptance tests ask the client port with the integration helpers (tests/integration/ras_client.py) and take
free ports from the launcher tests' helpers (tests/launch/launching.py)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).parent.parent
for helpers in (TESTS / "integration", TESTS / "launch"):
    if str(helpers) not in sys.path:
        sys.path.insert(0, str(helpers))
