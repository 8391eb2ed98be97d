"""The dataset registry: name -> builder ``(seed, **options) -> FederatedData``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fedaug.core.errors import ConfigError, suggest
from fedaug.core.registry import Registry
from fedaug.data.base import FederatedData

Builder = Callable[..., FederatedData]
DATASETS: Registry[Builder] = Registry("dataset")


def check_options(kind: str, name: str, fn: Callable[..., Any], options: dict[str, Any]) -> None:
    """Raise one :class:`ConfigError` naming every option ``fn`` does not accept.

    Used for every ``[section.options]`` table: the valid option names are ``fn``'s keyword
    parameters (``seed`` excluded).
    """
    params = [
        p
        for p, v in inspect.signature(fn).parameters.items()
        if v.kind is inspect.Parameter.KEYWORD_ONLY and p != "seed"
    ]
    bad = [k for k in options if k not in params]
    if bad:
        msgs = [f"'{k}'{suggest(k, params)}" for k in bad]
        raise ConfigError(
            f"{kind} '{name}' has no option {', '.join(msgs)}; "
            f"its options are: {', '.join(params) or '(none)'}"
        )


def load_dataset(name: str, seed: int, **options: Any) -> FederatedData:
    """Build the registered dataset ``name`` with ``options`` (validated) and ``seed``."""
    builder = DATASETS.get(name)
    check_options("dataset", name, builder, options)
    return builder(seed=seed, **options)
