"""Option validators and precondition checks shared by the method components (one home for all).

Each raises :class:`~fedaug.core.errors.ConfigError` with the option as the user writes it
(``fedprox.mu``), the value given, what is allowed and, where there is one, the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.core.typecheck import fits, is_finite_number
from fedaug.methods.component import ClientCtx
from fedaug.methods.robust import STATS_RULES
from fedaug.privacy.noise import SCALES as NOISE_SCALES


def range_problem(option: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                  lo_open: bool = False, hi_open: bool = False, integer: bool = False) -> str | None:
    """The message for ``value`` if it is not a finite number (with ``integer``: an integer) in
    range, else ``None``; for components that collect every problem before raising.

    Args:
        option: ``"<component>.<option>"``, as the user writes it in a config.
        value: the given value (``bool`` is neither a number nor an integer here).
        lo, hi: the limits (``None``: unbounded); ``lo_open``/``hi_open`` exclude them.
        integer: the option counts something (an ``int``, not ``2.5``).

    >>> range_problem("fedprox.mu", float("nan"), lo=0.0)
    'fedprox.mu must be a finite number >= 0, got nan'
    >>> range_problem("ccvr.epochs", 2.5, lo=1, integer=True)
    'ccvr.epochs must be an integer >= 1, got 2.5'
    """
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    limits = " and ".join(parts)
    if not (fits(value, int) if integer else is_finite_number(value)):
        kind = "an integer" if integer else "a finite number"
        return f"{option} must be {kind} {limits}".rstrip() + f", got {value!r}"
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and (value >= hi if hi_open else value > hi)
    if too_low or too_high:
        return f"{option} must be {'an integer ' if integer else ''}{limits}, got {value}"
    return None


def check_range(option: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False, integer: bool = False) -> None:
    """Raise ``ConfigError("fedprox.mu must be >= 0, got -1")`` unless ``value`` is a finite number
    (NaN and inf are refused) in range; arguments as :func:`range_problem`."""
    problem = range_problem(option, value, lo=lo, hi=hi, lo_open=lo_open, hi_open=hi_open, integer=integer)
    if problem:
        raise ConfigError(problem)


def warn_like_fedavg(setting: str, method: str, same_as: str = "FedAvg") -> None:
    """Warn that an option value turns ``method`` into ``same_as`` (as Flower does for FedProx mu=0)."""
    warnings.warn(f"{setting} makes {method} identical to {same_as}", UserWarning, stacklevel=3)


def check_probability(owner: str, key: str, value: float) -> float:
    """``value`` (as a float) if it is a number in [0, 1], else a :class:`ConfigError` naming ``owner.key``."""
    if not (is_finite_number(value) and 0.0 <= value <= 1.0):
        raise ConfigError(f"{owner}.{key} must be in [0, 1], got {value}")
    return float(value)


def check_choice(owner: str, key: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if in ``allowed``, else a :class:`ConfigError` listing the choices."""
    if value not in allowed:
        raise ConfigError(f"{owner}.{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


#: ``stats_beta``'s default: the trimmed fraction of ``stats_rule="trimmed_mean"``
DEFAULT_STATS_BETA = 0.1


def check_stats_rule(owner: str, rule: str, beta: float) -> tuple[str, float]:
    """``(rule, beta)`` of a component's shared-statistics rule (docs/robustness.md): a
    :class:`ConfigError` for a rule not in :data:`~fedaug.methods.robust.STATS_RULES` or a
    ``beta`` outside [0, 0.5); a warning when ``beta`` is changed but the rule trims nothing."""
    rule = check_choice(owner, "stats_rule", rule, STATS_RULES)
    check_range(f"{owner}.stats_beta", beta, lo=0.0, hi=0.5, hi_open=True)
    if rule != "trimmed_mean" and beta != DEFAULT_STATS_BETA:
        warnings.warn(f"{owner}.stats_beta={beta} does nothing with stats_rule={rule!r}; "
                      "set stats_rule='trimmed_mean' to trim", UserWarning, stacklevel=3)
    return rule, float(beta)


def check_at(name: str, at: Sequence[str] | None) -> list[str] | None:
    """``at`` as a list, or a :class:`ConfigError` if it is not a non-empty list of strings."""
    if at is not None and (isinstance(at, str) or not at or not all(isinstance(n, str) for n in at)):
        raise ConfigError(f"{name}.at must be a non-empty list of module names, got {at!r}")
    return None if at is None else list(at)


def attach_points(name: str, at: Sequence[str] | None, model: nn.Module, default: int | None = None) -> list[str]:
    """``at``, or the first ``default`` (all when ``None``) of ``model.feature_stages``; a
    :class:`ConfigError` if none."""
    names = list(at) if at is not None else list(getattr(model, "feature_stages", ()))[:default]
    if not names:
        raise ConfigError(f"{name}: {type(model).__name__} declares no feature_stages; set "
                          f"method.options.{name}.at to module names")
    return names


def check_noise(owner: str, std: float, scale: str) -> None:
    """Raise :class:`ConfigError` naming ``owner`` unless ``std`` is a finite number >= 0 and ``scale`` is known."""
    problems = []
    if not is_finite_number(std) or std < 0:
        problems.append(f"{owner}.share_noise must be a finite number >= 0 (0 = no noise), got {std!r}")
    if scale not in NOISE_SCALES:
        problems.append(f"{owner}.share_noise_scale must be one of {', '.join(NOISE_SCALES)}, got {scale!r}")
    if problems:
        raise ConfigError("; ".join(problems))


def check_dp(owner: str, dp_clip: float | None, dp_noise: float | None) -> tuple[float | None, float]:
    """The Gaussian-mechanism options of a sharing component (:mod:`fedaug.privacy.mechanism`):
    ``(C, z)``, with ``C = None`` when off.

    ``dp_clip`` (C > 0) bounds each clipped quantity's L2 norm; ``dp_noise`` (z >= 0) is the noise
    multiplier, sigma = z * sensitivity, and needs ``dp_clip``. Clipping with z = 0 (or unset) is
    allowed, with a warning: it bounds what leaves the client but gives no formal guarantee.

    Raises:
        ConfigError: every problem at once, each naming ``owner.dp_clip`` or ``owner.dp_noise``.
    """
    problems = [p for p in (
        None if dp_clip is None else range_problem(f"{owner}.dp_clip", dp_clip, lo=0.0, lo_open=True),
        None if dp_noise is None else range_problem(f"{owner}.dp_noise", dp_noise, lo=0.0),
    ) if p]
    if dp_noise is not None and dp_clip is None:
        problems.append(f"{owner}.dp_noise={dp_noise!r} needs {owner}.dp_clip (the clipping bound C that fixes "
                        "the sensitivity the noise is calibrated to); set both")
    if problems:
        raise ConfigError("; ".join(problems))
    if dp_clip is not None and not dp_noise:
        warnings.warn(f"{owner}.dp_clip={dp_clip} without {owner}.dp_noise > 0 clips what {owner} shares but "
                      "adds no noise: no formal guarantee (no differential-privacy release)", UserWarning, stacklevel=3)
    return (None if dp_clip is None else float(dp_clip)), float(dp_noise or 0.0)


def require_classification(ctx: ClientCtx, name: str) -> None:
    """Raise :class:`ConfigError` unless the task is classification (label mixing needs classes)."""
    if ctx.task is None or ctx.task.name != "classification":
        raise ConfigError(f"{name} mixes class labels and needs a classification task, got "
                          f"'{getattr(ctx.task, 'name', None)}'; remove it from method.augs")
