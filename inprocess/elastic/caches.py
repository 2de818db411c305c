"""Empty torch's DTensor caches, which outlive a restart and would hand a new device mesh an old one's specs.

Why: a ``DeviceMesh`` equals (and hashes like) any mesh of the same shape and device type, whichever rank this
process holds in it, and torch caches the output specs of DTensor operations, each holding its mesh, keyed on such
meshes. When a restarted iteration builds a mesh of a shape an earlier one had (the world came back to its size after
a newcomer joined) with this process at another rank, ``fully_shard`` and the DTensor operators get specs of the
earlier mesh, whose coordinate is this process's earlier rank: it loads another rank's shard (a shape error where the
shards differ in size, silently wrong data where they do not). torch 2.13 keeps these caches in C++
(``torch._C._clear_DTensor_sharding_propagator_cache``) and in Python (the sharding propagator's LRU cache).

The Wrapper calls ``forget_dtensor_caches()`` at every restart; ``ShardedState.sync()`` calls it again before it
builds the iteration's model. A process that never imported ``torch.distributed.tensor`` has nothing to empty and
imports nothing here.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)


def forget_dtensor_caches() -> bool:
    """Empty the caches; False when DTensor was never imported (nothing cached). Never raises."""
    if "torch.distributed.tensor" not in sys.modules:
        return False
    try:
        import torch
        from torch.distributed.tensor import DTensor

        clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
        if clear_native is not None:
            clear_native()
        propagator = DTensor._op_dispatcher.sharding_propagator
        cached = getattr(propagator.propagate_op_sharding, "cache", None)
        if cached is not None:  # torch 2.13: an LRU cache object in front of the propagation
            cached.cache_clear()
        elif hasattr(propagator.propagate_op_sharding, "cache_clear"):  # functools.lru_cache in other releases
            propagator.propagate_op_sharding.cache_clear()
    except Exception:  # another torch release: its caches have other names; a restart must not fail for that
        log.warning("could not empty torch's DTensor caches", exc_info=True)
        return False
    return True
