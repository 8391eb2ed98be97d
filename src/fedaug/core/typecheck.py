"""Checking option values against type annotations, with the wording of the error messages.

The run schema's fields and every registered dataset, model and method component declare their
options with annotations; :func:`fits` checks a value against one and :func:`allowed` says what it
allows, so a value of the wrong type fails up front with one clear message rather than as a
traceback inside a builder or a round of training. Here ``bool`` is not an integer, an ``int`` is a
valid ``float``, and a ``float`` must be finite (NaN and infinities are refused); numpy's scalars
count as the Python numbers they stand for.

Checked: ``int``, ``float``, ``bool``, ``str``, ``os.PathLike``, ``None``, unions of these,
``list[T]`` / ``tuple[T, ...]`` / ``Sequence[T]`` (a list or tuple, never a string) and
``dict[str, T]``; any other annotation (``Any``, a class) is left to the code that takes the value.
"""

from __future__ import annotations

import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

_SINGULAR = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string",
             os.PathLike: "a path"}
_PLURAL = {int: "integers", float: "finite numbers", bool: "booleans", str: "strings", os.PathLike: "paths"}


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer (numpy's too) other than a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a real number (numpy's too), not a ``bool``, other than NaN and +-inf.

    >>> is_finite_number(0.5), is_finite_number(float("nan")), is_finite_number(True)
    (True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def annotations_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s resolved parameter annotations; empty when they name a type that cannot be resolved
    at run time (one imported only for type checkers): those values are then left to ``fn``."""
    try:
        return typing.get_type_hints(fn)
    except (NameError, TypeError):
        return {}


def _base(tp: Any) -> Any:
    """``tp`` without its parameters (``os.PathLike[str]`` -> ``os.PathLike``)."""
    return typing.get_origin(tp) or tp


def is_union(tp: Any) -> bool:
    """Whether ``tp`` is a union (``int | None``, ``Union[int, str]``)."""
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def element_type(tp: Any) -> Any:
    """The element type of a homogeneous sequence annotation, else ``None``.

    >>> element_type(Sequence[str]), element_type(tuple[int, ...]), element_type(str)
    (<class 'str'>, <class 'int'>, None)
    """
    args = typing.get_args(tp)
    if _base(tp) in (list, Sequence) and len(args) == 1:
        return args[0]
    if _base(tp) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def choices(tp: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` annotation allows: of ``tp`` itself, of the members of a union, or of
    the elements of a sequence; empty for any other annotation.

    >>> choices(typing.Literal["off", "on"]), choices(Sequence[typing.Literal["a", "b"]] | None), choices(str)
    (('off', 'on'), ('a', 'b'), ())
    """
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    if is_union(tp):
        return tuple(dict.fromkeys(c for a in typing.get_args(tp) for c in choices(a)))
    element = element_type(tp)
    return choices(element) if element is not None else ()


def is_numeric(tp: Any) -> bool:
    """Whether the annotation ``tp`` takes numbers or flags (``int``, ``float``, ``bool``): alone,
    in a union or as the elements of a list.

    >>> is_numeric(float | None), is_numeric(Sequence[int]), is_numeric(str)
    (True, True, False)
    """
    if is_union(tp):
        return any(is_numeric(a) for a in typing.get_args(tp))
    element = element_type(tp)
    return is_numeric(element) if element is not None else tp in (int, float, bool)


def fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` is allowed by the annotation ``tp`` (see the module docstring).

    >>> fits(2, int), fits(2.5, int), fits(True, int), fits(2, float), fits(float("inf"), float)
    (True, False, False, True, False)
    >>> fits(["a"], Sequence[str] | None), fits("a", Sequence[str] | None)
    (True, False)
    """
    if tp is type(None):
        return value is None
    if is_union(tp):
        return any(fits(value, a) for a in typing.get_args(tp))
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return is_integer(value)
    if tp is float:
        return is_finite_number(value)
    if tp in (str, os.PathLike) or _base(tp) is os.PathLike:
        return isinstance(value, _base(tp))
    element = element_type(tp)
    if element is not None:
        return isinstance(value, (list, tuple)) and all(fits(v, element) for v in value)
    if _base(tp) is dict:
        inner = typing.get_args(tp)[1] if typing.get_args(tp) else Any
        return isinstance(value, dict) and all(fits(v, inner) for v in value.values())
    return True


def allowed(tp: Any) -> str:
    """What the annotation ``tp`` allows, as an error message says it (``None`` is not mentioned:
    a config file cannot give it).

    >>> allowed(int), allowed(Sequence[float] | float), allowed(dict[str, dict[str, Any]])
    ('an integer', 'a list of finite numbers or a finite number', 'a table of tables')
    """
    if is_union(tp):
        return " or ".join(dict.fromkeys(allowed(a) for a in typing.get_args(tp) if a is not type(None)))
    if _base(tp) in _SINGULAR:
        return _SINGULAR[_base(tp)]
    element = element_type(tp)
    if element is not None:
        return f"a list of {_PLURAL[_base(element)]}" if _base(element) in _PLURAL else "a list"
    if _base(tp) is dict:
        inner = typing.get_args(tp)[1] if typing.get_args(tp) else Any
        if _base(inner) is dict:
            return "a table of tables"
        return f"a table of {_PLURAL[_base(inner)]}" if _base(inner) in _PLURAL else "a table"
    raise TypeError(f"{tp!r} is not an annotation that fits() checks")
