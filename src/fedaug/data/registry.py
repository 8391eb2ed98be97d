"""The dataset registry: name -> builder ``(seed, **options) -> FederatedData``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedaug.core.errors import ConfigError, suggest
from fedaug.core.options import option_types
from fedaug.core.registry import Registry
from fedaug.core.typecheck import allowed, fits, is_numeric
from fedaug.data.base import FederatedData, hold_out_group
from fedaug.data.bundle import bundled_federation

Builder = Callable[..., FederatedData]
DATASETS: Registry[Builder] = Registry("dataset")


#: where each kind's options sit in a run config
OPTION_TABLES = {"dataset": "data.options", "model": "model.options", "method": "method.options.{name}"}


def check_options(kind: str, name: str, fn: Callable[..., Any], options: dict[str, Any],
                  extra: tuple[str, ...] = ()) -> None:
    """Raise one :class:`ConfigError` naming every option ``fn`` does not accept, and every number
    or flag that does not fit its parameter's annotation (:func:`fedaug.core.typecheck.fits`: an
    integer option given ``2.5``, a number given NaN or inf, a flag given ``1``), by its config key.
    String options are left to ``fn``, which checks them (a ``Literal`` annotation's values:
    :func:`fedaug.core.typecheck.choices`).

    Used for every ``[section.options]`` table: the valid option names are :func:`option_types`
    of ``fn`` and ``extra``.

    Args:
        kind: ``"dataset"``, ``"model"`` or ``"method"`` (see :data:`OPTION_TABLES`).
    """
    types = {**option_types(fn), **dict.fromkeys(extra, Any)}
    problems: list[str] = []
    unknown = [f"'{k}'{suggest(k, types)}" for k in options if k not in types]
    if unknown:
        problems.append(f"{kind} '{name}' has no option {', '.join(unknown)}; its options are: "
                        f"{', '.join(types) or '(none)'}")
    table = OPTION_TABLES[kind].format(name=name)
    whose = "" if "{name}" in OPTION_TABLES[kind] else f" ({kind} '{name}')"
    problems += [f"{table}.{k} must be {allowed(types[k])}, got {v!r}{whose}"
                 for k, v in options.items() if k in types and is_numeric(types[k]) and not fits(v, types[k])]
    if problems:
        raise ConfigError("; ".join(problems))


#: options every dataset accepts, applied here after the dataset's builder, with their help
COMMON_OPTIONS = {"held_out": "a client group (domain, site) left out of training; every remaining client is tested "
                              "on its test samples (leave-one-domain-out)"}


def check_dataset_options(name: str, options: dict[str, Any]) -> None:
    """Raise one :class:`ConfigError` naming every option dataset ``name`` does not accept and every
    number or flag of the wrong type (see :func:`check_options`)."""
    check_options("dataset", name, DATASETS.get(name), options, tuple(COMMON_OPTIONS))


def load_dataset(name: str, seed: int, **options: Any) -> FederatedData:
    """The registered dataset ``name`` with ``options`` (validated) and ``seed``: read from the data bundle that
    ``$FEDAUG_DATA_BUNDLE`` names where it holds it (:mod:`fedaug.data.bundle`; the same tensors, bit for bit),
    else built (:func:`build_dataset`)."""
    check_dataset_options(name, options)
    bundled = bundled_federation(name, seed, options)
    return bundled if bundled is not None else build_dataset(name, seed, **options)


def build_dataset(name: str, seed: int, **options: Any) -> FederatedData:
    """Build the registered dataset ``name`` with ``options`` (validated) and ``seed``, never from a bundle.

    Every dataset also takes ``held_out``: a client group (domain, site) left out of training
    and used as every remaining client's test data (:func:`fedaug.data.base.hold_out_group`).
    """
    check_dataset_options(name, options)
    held_out = options.pop("held_out", None)
    data = DATASETS.get(name)(seed=seed, **options)
    return data if held_out is None else hold_out_group(data, held_out)
