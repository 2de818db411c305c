"""What importing the Wrapper costs every rank at every start: ``import inprocess`` loads neither
``torch.distributed.checkpoint`` nor DTensor (with sympy, half a second of CPU); a job with sharded state loads them
when it first names ``inprocess.elastic.ShardedState``."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

HEAVY = ("torch.distributed.checkpoint", "torch.distributed.tensor", "sympy")


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split()


def test_importing_the_wrapper_loads_no_checkpoint_machinery_until_sharded_state_is_named():
    assert _loaded_after("import inprocess, inprocess.elastic") == []
    named = _loaded_after("import inprocess.elastic\ninprocess.elastic.ShardedState")
    assert "torch.distributed.checkpoint" in named
