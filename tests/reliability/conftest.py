"""The reliability tests import ``netns`` (tests/netns.py) and the integration helpers by module name."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for extra in (HERE, HERE.parent, HERE.parent / "integration"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))
