"""At the interpreter's exit, rasd's hooks give the gloo groups they kept time to let go of their last work
(rasd/torch/hooks.py, "Keeping gloo's teardown from deadlocking"): a bounded wait, and only just after a destroy."""

from __future__ import annotations

import time

import pytest

from rasd.core.registry import CommRegistry
from rasd.torch import hooks as torch_hooks

GRACE = 0.5  # five times the default: a wait and no wait differ by far more than a loaded machine's jitter


def settle_seconds(hooks: torch_hooks.TorchHooks) -> float:
    started = time.monotonic()
    hooks.settle_retired()
    return time.monotonic() - started


@pytest.mark.slow  # two waits of the grace
def test_the_exit_waits_out_the_grace_only_just_after_a_group_was_destroyed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_hooks, "EXIT_GRACE_S", GRACE)
    hooks = torch_hooks.TorchHooks(CommRegistry(), start_mesh=False)
    assert settle_seconds(hooks) < GRACE / 2  # nothing kept: no wait
    hooks.retired, hooks.retired_at = [object()], time.monotonic()
    assert GRACE - 0.1 <= settle_seconds(hooks) <= GRACE + 1.0
    hooks.retired_at = time.monotonic() - 10 * GRACE  # destroyed long ago: its workers are idle
    assert settle_seconds(hooks) < GRACE / 2
    hooks.retired_at = time.monotonic() + 3600  # a clock that went wrong: still at most the grace
    assert settle_seconds(hooks) <= GRACE + 1.0
