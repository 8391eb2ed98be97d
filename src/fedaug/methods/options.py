"""Option validators and precondition checks shared by the method components (one home for all).

Each raises :class:`~fedaug.core.errors.ConfigError` with the option as the user writes it
(``fedprox.mu``), the value given, what is allowed and, where there is one, the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.methods.component import ClientCtx
from fedaug.privacy.noise import SCALES as NOISE_SCALES



def check_range(option: str, value: float, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> None:
    """Raise ``ConfigError("fedprox.mu must be >= 0, got -1")`` unless ``value`` is in range.

    Args:
        option: ``"<component>.<option>"``, as the user writes it in a config.
        value: the given value.
        lo, hi: the limits (``None``: unbounded); ``lo_open``/``hi_open`` exclude them.
    """
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and (value >= hi if hi_open else value > hi)
    if too_low or too_high:
        parts = []
        if lo is not None:
            parts.append(f"{'>' if lo_open else '>='} {lo:g}")
        if hi is not None:
            parts.append(f"{'<' if hi_open else '<='} {hi:g}")
        raise ConfigError(f"{option} must be {' and '.join(parts)}, got {value}")


def warn_like_fedavg(setting: str, method: str, same_as: str = "FedAvg") -> None:
    """Warn that an option value turns ``method`` into ``same_as`` (as Flower does for FedProx mu=0)."""
    warnings.warn(f"{setting} makes {method} identical to {same_as}", UserWarning, stacklevel=3)


def check_probability(owner: str, key: str, value: float) -> float:
    """``value`` if in [0, 1], else a :class:`ConfigError` naming ``owner.key``."""
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{owner}.{key} must be in [0, 1], got {value}")
    return float(value)


def check_choice(owner: str, key: str, value: str, allowed: Sequence[str]) -> str:
    """``value`` if in ``allowed``, else a :class:`ConfigError` listing the choices."""
    if value not in allowed:
        raise ConfigError(f"{owner}.{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


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
    """Raise :class:`ConfigError` naming ``owner`` unless ``std >= 0`` and ``scale`` is known."""
    problems = []
    if not isinstance(std, (int, float)) or std < 0:
        problems.append(f"{owner}.share_noise must be a number >= 0 (0 = no noise), got {std!r}")
    if scale not in NOISE_SCALES:
        problems.append(f"{owner}.share_noise_scale must be one of {', '.join(NOISE_SCALES)}, got {scale!r}")
    if problems:
        raise ConfigError("; ".join(problems))


def require_classification(ctx: ClientCtx, name: str) -> None:
    """Raise :class:`ConfigError` unless the task is classification (label mixing needs classes)."""
    if ctx.task is None or ctx.task.name != "classification":
        raise ConfigError(f"{name} mixes class labels and needs a classification task, got "
                          f"'{getattr(ctx.task, 'name', None)}'; remove it from method.augs")
