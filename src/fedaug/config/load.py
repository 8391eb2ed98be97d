"""Reading configs (TOML file or preset), ``key=value`` overrides, and writing the resolved TOML."""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedaug.config.paths import Layer, resolve_paths
from fedaug.config.presets import PRESETS, preset_path
from fedaug.config.schema import RunConfig, run_name, validate
from fedaug.core.errors import ConfigError, suggest
from fedaug.core.plugins import resolve_imports


def parse_value(text: str) -> Any:
    """Parse an override value as TOML (``0.1``, ``true``, ``"a"``, ``[1, 2]``); bare words are
    strings and ``[a, b]`` is a list of bare words.

    >>> parse_value("0.5"), parse_value("sgd"), parse_value("[fedrdn, fedfa]")
    (0.5, 'sgd', ['fedrdn', 'fedfa'])
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    s = text.strip()
    if s.startswith("[") and s.endswith("]"):
        return [parse_value(item) for item in s[1:-1].split(",") if item.strip()]
    return s


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str], *, what: str = "override",
                    example: str = "train.lr=0.05") -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``dotted.key=value`` applied (tables created as needed,
    values read by :func:`parse_value`): the one ``key=value`` parser of every command.

    Args:
        what, example: what the strings are and a valid one, for the error message.

    Raises:
        ConfigError: an override without ``=`` or with an empty key.
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{what} '{item}' is not of the form key=value (e.g. {example})")
        *tables, leaf = key.strip().split(".")
        node = out
        for t in tables:
            node = node.setdefault(t, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}': '{t}' is a value, not a table")
        node[leaf] = parse_value(value)
    return out


def read_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file, with errors that name the file and the fix."""
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; give a TOML file or a preset ({', '.join(PRESETS)})")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file '{path}' is not valid TOML: {exc}") from None


def with_imports(raw: dict[str, Any], root: Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    """``raw`` with its ``imports`` and ``extra`` resolved against ``root``
    (:func:`fedaug.core.plugins.resolve_import`: relative paths, and modules found only in ``root``,
    become absolute paths); ``raw`` itself when there is nothing to resolve, or when ``imports`` is
    not a list of strings (the validator reports it)."""
    given = raw.get("imports", [])
    if not (given or extra) or not isinstance(given, list) or not all(isinstance(e, str) for e in given):
        return raw
    return {**raw, "imports": resolve_imports([*given, *extra], root)}


def load_config(source: str | None = None, overrides: Sequence[str] = (),
                imports: Sequence[str] = ()) -> tuple[RunConfig, str]:
    """Resolve a config from a preset name or TOML path (default preset when ``None``) plus overrides.

    Args:
        source: a preset name or a TOML file (default: the ``digits4`` preset).
        overrides: ``key=value`` strings (:func:`apply_overrides`).
        imports: modules to add to the config's ``imports`` (``--import``), resolved against the
            current directory; the file's own ``imports`` are resolved against its directory.
            Path options (a dataset's ``root``) are made absolute the same way: the file's against
            its directory, the overrides' against the current one (docs/cli.md, "Paths in a config").

    Returns:
        The validated config, named after what it runs when it has no ``name``
        (:func:`~fedaug.config.schema.run_name`), and a label of where it came from (preset name or
        file path).
    """
    source = source or "digits4"
    if source in PRESETS:
        path, label = preset_path(source), source
    elif source.endswith(".toml") or Path(source).exists():
        path, label = Path(source), source
    else:
        raise ConfigError(
            f"'{source}' is neither a preset nor a TOML file; presets: {', '.join(PRESETS)}"
            f"{suggest(source, PRESETS)}"
        )
    file = with_imports(read_toml(path), path.parent)
    raw = with_imports(apply_overrides(file, overrides), Path.cwd(), imports)
    cfg = parse_config(raw, [(file, path.parent), (apply_overrides({}, overrides), Path.cwd())])
    cfg.name = run_name(cfg)
    return cfg, label


def parse_config(raw: dict[str, Any], layers: Sequence[Layer] = ()) -> RunConfig:
    """Validate a nested dict into a :class:`RunConfig` (see :func:`fedaug.config.schema.validate`), its
    path options made absolute first (:func:`fedaug.config.paths.resolve_paths`): each against the
    folder of the last of ``layers`` that gives it, else the current directory (a dict built in
    Python; a run's ``config.toml``, which holds them absolute already)."""
    return validate(resolve_paths(raw, layers))


#: TOML's bare keys; any other key is written as a quoted (basic string) key
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
#: the short escapes of TOML basic strings; other control characters are written as \\uXXXX
_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def toml_string(s: str) -> str:
    """``s`` as a TOML basic string: quotes, backslashes and control characters escaped, so it reads
    back exactly.

    >>> print(toml_string('a "b"\\n\\x00'))
    "a \\"b\\"\\n\\u0000"
    """
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
                         for c in s) + '"'


def _toml_key(k: Any) -> str:
    if not isinstance(k, str):
        raise ConfigError(f"cannot write the key {k!r} ({type(k).__name__}) to TOML; keys are strings")
    return k if _BARE_KEY.fullmatch(k) else toml_string(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # TOML spells nan, inf and -inf as Python's repr does
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # only inside an array: an inline table
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise ConfigError(f"cannot write {v!r} ({type(v).__name__}) to TOML")


def _table(d: dict[str, Any], path: tuple[str, ...]) -> list[str]:
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, dict)]
    for k, v in d.items():
        if isinstance(v, dict):
            sub = (*path, _toml_key(k))
            lines += ["", f"[{'.'.join(sub)}]", *_table(v, sub)]
    return lines


def dump_toml(d: dict[str, Any]) -> str:
    """Write a nested dict of strings, numbers, booleans, lists and tables as TOML (tables after
    values) that :func:`tomllib.loads` reads back equal to ``d``: strings are escaped, keys that are
    not bare words are quoted, tables inside lists are inline tables.

    Raises:
        ConfigError: a value TOML cannot hold (``None``, an object) or a key that is not a string.

    >>> print(dump_toml({"name": "a\\nb", "data": {"options": {"my key": [1.5, {"x": True}]}}}), end="")
    name = "a\\nb"
    <BLANKLINE>
    [data]
    <BLANKLINE>
    [data.options]
    "my key" = [1.5, {x = true}]
    """
    return "\n".join(_table(d, ())).lstrip("\n") + "\n"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (empty tables kept as values)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
