"""``fedaug list [KIND [NAME]]``: what is available, one line each; a method's, dataset's or model's
options (type, default, allowed values, help); the config keys; a preset's or grid's file.

Reads the shipped catalog (:mod:`fedaug.cli.catalog`), so that it imports no torch; with your own
modules (``--import``, installed plugins) it imports them and lists the live registries.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedaug.cli.run_cmd import add_import_flag, import_now
from fedaug.config.presets import GRID_DIR, GRIDS, PRESETS, preset_path
from fedaug.core.errors import ConfigError, unknown_name

KINDS = ("methods", "datasets", "models", "presets", "grids", "keys")
#: where a kind's options go in a run config, and a ``key=value`` that picks an entry
WHERE = {"methods": "method.options.{name}", "datasets": "data.options", "models": "model.options"}


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("list", help="list methods, datasets, models, presets, grids or config keys; a NAME's options",
                       description="List what fedaug provides, one line each. With a NAME: a method's, dataset's "
                                   "or model's options (type, default, allowed values, help), the config keys "
                                   "under a prefix (fedaug list keys train), or a preset's or grid's TOML file.",
                       epilog="Examples: fedaug list;  fedaug list methods fedfa;  fedaug list datasets digits4;  "
                              "fedaug list keys train;  fedaug list methods --import my_components.py")
    p.add_argument("kind", nargs="?", choices=KINDS, help="what to list (default: all but keys)")
    p.add_argument("name", nargs="?", help="one entry of KIND to describe (keys: a prefix)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_import_flag(p)
    p.set_defaults(func=main)


def catalog(args: argparse.Namespace) -> dict[str, Any]:
    """The catalog to list: the shipped one, or the live registries when modules of yours are
    imported (``--import``, or installed plugins: :func:`fedaug.core.plugins.installed`)."""
    from fedaug.cli.catalog import load
    from fedaug.core.plugins import installed, load_installed

    live = bool(import_now(args)) or bool(installed())
    if live:
        load_installed()
    return load(live)


def value_text(value: Any) -> str:
    """A default as a config writes it (``"fused"``, ``0.5``, ``true``, ``[1, 2]``); ``None``: unset.

    >>> value_text(None), value_text("fused"), value_text(True), value_text([200, 200])
    ('unset', '"fused"', 'true', '[200, 200]')
    """
    return "unset" if value is None else json.dumps(value)


def options_table(options: dict[str, dict[str, Any]], head: str = "option") -> str:
    """One row per option (``head``: the first column's title): name, type, default, allowed values
    (choices or bounds), the first sentence of its help."""
    from fedaug.core.options import first_sentence

    rows = [(head, "type", "default", "allowed", "help")]
    for name, o in options.items():
        allowed = ", ".join(c if isinstance(c, str) else value_text(c) for c in o["choices"]) or o["bounds"]
        rows.append((name, o["type"], "required" if o["required"] else value_text(o["default"]), allowed,
                     first_sentence(o["help"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(f"{c:<{w}}" for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows).rstrip()


def example(kind: str, name: str, entry: dict[str, Any]) -> str:
    """A ``fedaug run`` command (on the default preset) that uses ``name`` and sets its first option
    that has a default."""
    pick = {"methods": f"method.base={name}" if entry.get("role") == "server" else f"method.augs=[{name}]",
            "datasets": f"data.name={name}", "models": f"model.name={name}"}[kind]
    first = next(((k, o) for k, o in entry["options"].items() if not o["required"] and o["default"] is not None),
                 None)
    setting = f" {WHERE[kind].format(name=name)}.{first[0]}={value_text(first[1]['default'])}" if first else ""
    return f"fedaug run {pick}{setting}"


def describe(kind: str, name: str, entry: dict[str, Any]) -> str:
    """The text of ``fedaug list KIND NAME``."""
    role = f" ({entry['role']})" if "role" in entry else ""
    lines = [f"{name}{role}: {entry['help']}"]
    if entry["options"]:
        lines += [f"options: {WHERE[kind].format(name=name)}.<option>, e.g. {example(kind, name, entry)}", "",
                  options_table(entry["options"])]
    else:
        lines.append("no options")
    return "\n".join(lines)


def rows(kind: str, cat: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, one-line description) pairs of one kind."""
    if kind == "methods":
        return [(n, f"[{e['role']}] {e['help']}") for n, e in cat["methods"].items()]
    if kind in ("datasets", "models"):
        return [(n, e["help"]) for n, e in cat[kind].items()]
    if kind == "presets":
        return sorted(PRESETS.items())
    if kind == "grids":
        return sorted(GRIDS.items())
    raise ValueError(f"unknown kind '{kind}'; choose from {', '.join(KINDS)}")


def _one(args: argparse.Namespace) -> int:
    """``fedaug list KIND NAME``."""
    kind, name = args.kind, args.name
    if kind in ("presets", "grids"):
        files = PRESETS if kind == "presets" else GRIDS
        if name not in files:
            raise ConfigError(unknown_name(kind[:-1], name, files))
        print((preset_path(name) if kind == "presets" else GRID_DIR / f"{name}.toml").read_text(), end="")
        return 0
    cat = catalog(args)
    if kind == "keys":
        keys = {k: o for k, o in cat["keys"].items() if k == name or k.startswith(f"{name}.")}
        if not keys:
            sections = sorted({k.split(".")[0] for k in cat["keys"] if "." in k})
            raise ConfigError(f"no config key is '{name}' or starts with '{name}.'; sections: {', '.join(sections)}")
        print(json.dumps(keys, indent=2) if args.format == "json" else options_table(keys, "key"))
        return 0
    if name not in cat[kind]:
        raise ConfigError(unknown_name(kind[:-1], name, cat[kind]))
    entry = cat[kind][name]
    print(json.dumps({name: entry}, indent=2) if args.format == "json" else describe(kind, name, entry))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.name is not None:
        if args.kind is None:
            raise ConfigError(f"give the kind before a name: fedaug list methods {args.name} (or datasets, models)")
        return _one(args)
    kinds = [args.kind] if args.kind else [k for k in KINDS if k != "keys"]
    cat = catalog(args) if set(kinds) & {"methods", "datasets", "models", "keys"} else {}
    if kinds == ["keys"]:
        keys = cat["keys"]
        print(json.dumps({"keys": keys}, indent=2) if args.format == "json"
              else options_table(keys, "key"))
        return 0
    listing = {k: rows(k, cat) for k in kinds}
    if args.format == "json":
        print(json.dumps({k: dict(v) for k, v in listing.items()}, indent=2))
        return 0
    for k, items in listing.items():
        print(f"{k}:")
        width = max((len(n) for n, _ in items), default=0)
        for n, h in items:
            print(f"  {n:<{width}}  {h}")
    return 0
