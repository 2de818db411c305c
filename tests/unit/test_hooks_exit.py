"""At the interpreter's exit, rasd's hooks give the gloo groups they kept time to let go of their last work
(rasd/torch/hooks.py, "Keeping gloo's teardown from deadlocking"): a bounded wait, and only just after a destroy."""

from __future__ import annotations

import time

from rasd.core.registry import CommRegistry
from rasd.torch.hooks import EXIT_GRACE_S, TorchHooks


def settle_seconds(hooks: TorchHooks) -> float:
    started = time.monotonic()
    hooks.settle_retired()
    return time.monotonic() - started


def test_the_exit_waits_out_the_grace_only_just_after_a_group_was_destroyed() -> None:
    hooks = TorchHooks(CommRegistry(), start_mesh=False)
    assert settle_seconds(hooks) < 0.05  # nothing kept: no wait
    hooks.retired, hooks.retired_at = [object()], time.monotonic()
    waited = settle_seconds(hooks)
    assert EXIT_GRACE_S - 0.05 <= waited <= EXIT_GRACE_S + 0.5
    hooks.retired_at = time.monotonic() - 10 * EXIT_GRACE_S  # destroyed long ago: its workers are idle
    assert settle_seconds(hooks) < 0.05
    hooks.retired_at = time.monotonic() + 3600  # a clock that went wrong: still at most the grace
    assert settle_seconds(hooks) <= EXIT_GRACE_S + 0.5
