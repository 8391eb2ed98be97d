"""Comparison grids: methods x settings x seeds, from a grid file (TOML) or the command line.

A grid file names a base config (a preset or a TOML file) and partial configs that are merged into
it, deepest key last: ``base <- [common] <- [settings.S] <- [methods.M] <- --set overrides``, then
the grid sets ``seed``, ``name``, ``out_dir`` and caps ``threads``::

    # FedFA Table 5 stand-in on Digits-4         (first line: the one-line description)
    description = "FedFA vs FedFA-C and FedFA-R"
    kind = "stand-in"                # "paper": the paper's setting on its datasets; "stand-in": offline data
    reproduces = "FedFA (ICLR 2023), Table 5"
    base = "digits4"                 # preset or TOML file (relative to this file); default: schema defaults
    seeds = [0, 1, 2]
    baseline = "FedAvg"              # default: the first method
    paper_rounds = [400, 500]        # the paper's own training, all three keys or none (PaperScale):
    paper_local_epochs = 1           #   a count, a list (its datasets differ) or "not stated"
    paper_datasets = ["office_caltech10", "domainnet", "prostate_mri"]   # fedaug datasets of the paper's data
    pack = true                      # train cells of one step's shape as one program (fedaug compare --pack)
    [common]                         # merged into every cell
    train.rounds = 30
    [settings."mnist held out"]      # optional; each setting runs every method x seed
    data.options.held_out = "mnist"
    # augs_after = ["ccvr"]          # a setting's add-ons, appended to every method's method.augs
    [methods.FedAvg]                 # label = a partial config (may be empty), in table order
    [methods.FedFA]
    method.augs = ["fedfa"]

Shipped grids live in ``fedaug/presets/grids`` (``fedaug list grids``).
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedaug.config.load import apply_overrides, parse_config, read_toml, with_imports
from fedaug.config.paths import Layer, resolve_paths
from fedaug.config.presets import GRID_DIR, GRIDS, PRESETS, preset_path
from fedaug.config.schema import DataConfig, RunConfig
from fedaug.core.errors import ConfigError, FedaugError, suggest
from fedaug.data.bundle import federation_key
from fedaug.data.registry import DATASETS, check_dataset_options
from fedaug.methods.recipe import build_recipe
from fedaug.models.registry import MODELS

#: a grid's ``kind`` -> what the tables and reports say it means; as the grid file declares it, for any
#: grid, fedaug's or a user's, so it says nothing of where the data come from (the description and notes do)
KIND_MEANINGS = {"paper": "the paper's setting, as the grid declares: the paper's datasets and scale",
                 "stand-in": "a scaled stand-in for a published setting, as the grid declares: other data or a "
                             "smaller scale than the paper's"}
KINDS = tuple(KIND_MEANINGS)
#: the keys that declare the paper's own training (:class:`PaperScale`), given all together or not at all
PAPER_KEYS = ("paper_rounds", "paper_local_epochs", "paper_datasets")
FILE_KEYS = ("description", "kind", "reproduces", "notes", "base", "seeds", "baseline", "pack", *PAPER_KEYS, "common",
             "settings", "methods")
#: a ``paper_rounds`` or ``paper_local_epochs`` the paper does not give
NOT_STATED = "not stated"
#: keys the grid itself sets in every cell
RESERVED = ("seed", "name", "out_dir")
#: a settings-table key (not a config key): components appended to each method's ``method.augs``
#: (add-ons such as FedDecorr or CCVR that go with whatever augmentation the method column uses)
AUGS_AFTER = "augs_after"
DEFAULT_SETTING = "default"


def slug(label: str) -> str:
    """A directory name for a label: ``"FedFA (p=0.2)"`` -> ``"fedfa-p-0.2"``."""
    return re.sub(r"[^a-z0-9.+]+", "-", label.lower()).strip("-") or "x"


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` merged in: tables recursively, every other value replaced.

    >>> deep_merge({"train": {"lr": 0.1, "rounds": 5}}, {"train": {"rounds": 2}})
    {'train': {'lr': 0.1, 'rounds': 2}}
    """
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class PaperScale:
    """The training of the table a grid reproduces, as its paper states it (grid keys
    :data:`PAPER_KEYS`): what docs/results.md states each verdict's scale against.

    Attributes:
        rounds: the paper's communication rounds, one entry per count its datasets use (``(400, 500)``:
            400 on some, 500 on others), sorted; ``()``: the paper does not state them.
        local_epochs: the paper's local epochs per round, the same way.
        datasets: the fedaug datasets that load the paper's own data (``()``: fedaug loads none of them).
    """

    rounds: tuple[int, ...]
    local_epochs: tuple[int, ...]
    datasets: tuple[str, ...]

    def text(self) -> str:
        """``"400 x 1"`` (rounds x local epochs), ``"400/500 x 1"``, ``"not stated"`` when neither is stated.

        >>> PaperScale((400, 500), (1,), ()).text()
        '400/500 x 1'
        """
        if not self.rounds and not self.local_epochs:
            return NOT_STATED
        return " x ".join("/".join(map(str, v)) if v else NOT_STATED for v in (self.rounds, self.local_epochs))


@dataclass(frozen=True)
class GridSpec:
    """A comparison grid. Tables are partial configs (nested dicts), merged in the order
    ``base <- common <- settings[s] <- methods[m] <- overrides``.

    Attributes:
        name: the grid's name (file stem, or given on the command line); names the output directory.
        methods: label -> partial config, in table order (the first is the default baseline).
        seeds: the seeds every (setting, method) runs with.
        base: a preset name or a TOML path (resolved against ``root``); ``None``: schema defaults.
        settings: label -> partial config; one unnamed setting ``"default"`` when not given.
        baseline: the label each method is compared with.
        overrides: ``key=value`` strings applied last (``--set``).
        description, kind, reproduces, notes: what the grid is; ``kind`` is ``"paper"`` or ``"stand-in"``.
        root: directory that a relative ``base`` path, and relative ``imports`` of the grid's tables,
            are resolved against.
        imports: modules every cell imports (``--import``; added to each cell's ``imports``).
        paper: the paper's own training (``paper_*`` keys); ``None`` when the grid declares none.
        pack: whether ``fedaug compare`` packs the grid's cells by default (``--pack``, :mod:`fedaug.report.packing`).
    """

    name: str
    methods: dict[str, dict[str, Any]]
    seeds: list[int]
    base: str | None = None
    common: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, dict[str, Any]] = field(default_factory=lambda: {DEFAULT_SETTING: {}})
    baseline: str = ""
    overrides: list[str] = field(default_factory=list)
    description: str = ""
    kind: str = ""
    reproduces: str = ""
    notes: str = ""
    root: Path = Path(".")
    imports: list[str] = field(default_factory=list)
    paper: PaperScale | None = None
    pack: bool = False

    def base_layer(self) -> Layer:
        """The base config as a nested dict (a preset, a TOML file or ``{}``) and its folder."""
        if self.base is None:
            return {}, self.root
        path = preset_path(self.base) if self.base in PRESETS else self.root / self.base
        return with_imports(read_toml(path), path.parent), path.parent

    def raw(self, setting: str, method: str, seed: int) -> dict[str, Any]:
        """The nested config dict of one cell, before ``name``/``out_dir``/``threads`` are set; its
        imports and path options absolute (docs/cli.md, "Paths in a config": the base file's against
        its folder, the grid's tables' against the grid file's, ``--set``'s against the current
        directory)."""
        table = dict(self.settings[setting])
        after = list(table.pop(AUGS_AFTER, []))
        tables = deep_merge(deep_merge(self.common, table), self.methods[method])
        base, base_dir = self.base_layer()
        merged = with_imports(deep_merge(base, tables), self.root)
        if after:
            section = merged.setdefault("method", {})
            section["augs"] = [*section.get("augs", []), *after]
        merged = with_imports(apply_overrides(merged, self.overrides), Path.cwd(), self.imports)
        merged = resolve_paths(merged, [(base, base_dir), (tables, self.root),
                                        (apply_overrides({}, self.overrides), Path.cwd())])
        merged["seed"] = seed
        return merged

    def meta(self) -> dict[str, Any]:
        """What the tables and reports show about the grid (JSON-serialisable)."""
        return {"name": self.name, "description": self.description, "kind": self.kind,
                "reproduces": self.reproduces, "notes": self.notes, "base": self.base, "baseline": self.baseline,
                "seeds": self.seeds, "settings": list(self.settings), "methods": list(self.methods),
                "overrides": self.overrides}


def _problems_of_table(where: str, table: Any, problems: list[str]) -> dict[str, dict[str, Any]]:
    """Check a ``label -> partial config`` table; return it (empty when malformed)."""
    if not isinstance(table, dict):
        problems.append(f"'{where}' must be a table of tables ([{where}.LABEL]), got {table!r}")
        return {}
    for label, part in table.items():
        if not isinstance(part, dict):
            problems.append(f"'{where}.{label}' must be a table (a partial config), got {part!r}; "
                            f"write [{where}.\"{label}\"] followed by key = value lines")
            continue
        for key in RESERVED:
            if key in part:
                problems.append(f"'{where}.{label}' sets '{key}', which the grid sets per cell; remove it "
                                "(seeds: the grid's 'seeds'; output: --out)")
        if AUGS_AFTER in part and (where != "settings" or not isinstance(part[AUGS_AFTER], list)
                                   or not all(isinstance(a, str) for a in part[AUGS_AFTER])):
            problems.append(f"'{where}.{label}.{AUGS_AFTER}' must be a list of component names in a settings "
                            f"table, got {part[AUGS_AFTER]!r}")
    return {k: v for k, v in table.items() if isinstance(v, dict)}


def _paper_count(key: str, value: Any, problems: list[str]) -> tuple[int, ...]:
    """A ``paper_rounds`` or ``paper_local_epochs`` value as sorted counts (``()``: "not stated")."""
    if value == NOT_STATED:
        return ()
    counts = value if isinstance(value, list) else [value]
    if counts and all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts) \
            and len(set(counts)) == len(counts):
        return tuple(sorted(counts))
    problems.append(f"'{key}' must be a count >= 1, a list of distinct counts (one per count the paper's datasets "
                    f"use) or \"{NOT_STATED}\" (the paper does not give it), got {value!r}")
    return ()


def _paper_scale(raw: dict[str, Any], problems: list[str]) -> PaperScale | None:
    """The grid file's :data:`PAPER_KEYS` as a :class:`PaperScale` (``None`` when it gives none)."""
    given = [key for key in PAPER_KEYS if key in raw]
    if not given:
        return None
    if len(given) < len(PAPER_KEYS):
        problems.append(f"the paper's scale needs {', '.join(PAPER_KEYS)} together; add "
                        f"{', '.join(k for k in PAPER_KEYS if k not in raw)} (or remove {', '.join(given)})")
        return None
    datasets = raw["paper_datasets"]
    if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
        problems.append("'paper_datasets' must be a list of dataset names (fedaug list datasets; [] when fedaug "
                        f"loads none of the paper's datasets), got {datasets!r}")
        datasets = []
    for name in datasets:
        try:
            DATASETS.get(name)
        except ConfigError as exc:
            problems.append(f"'paper_datasets': {exc}")
    return PaperScale(_paper_count("paper_rounds", raw["paper_rounds"], problems),
                      _paper_count("paper_local_epochs", raw["paper_local_epochs"], problems), tuple(datasets))


def parse_grid(raw: dict[str, Any], name: str, root: Path = Path("."), *, seeds: Sequence[int] | None = None,
               baseline: str | None = None, overrides: Sequence[str] = (), imports: Sequence[str] = ()) -> GridSpec:
    """Build a :class:`GridSpec` from a grid file's contents and check every cell's config.

    Args:
        raw: the parsed TOML (see the module docstring for its keys).
        name: the grid's name.
        root: directory of the grid file (a relative ``base`` is resolved against it).
        seeds, baseline, overrides: command-line values; ``seeds`` and ``baseline`` replace the file's.
        imports: modules every cell imports (``--import``), see :class:`GridSpec`.

    Raises:
        ConfigError: every problem found, one per line: unknown keys, a bad kind, seeds or
            baseline, a malformed table, and each cell's config errors (unknown keys, method,
            dataset, model or option names), naming the setting and method.
    """
    problems: list[str] = []
    for key in raw:
        if key not in FILE_KEYS:
            problems.append(f"unknown grid key '{key}'{suggest(key, FILE_KEYS)}; valid keys: {', '.join(FILE_KEYS)}")
    for key in ("description", "kind", "reproduces", "notes", "base", "baseline"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"'{key}' must be a string, got {raw[key]!r}")
    if not isinstance(raw.get("pack", False), bool):
        problems.append(f"'pack' must be true or false, got {raw['pack']!r}")
    kind = raw.get("kind", "")
    if kind and kind not in KINDS:
        problems.append(f"'kind' must be one of {', '.join(KINDS)}, got {kind!r}{suggest(str(kind), KINDS)}")
    seeds = list(raw.get("seeds", [0]) if seeds is None else seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) \
            or len(set(seeds)) != len(seeds):
        problems.append(f"'seeds' must be a non-empty list of distinct integers >= 0, got {seeds!r}")
    if not raw.get("methods"):
        problems.append("the grid has no methods; add at least one [methods.LABEL] table")
    methods = _problems_of_table("methods", raw.get("methods") or {}, problems)
    settings = _problems_of_table("settings", raw.get("settings", {DEFAULT_SETTING: {}}), problems) \
        or {DEFAULT_SETTING: {}}
    common = raw.get("common", {})
    if not isinstance(common, dict):
        problems.append(f"'common' must be a table (a partial config), got {common!r}")
        common = {}
    for key in RESERVED:
        if key in common:
            problems.append(f"'common' sets '{key}', which the grid sets per cell; remove it")
    for where, table in (("methods", methods), ("settings", settings)):
        by_dir: dict[str, str] = {}
        for label in table:
            if slug(label) in by_dir:
                problems.append(f"{where} {by_dir[slug(label)]!r} and {label!r} map to the same directory "
                                f"'{slug(label)}'; rename one")
            by_dir.setdefault(slug(label), label)
    base = raw.get("base") if isinstance(raw.get("base"), str) else None
    if base is not None and base not in PRESETS and not (root / base).is_file():
        problems.append(f"'base' = {base!r} is neither a preset nor a TOML file (relative to {root}); "
                        f"presets: {', '.join(PRESETS)}{suggest(base, PRESETS)}")
    baseline = baseline if baseline is not None else raw.get("baseline") or next(iter(methods), "")
    if methods and baseline not in methods:
        problems.append(f"baseline {baseline!r} is not a method of the grid; choose from {', '.join(methods)}"
                        f"{suggest(str(baseline), methods)}")
    paper = _paper_scale(raw, problems)
    if problems:
        raise ConfigError(f"grid '{name}' is invalid:\n  " + "\n  ".join(problems))
    spec = GridSpec(name=name, methods=methods, seeds=seeds, base=base, common=common, settings=settings,
                    baseline=baseline, overrides=list(overrides), description=raw.get("description", ""),
                    kind=kind, reproduces=raw.get("reproduces", ""), notes=raw.get("notes", ""), root=root,
                    imports=list(imports), paper=paper, pack=raw.get("pack", False))
    check_cells(spec)
    return spec


def check_cell(cfg: RunConfig) -> None:
    """Check what the schema does not: method, dataset and model names and option names (no data
    is loaded, no model is built)."""
    build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options)
    check_dataset_options(cfg.data.name, cfg.data.options)
    MODELS.get(cfg.model.name)


def check_cells(spec: GridSpec) -> None:
    """Validate the config of every (setting, method); raise one ConfigError listing each failure."""
    problems = []
    for setting in spec.settings:
        for method in spec.methods:
            where = f"method '{method}'" + (f" in setting '{setting}'" if setting != DEFAULT_SETTING else "")
            try:
                check_cell(parse_config(spec.raw(setting, method, spec.seeds[0])))
            except FedaugError as exc:
                problems.append(f"{where}: {str(exc).replace(chr(10), chr(10) + '    ')}")
    if problems:
        raise ConfigError(f"grid '{spec.name}' has invalid cells:\n  " + "\n  ".join(problems))


def select(spec: GridSpec, methods: Sequence[str] = (), settings: Sequence[str] = ()) -> GridSpec:
    """The part of ``spec`` with only the given methods and settings (every one where empty), in the
    grid's order. The baseline is always kept, so that each method keeps its comparison; the
    cells' configs (and so their run directories) are those of the whole grid, so runs made on
    the part count for the whole grid and the other way round (e.g. more seeds for two methods:
    ``fedaug compare GRID --only-methods A --seeds 0 1 2 3 4``).

    >>> g = grid_from_args(None, [["FedAvg"], ["FedProx", "method.base=fedprox"], ["FedBN", "method.base=fedbn"]],
    ...                    [], [0])
    >>> list(select(g, methods=["FedBN"]).methods)
    ['FedAvg', 'FedBN']

    Raises:
        ConfigError: a label that is not in the grid (naming the grid's labels).
    """
    problems = []
    for kind, given, table in (("method", methods, spec.methods), ("setting", settings, spec.settings)):
        for label in given:
            if label not in table:
                problems.append(f"--only-{kind}s: {label!r} is not a {kind} of grid '{spec.name}'; choose from "
                                f"{', '.join(map(repr, table))}{suggest(label, table)}")
    if problems:
        raise ConfigError("\n".join(problems))
    keep_methods = {*methods, spec.baseline} if methods else set(spec.methods)
    keep_settings = set(settings) if settings else set(spec.settings)
    return replace(spec, methods={k: v for k, v in spec.methods.items() if k in keep_methods},
                   settings={k: v for k, v in spec.settings.items() if k in keep_settings})


def load_grid(source: str, *, seeds: Sequence[int] | None = None, baseline: str | None = None,
              overrides: Sequence[str] = (), imports: Sequence[str] = ()) -> GridSpec:
    """Load a grid file, or a shipped grid by name (``fedaug list grids``), and validate it."""
    if source in GRIDS:
        path = GRID_DIR / f"{source}.toml"
    elif source.endswith(".toml") or Path(source).exists():
        path = Path(source)
    else:
        raise ConfigError(f"'{source}' is neither a shipped grid nor a grid file; grids: {', '.join(GRIDS)}"
                          f"{suggest(source, GRIDS)}")
    if not path.is_file():
        raise ConfigError(f"grid file '{path}' does not exist; give a grid TOML file or a grid name "
                          f"({', '.join(GRIDS)})")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"grid file '{path}' is not valid TOML: {exc}") from None
    return parse_grid(raw, path.stem, path.parent, seeds=seeds, baseline=baseline, overrides=overrides,
                      imports=imports)


def content_name(spec: GridSpec) -> str:
    """What a grid compares, as its name: its datasets and its method labels (:func:`slug`), e.g.
    ``synthetic-fedavg-fedfa``; a grid made on the command line is named so (its output directory
    ``runs/compare/<name>`` and its tables' title)."""
    datasets = dict.fromkeys(str(spec.raw(s, spec.baseline, spec.seeds[0]).get("data", {}).get("name", DataConfig.name))
                             for s in spec.settings)
    return "-".join(["+".join(map(slug, datasets)), *map(slug, spec.methods)])


def grid_from_args(base: str | None, methods: Sequence[Sequence[str]], settings: Sequence[Sequence[str]],
                   seeds: Sequence[int], *, baseline: str | None = None, overrides: Sequence[str] = (),
                   imports: Sequence[str] = ()) -> GridSpec:
    """A grid from the command line: ``methods``/``settings`` are ``[LABEL, key=value, ...]`` lists;
    named after what it compares (:func:`content_name`).

    >>> g = grid_from_args("digits4", [["FedAvg"], ["FedFA", "method.augs=[fedfa]"]], [], [0, 1])
    >>> g.methods, g.name
    ({'FedAvg': {}, 'FedFA': {'method': {'augs': ['fedfa']}}}, 'digits4-fedavg-fedfa')
    """
    def table(kind: str, items: Sequence[Sequence[str]]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for label, *pairs in items:
            if "=" in label:
                raise ConfigError(f"--{kind} takes a label first, then key=value overrides; got {label!r} "
                                  f"(e.g. --{kind} FedFA method.augs=[fedfa])")
            if label in out:
                raise ConfigError(f"--{kind} label {label!r} is given twice; labels must be distinct")
            out[label] = apply_overrides({}, pairs)
        return out

    raw: dict[str, Any] = {"seeds": list(seeds), "methods": table("method", methods)}
    if base is not None:
        raw["base"] = base
    if settings:
        raw["settings"] = table("setting", settings)
    spec = parse_grid(raw, "command line", Path("."), baseline=baseline, overrides=overrides, imports=imports)
    return replace(spec, name=content_name(spec))


def cell_federations(spec: GridSpec) -> list[tuple[str, int, dict[str, Any]]]:
    """The federation each cell of ``spec`` loads, ``(dataset, seed, options)``, without repeats, in the order of
    the cells (what ``fedaug data export`` bundles: :mod:`fedaug.data.bundle`)."""
    out: dict[str, tuple[str, int, dict[str, Any]]] = {}
    for seed in spec.seeds:
        for setting in spec.settings:
            for method in spec.methods:
                data = parse_config(spec.raw(setting, method, seed)).data
                out.setdefault(federation_key(data.name, seed, data.options), (data.name, seed, data.options))
    return list(out.values())
