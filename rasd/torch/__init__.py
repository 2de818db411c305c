"""rasd.torch: the only part of rasd that imports torch.

``rasd.install()`` (or ``torchrun ... -m rasd.run train.py``) hooks ``torch.distributed`` so that every process
group is a registered communicator with counted collectives, and starts the RAS node from the first process
group's store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rasd.core.registry import CommRegistry

if TYPE_CHECKING:  # importing torch costs seconds: only install() does it
    from .hooks import TorchHooks

# The hooks of this process (one RAS node per process, one set of hooks feeding it).
_hooks: "TorchHooks | None" = None


def install(start_mesh: bool = True) -> TorchHooks:
    """Hook torch.distributed (idempotent). Call before ``init_process_group``, or after: existing groups are
    adopted. ``start_mesh=False`` counts without starting the RAS node."""
    global _hooks
    from .hooks import TorchHooks

    _keep_hooks_function()
    if _hooks is None:
        _hooks = TorchHooks(CommRegistry(), start_mesh=start_mesh)
        _hooks.install()
    return _hooks


def uninstall() -> None:
    """Put torch.distributed's own functions back (the RAS node, if started, keeps running)."""
    global _hooks
    if _hooks is not None:
        _hooks.uninstall()
        _hooks = None


def hooks() -> "TorchHooks | None":
    return _hooks


_hooks_function = hooks


def _keep_hooks_function() -> None:
    # Importing the submodule rasd.torch.hooks binds the package attribute ``hooks`` to that module, shadowing the
    # function above (``rasd.torch.hooks()`` then fails with "'module' object is not callable"). Put it back.
    globals()["hooks"] = _hooks_function


__all__ = ["hooks", "install", "uninstall"]
