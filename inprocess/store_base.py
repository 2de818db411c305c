"""``StoreMixin`` on torch's stores, and its two namespaces: the base of every store the Wrapper runs on.

Why a module of its own: ``inprocess.store`` (torch's stores: TCPStore, FileStore, HashStore, and
``open_connection``, which opens any kind, etcd included) and ``inprocess.etcd_store`` (``EtcdStore``) both build
their stores on these classes, and ``inprocess.store`` imports ``inprocess.etcd_store``. With the base here, the
imports go one way: store -> etcd_store -> store_base, store -> store_base. ``inprocess.store`` keeps the names
(``from inprocess.store import StoreMixin, PrefixStore, NamespaceStore``), as the reference's module has them.

Method resolution: ``StoreMixin`` comes *first* in the bases of the concrete stores (``inprocess.store``'s module
docstring says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed

from . import store_mixin
from .store_mixin import ITERATION_PREFIX, USER_PREFIX

if TYPE_CHECKING:
    # Combined with torch's stores only (listed first in their bases); a type checker sees torch's Store as its
    # base, so the operations the vocabulary builds on are checked.
    _Store = torch.distributed.Store
else:
    _Store = object


class StoreMixin(store_mixin.StoreMixin, _Store):
    """``inprocess.store_mixin.StoreMixin`` for torch's stores: its namespaces are torch ``PrefixStore``s."""

    def iteration_store(self, iteration: int) -> PrefixStore:
        return PrefixStore(iteration, self)

    def user_store(self, iteration: int) -> NamespaceStore:
        """The wrapped function's own namespace in ``iteration`` (``CallWrapper.store``), apart from the wrapper's."""
        return NamespaceStore(USER_PREFIX.format(iteration=iteration), self)


class PrefixStore(StoreMixin, torch.distributed.PrefixStore):
    """The namespace of restart iteration ``iteration`` inside another store, ``_inprocess_{iteration}``.

    Takes the iteration, as the reference's ``PrefixStore(iteration, store)`` does (torch joins prefix and key
    with ``/``).
    """

    def __init__(self, iteration: Any, store: torch.distributed.Store) -> None:
        prefix = ITERATION_PREFIX.format(iteration=iteration)
        super().__init__(prefix, store)
        self.iteration = iteration
        self.prefix = prefix
        self.base_store = store

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return getattr(self.base_store, "critical_ranks", ())

    def new_connection(self) -> PrefixStore:
        base = self.base_store
        # Store.clone: in torch 2.13, not in its type stubs.
        other = base.new_connection() if isinstance(base, StoreMixin) else base.clone()  # type: ignore[attr-defined]
        return PrefixStore(self.iteration, other)


class NamespaceStore(StoreMixin, torch.distributed.PrefixStore):
    """Any namespace inside another store: a call's namespace (``open_base_store``), the function's own store."""

    def __init__(self, prefix: str, store: torch.distributed.Store) -> None:
        super().__init__(prefix, store)
        self.prefix = prefix
        self.base_store = store

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return getattr(self.base_store, "critical_ranks", ())

    @property
    def port(self) -> int | None:
        """The port of the store underneath, if it has one (the abort leaves connections to it alone)."""
        return getattr(self.base_store, "port", None)

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port of a replicated store underneath (its members); empty for other stores."""
        return tuple(getattr(self.base_store, "ports", None) or ())

    def new_connection(self) -> NamespaceStore:
        base = self.base_store
        # Store.clone: in torch 2.13, not in its type stubs.
        other = base.new_connection() if isinstance(base, StoreMixin) else base.clone()  # type: ignore[attr-defined]
        return NamespaceStore(self.prefix, other)
