"""The path options of a run config, made absolute once, when the config is read.

Which options name files is declared where the option is, never listed here: a run-config field by
``opt(..., path=...)`` (:mod:`fedaug.config.schema`: ``log.mlflow``), the options of datasets,
models and method components by the annotation :data:`fedaug.core.paths.LocalPath`
(:func:`fedaug.core.paths.path_options`: ``data.options.root``). The rule (docs/cli.md, "Paths in a
config"): a relative value is taken from the folder of the TOML file that gives it, and from the
current directory when the command line (``key=value``, ``--set``) or Python code gives it; an
option declared inside another (``PathOption(within="root")``) from that option's directory. A run
directory's ``config.toml`` then names every file absolutely, so ``fedaug resume``, ``fedaug
compare`` and grid cells on Ray nodes find them from any directory.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedaug.config.schema import DataConfig, ModelConfig, RunConfig
from fedaug.core.errors import ConfigError
from fedaug.core.paths import PathOption, make_absolute, path_options
from fedaug.core.plugins import import_problems

#: the dotted key of an option, as a tuple: ``("data", "options", "root")``
Key = tuple[str, ...]
#: one source of a config (a TOML file's contents, the command line's overrides as a nested dict)
#: and the folder its relative paths are taken from
Layer = tuple[Mapping[str, Any], Path]
#: ``(raw config) -> [(key of an option table it has, the function whose keyword options fill it)]``
TableFinder = Callable[[Mapping[str, Any]], list[tuple[Key, Callable[..., Any]]]]

#: the option tables of packages above this one (:mod:`fedaug.methods` adds ``method.options.<component>``
#: when it is imported, which every command that reads a config has done: it builds the method)
TABLES: list[TableFinder] = []
_MISSING = object()


def declare_tables(find: TableFinder) -> TableFinder:
    """Register ``find`` (a :data:`TableFinder`) with :data:`TABLES`; returns it (a decorator)."""
    TABLES.append(find)
    return find


@functools.cache
def schema_paths(cls: type = RunConfig, prefix: Key = ()) -> dict[Key, PathOption]:
    """The run-config fields declared with ``opt(..., path=...)``, by key (nested tables walked)."""
    found: dict[Key, PathOption] = {}
    types = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(types[f.name]):
            found.update(schema_paths(types[f.name], (*prefix, f.name)))
        elif f.metadata.get("path") is not None:
            found[(*prefix, f.name)] = f.metadata["path"]
    return found


def _table(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    return value if isinstance(value, Mapping) else {}


def _builder_tables(raw: Mapping[str, Any]) -> list[tuple[Key, Callable[..., Any]]]:
    """``data.options`` and ``model.options`` with the builder of the dataset and model ``raw`` names
    (an unknown name is left to the validator)."""
    from fedaug.data.registry import DATASETS
    from fedaug.models.registry import MODELS

    out: list[tuple[Key, Callable[..., Any]]] = []
    for section, registry, default in (("data", DATASETS, DataConfig.name), ("model", MODELS, ModelConfig.name)):
        try:
            out.append(((section, "options"), registry.get(str(_table(raw, section).get("name", default)))))
        except ConfigError:
            continue
    return out


def path_keys(raw: Mapping[str, Any]) -> dict[Key, PathOption]:
    """Every path option a config with ``raw``'s names may hold, by key: the schema's, and those of
    its dataset, model and method components, once its ``imports`` are imported (they may register
    them; one that fails to import is left to the validator, which reports it)."""
    imports = raw.get("imports")
    if isinstance(imports, list) and all(isinstance(e, str) for e in imports):
        import_problems(imports)
    keys = dict(schema_paths())
    for table, fn in [*_builder_tables(raw), *(t for find in TABLES for t in find(raw))]:
        keys.update({(*table, name): option for name, option in path_options(fn).items()})
    return keys


def _get(raw: Mapping[str, Any], key: Key) -> Any:
    node: Any = raw
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _root(key: Key, option: PathOption, resolved: Mapping[str, Any], layers: Sequence[Layer]) -> Path | None:
    """Where a relative value of ``key`` is taken from: its anchor option's directory (``within``;
    ``None`` when that is unset), else the folder of the last layer that gives it, else the current
    directory."""
    if option.within:
        anchor = _get(resolved, (*key[:-1], option.within))
        return Path(anchor) if isinstance(anchor, str) and anchor else None
    return next((folder for layer, folder in reversed(layers) if _get(layer, key) is not _MISSING), Path.cwd())


def resolve_paths(raw: Mapping[str, Any], layers: Sequence[Layer] = ()) -> dict[str, Any]:
    """A copy of ``raw`` (a merged config) with every path option it holds (:func:`path_keys`) made
    absolute (:func:`fedaug.core.paths.make_absolute`) against the folder of the last of ``layers``
    (in merge order) that gives it, or the current directory where none does; an option declared
    ``within`` another against that one's directory, after it. Absolute values stay as they are, so
    resolving again changes nothing.

    >>> raw = {"data": {"name": "image_folder", "options": {"root": "imgs", "split": "s.csv"}},
    ...        "log": {"mlflow": "sqlite:///m.db"}}
    >>> out = resolve_paths(raw, [(raw, Path("/exp"))])
    >>> out["data"]["options"], out["log"]
    ({'root': '/exp/imgs', 'split': '/exp/imgs/s.csv'}, {'mlflow': 'sqlite:////exp/m.db'})
    """
    out = copy.deepcopy(dict(raw))
    for key, option in sorted(path_keys(raw).items(), key=lambda item: bool(item[1].within)):
        value = _get(out, key)
        root = _root(key, option, out, layers)
        if value is _MISSING or root is None:
            continue
        node = out
        for part in key[:-1]:
            node = node[part]
        node[key[-1]] = make_absolute(value, option, root)
    return out
