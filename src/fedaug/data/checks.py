"""Shared option checks for the dataset builders and partitioners.

Builders collect every problem with their options into a list and raise one :class:`ConfigError`
naming them all (:func:`raise_problems`); partitioners raise at the first one (:func:`require_int`).
Messages name the option, the allowed range and the value given, e.g.
``size must be an integer >= 8, got 4`` or ``val_fraction must be in [0, 1), got 1.5``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedaug.core.errors import ConfigError


def is_int(v: Any, *, numpy: bool = False) -> bool:
    """Whether ``v`` is an integer option value: an ``int`` but not a ``bool`` (``True`` is an int in
    Python); with ``numpy``, numpy integer scalars count too."""
    kinds = (int, np.integer) if numpy else int
    return isinstance(v, kinds) and not isinstance(v, bool)


def check_int(problems: list[str], name: str, v: Any, lo: int, hi: float | None = None, *, note: str = "",
              numpy: bool = False) -> bool:
    """Append a problem to ``problems`` unless ``v`` is an integer (see :func:`is_int`) in ``[lo, hi]``.

    Args:
        problems: the list of problems collected so far; appended to.
        name: the option's name, as the user spells it.
        v: the value given.
        lo: the smallest allowed value.
        hi: the largest allowed value; None: no upper bound (``math.inf`` is shown as ``inf``).
        note: text put after the allowed range, e.g. ``" (the number of classes)"``.
        numpy: accept numpy integer scalars too.

    Returns:
        Whether ``v`` is allowed.

    The message is ``"<name> must be an integer >= <lo><note>, got <v!r>"``, or with ``hi``
    ``"<name> must be an integer in [<lo>, <hi>]<note>, got <v!r>"``.
    """
    if is_int(v, numpy=numpy) and v >= lo and (hi is None or v <= hi):
        return True
    allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    problems.append(f"{name} must be an integer {allowed}{note}, got {v!r}")
    return False


def require_int(name: str, v: Any, lo: int, hi: float | None = None, *, note: str = "",
                numpy: bool = False) -> None:
    """Like :func:`check_int`, but raise the problem at once as a :class:`ConfigError` (no dataset prefix).

    Raises:
        ConfigError: ``v`` is not an integer in ``[lo, hi]``.
    """
    problems: list[str] = []
    if not check_int(problems, name, v, lo, hi, note=note, numpy=numpy):
        raise ConfigError(problems[0])


def check_fraction(problems: list[str], name: str, v: Any, *, interval: str = "[0, 1)", note: str = "") -> bool:
    """Append a problem to ``problems`` unless ``v`` is a number in ``interval``.

    Args:
        problems: the list of problems collected so far; appended to.
        name: the option's name.
        v: the value given (an ``int`` or ``float``).
        interval: ``"[0, 1)"`` or ``"(0, 1]"``.
        note: text put after the interval, e.g. ``" (e.g. 1/6 ... 1)"``.

    Returns:
        Whether ``v`` is allowed. The message is ``"<name> must be in <interval><note>, got <v!r>"``.
    """
    if interval not in ("[0, 1)", "(0, 1]"):
        raise ValueError(f"interval must be '[0, 1)' or '(0, 1]', got {interval!r}")
    if isinstance(v, (int, float)) and (0 <= v < 1 if interval == "[0, 1)" else 0 < v <= 1):
        return True
    problems.append(f"{name} must be in {interval}{note}, got {v!r}")
    return False


def check_fractions(problems: list[str], val_fraction: Any, test_fraction: Any = 0.0) -> bool:
    """Append the problems with a ``val_fraction`` / ``test_fraction`` pair (each in ``[0, 1)``, sum < 1).

    Each bad fraction is reported on its own (see :func:`check_fraction`); when both are in range but
    leave no train share, the message is ``"val_fraction + test_fraction must be < 1 (the rest is the
    train share), got <v> + <t>; lower one of them"``. Loaders without a test split leave
    ``test_fraction`` at 0.

    Returns:
        Whether both are allowed.
    """
    ok = check_fraction(problems, "val_fraction", val_fraction)
    ok = check_fraction(problems, "test_fraction", test_fraction) and ok
    if ok and val_fraction + test_fraction >= 1:
        problems.append(
            "val_fraction + test_fraction must be < 1 (the rest is the train share), "
            f"got {val_fraction!r} + {test_fraction!r}; lower one of them"
        )
        return False
    return ok


def raise_problems(dataset: str, problems: list[str]) -> None:
    """Raise one :class:`ConfigError` ``"<dataset>: <problem>; <problem>; ..."`` if ``problems`` is non-empty.

    Raises:
        ConfigError: there is at least one problem.
    """
    if problems:
        raise ConfigError(f"{dataset}: " + "; ".join(problems))
