"""Parameter checks of the Wrapper and injection of the CallWrapper into the wrapped function's arguments.

The reference's names are all here, in both their forms: ``enforce_type(name, value, types)`` (ours) and
``enforce_type(name, types)`` (the reference's, which reads the caller's local variable ``name``); the same for
``enforce_subclass``. ``enforce_value(condition)`` reads the condition's text from the caller's source line, as the
reference's does; ``check_condition(condition, text, **variables)`` is told it.
"""

from __future__ import annotations

import ast
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


_FROM_CALLER = object()


def _caller_local(name: str) -> Any:
    """The value of ``name`` in the frame that called the caller (the reference's two-argument forms)."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
        if caller is None or name not in caller.f_locals:
            raise TypeError(f"{name!r} is not a local variable of the caller")
        return caller.f_locals[name]
    finally:
        del frame


def enforce_type(name: str, value: Any, types: Any = _FROM_CALLER) -> None:
    """``TypeError`` unless ``value`` is an instance of ``types``; ``enforce_type(name, types)`` checks the caller's
    local variable ``name``, as the reference's does."""
    if types is _FROM_CALLER:
        value, types = _caller_local(name), value
    if not isinstance(value, types):
        kinds = types if isinstance(types, tuple) else (types,)
        expected = " | ".join(getattr(kind, "__name__", str(kind)) for kind in kinds)
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}: {value!r}")


def enforce_subclass(name: str, value: Any, base: Any = _FROM_CALLER) -> None:
    """``TypeError`` unless ``value`` is a subclass of ``base``; ``enforce_subclass(name, base)`` checks the caller's
    local variable ``name``, as the reference's does."""
    if base is _FROM_CALLER:
        value, base = _caller_local(name), value
    if not (isinstance(value, type) and issubclass(value, base)):
        raise TypeError(f"{name} must be a subclass of {getattr(base, '__name__', base)}, got {value!r}")


def enforce_value(condition: Any) -> None:
    """``ValueError('Condition "<text>" failed. Variables: ...')`` unless ``condition`` holds, the text and the
    variables read from the caller's source line and frame (as the reference's ``enforce_value``)."""
    if condition:
        return
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    text, variables = "<unknown condition>", {}
    try:
        if caller is not None:
            context = inspect.getframeinfo(caller).code_context
            call = _enforce_value_call(context[0].strip() if context else "")
            if call is not None and call.args:
                text = ast.unparse(call.args[0])
                names = sorted({node.id for node in ast.walk(call.args[0]) if isinstance(node, ast.Name)})
                for name in names:  # the values of the condition's variables (not its functions or modules)
                    scope = next((scope for scope in (caller.f_locals, caller.f_globals) if name in scope), None)
                    if scope is not None and not callable(scope[name]) and not inspect.ismodule(scope[name]):
                        variables[name] = scope[name]
    finally:
        del frame, caller
    check_condition(False, text, **variables)


def _enforce_value_call(line: str) -> ast.Call | None:
    """The ``enforce_value(...)`` call on a source line, if the line parses."""
    try:
        tree = ast.parse(line)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name == "enforce_value":
                return node
    return None


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


def check_type(annotation: Any, cls: type) -> bool:
    """Is ``annotation`` the class ``cls``, or an Optional/Union containing it (strings too)? Never raises."""
    return _matches(annotation, cls)


def count_type_in_params(fn: Callable, cls: type) -> int:
    """How many parameters of ``fn`` are annotated with ``cls`` (or Optional/Union of it)."""
    return len(injected_parameters(fn, cls))


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


def substitute_param_value(fn: Callable, args: tuple, kwargs: dict, values: dict[Any, Any]) -> tuple[tuple, dict]:
    """Bind the call, set parameters to ``values``, return the new ``(args, kwargs)``.

    A key of ``values`` is a parameter name, or a class (the reference's form): every parameter annotated with
    that class (or Optional/Union of it) gets the value.
    """
    if not values:
        return args, kwargs
    by_name: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(key, type):
            by_name.update(dict.fromkeys(injected_parameters(fn, key), value))
        else:
            by_name[key] = value
    if not by_name:
        return args, kwargs
    signature = inspect.signature(fn)
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    for name, value in by_name.items():
        bound.arguments[name] = value
    return bound.args, bound.kwargs
