"""The acceptance tests ask the client port with the integration helpers (tests/integration/ras_client.py)."""

from __future__ import annotations

import sys
from pathlib import Path

INTEGRATION = Path(__file__).parent.parent / "integration"
if str(INTEGRATION) not in sys.path:
    sys.path.insert(0, str(INTEGRATION))
