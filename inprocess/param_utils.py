"""Parameter checks of the Wrapper and injection of the CallWrapper into the wrapped function's arguments."""

from __future__ import annotations

import datetime
import inspect
import numbers
import re
import types
import typing
from collections.abc import Callable
from typing import Any


def check_condition(condition: bool, text: str, **variables: Any) -> None:
    """``ValueError('Condition "<text>" failed. Variables: a=1, b=2')`` unless ``condition`` holds."""
    if not condition:
        shown = ", ".join(f"{name}={value!r}" for name, value in variables.items())
        raise ValueError(f'Condition "{text}" failed. Variables: {shown}')


def enforce_type(name: str, value: Any, types: tuple) -> None:
    if not isinstance(value, types):
        expected = " | ".join(getattr(kind, "__name__", str(kind)) for kind in types)
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}: {value!r}")


def enforce_subclass(name: str, value: Any, base: type) -> None:
    if not (isinstance(value, type) and issubclass(value, base)):
        raise TypeError(f"{name} must be a subclass of {base.__name__}, got {value!r}")


def as_seconds(name: str, value: Any) -> float:
    """Timeouts and intervals are ``datetime.timedelta`` in the reference; plain seconds are accepted too."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"{name} must be a datetime.timedelta (or seconds), got {type(value).__name__}: {value!r}")


# ---- injection -------------------------------------------------------------------------------------------------


def _matches(annotation: Any, target: type) -> bool:
    """Is ``annotation`` the target class, or an Optional/Union containing it? Never raises."""
    if annotation is target:
        return True
    if isinstance(annotation, str):
        text = re.sub(r"[A-Za-z_]\w*\.", "", re.sub(r"\s+", "", annotation))  # drop module qualifiers
        name = target.__name__
        if text == name:
            return True
        optional = re.fullmatch(r"Optional\[(.*)\]", text)
        if optional:
            return optional.group(1) == name
        union = re.fullmatch(r"Union\[(.*)\]", text)
        if union:
            return name in union.group(1).split(",")
        return "|" in text and name in text.split("|")
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is getattr(types, "UnionType", None):
        return any(_matches(argument, target) for argument in typing.get_args(annotation))
    try:
        return isinstance(annotation, type) and issubclass(annotation, target)
    except TypeError:
        return False


def _resolved_annotations(fn: Callable) -> dict[str, Any]:
    """Annotations with strings resolved where possible; a name that cannot be resolved stays a string."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - forward references to unknown names, odd objects: fall back to raw
        pass
    try:
        raw = dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}
    resolved = {}
    namespace = getattr(fn, "__globals__", {})
    for name, parameter in raw.items():
        annotation = parameter.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(namespace))  # noqa: S307 - the function's own annotation
            except Exception:  # noqa: BLE001 - an annotation that does not evaluate stays a string
                pass
        resolved[name] = annotation
    return resolved


def injected_parameters(fn: Callable, target: type) -> list[str]:
    """Names of the parameters of ``fn`` annotated with ``target`` (or Optional/Union of it)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    annotations = _resolved_annotations(fn)
    return [
        name
        for name, parameter in parameters.items()
        if parameter.annotation is not inspect.Parameter.empty
        and _matches(annotations.get(name, parameter.annotation), target)
    ]


def substitute_param_value(fn: Callable, args: tuple, kwargs: dict, values: dict[str, Any]) -> tuple[tuple, dict]:
    """Bind the call, set the named parameters to ``values``, return the new ``(args, kwargs)``."""
    if not values:
        return args, kwargs
    signature = inspect.signature(fn)
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    for name, value in values.items():
        bound.arguments[name] = value
    return bound.args, bound.kwargs
