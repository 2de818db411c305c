"""``Compose(a, b, c)(x) == a(b(c(x)))``: chain callables of one kind into one.

The composite is an instance of the lowest common base class of its members, so ``Compose(MyInit(),
RetryController())`` passes ``isinstance(x, Initialize)`` and can be handed to the ``initialize`` parameter.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, TypeVar

T = TypeVar("T")  # the reference module's name


def find_common_ancestor(*instances: Any) -> type:
    """The first class in the MRO of ``instances[0]`` that every instance is an instance of (``object`` at worst)."""
    first, *rest = (type(instance) for instance in instances)
    for candidate in first.__mro__:
        if all(candidate in other.__mro__ for other in rest):
            return candidate
    return object


def _takes_arguments(instance: Any) -> bool:
    try:
        return len(inspect.signature(instance).parameters) > 0
    except (TypeError, ValueError):
        return True


class Compose:
    """Call ``instances`` last to first, feeding each return value to the next one.

    The first member called gets the caller's arguments. Afterwards a tuple return value is used as the argument
    tuple of the next member; any other value ``ret`` is passed as ``(ret,)`` if the next member takes arguments,
    and nothing otherwise. The composite returns what the first-listed member returns.
    """

    def __new__(cls, *instances: Any) -> Compose:
        if not instances:
            raise ValueError("Compose needs at least one instance")
        ancestor = find_common_ancestor(*instances)
        if ancestor is object or issubclass(cls, ancestor):
            return super().__new__(cls)
        try:
            dynamic = type("DynamicCompose", (cls, ancestor), {})
        except TypeError:  # a base that cannot be subclassed (plain functions, builtins): a plain Compose
            return super().__new__(cls)
        return super().__new__(dynamic)

    def __init__(self, *instances: Any) -> None:
        self.instances = list(instances)

    def __call__(self, *args: Any) -> Any:
        ret: Any = args
        call_args: tuple = args
        for position, instance in enumerate(reversed(self.instances)):
            if position > 0:
                if isinstance(ret, tuple):
                    call_args = ret
                elif _takes_arguments(instance):
                    call_args = (ret,)
                else:
                    call_args = ()
            ret = instance(*call_args)
            if ret is None and any(arg is not None for arg in call_args):
                warnings.warn(
                    f"{type(instance).__name__} returned None although it was given arguments",
                    UserWarning,
                    stacklevel=2,
                )
        return ret

    def __repr__(self) -> str:
        return f"Compose({', '.join(repr(instance) for instance in self.instances)})"
