"""Reading finished runs (a grid directory or loose run directories) and summarising them per
(setting, method) over seeds: the numbers every table and report shows come from here only."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fedaug.config.load import read_toml
from fedaug.core.errors import ConfigError
from fedaug.engine.records.rundir import CONFIG, SUMMARY, RunDir
from fedaug.report.grid import DEFAULT_SETTING
from fedaug.report.incidents import run_incidents
from fedaug.report.runner import GRID_FILE, IGNORED, cell_dir, find_run, flatten
from fedaug.report.stats import mean_std, paired_ttest

WHICH = ("final", "best")
#: the spread figures across clients each cell summarises (:func:`fedaug.metrics.spread.client_spread`)
SPREAD = ("std", "min", "worst10")


def _number(x: float | None) -> float:
    """A recorded metric: ``null`` in JSON stands for a non-finite value (fedaug writes NaN and
    +-inf as null, :func:`fedaug.core.serialize.to_json`), read back as NaN."""
    return math.nan if x is None else x


@dataclass(frozen=True)
class Run:
    """One finished run: its records, and where it sits in the comparison.

    Attributes:
        path: the run directory.
        setting, method, seed: its cell.
        config: the resolved ``config.toml``.
        summary: ``summary.json``.
        rounds: the ``metrics.jsonl`` records, in order.
    """

    path: Path
    setting: str
    method: str
    seed: int
    config: dict[str, Any]
    summary: dict[str, Any]
    rounds: list[dict[str, Any]]

    @classmethod
    def read(cls, path: Path, setting: str, method: str | None = None) -> "Run":
        """Load a finished run directory (``method`` defaults to the run's name)."""
        run_dir = RunDir.open(path)
        summary = run_dir.read_summary()
        if summary is None:
            raise ConfigError(f"'{path}' has no {SUMMARY}; finish it first (fedaug resume {path})")
        config = read_toml(run_dir.path / CONFIG)
        return cls(run_dir.path, setting, method or config.get("name") or run_dir.path.name,
                   int(config.get("seed", 0)), config, summary, run_dir.rounds())

    @property
    def metric(self) -> str:
        return self.summary["metric"]

    def score(self, which: str) -> float:
        """Mean-over-clients test metric at the ``"final"`` round or the ``"best"`` round (chosen
        by ``eval.best_by``); NaN where the record holds null."""
        return _number(self.summary[which]["eval"]["mean"][f"test_{self.metric}"])

    def spread(self, which: str, stat: str) -> float:
        """A spread figure (``"std"``, ``"min"``, ``"worst10"``) of the clients' test metric at the
        final or best round (:func:`fedaug.metrics.spread.client_spread`); NaN where the record
        holds null or predates it."""
        ev = self.summary[which]["eval"]
        return _number(ev.get("spread", {}).get(f"test_{self.metric}", {}).get(stat))

    def finetuned_score(self) -> float | None:
        """Mean-over-clients test metric after local fine-tuning at the final round
        (``eval.finetune_steps``); ``None`` when the run did not fine-tune."""
        tuned = self.summary["final"]["eval"].get("finetuned")
        return None if tuned is None else _number(tuned["mean"][f"test_{self.metric}"])

    def client_scores(self, which: str) -> dict[str, float]:
        """Each client's test metric at the final or best round; NaN for a client whose evaluation
        that round was rejected or dropped (a run that went on with a poisoned model, issue 41)."""
        per_client = self.summary[which]["eval"]["clients"]  # stored with sorted keys: client-10 before client-2
        order = self.summary.get("clients") or list(per_client)
        return {name: _number(per_client[name]["test"][self.metric]) if name in per_client else math.nan
                for name in order}

    def comm_bytes(self) -> dict[str, int]:
        """Bytes sent down and up over all rounds, summed from the per-round records."""
        down = sum(r["comm"]["down_total"] for r in self.rounds)
        up = sum(r["comm"]["up_total"] for r in self.rounds)
        return {"down": down, "up": up, "total": down + up}

    def curve(self) -> dict[int, float]:
        """Evaluated round -> mean-over-clients test metric."""
        return {r["round"]: _number(r["eval"]["mean"][f"test_{self.metric}"]) for r in self.rounds if "eval" in r}

    def privacy(self) -> dict[str, Any] | None:
        """The accountant's guarantee per round (:mod:`fedaug.privacy.accountant`), ``None`` when the
        run declares no differential-privacy release: ``{"delta", "unit", "model_protected",
        "rounds": [t], "epsilon": [total eps after t], "releases": {what: [eps after t]}}``
        (eps NaN where the record holds null, i.e. infinite)."""
        entries = [(r["round"], r["privacy"]) for r in self.rounds if "privacy" in r]
        if not entries:
            return None
        last = entries[-1][1]
        return {"delta": last["delta"], "unit": last["unit"], "model_protected": last["model_protected"],
                "rounds": [t for t, _ in entries], "epsilon": [_number(e["epsilon"]) for _, e in entries],
                "releases": {what: [_number(e["releases"][what]) for _, e in entries] for what in last["releases"]}}

    def seconds(self) -> float:
        """Training plus evaluation time over all rounds (s), from the records."""
        return sum(r["time"].get("train_s", 0.0) + r["time"].get("eval_s", 0.0) for r in self.rounds)


@dataclass
class Results:
    """Finished runs grouped by setting and method, with the grid's description."""

    meta: dict[str, Any]
    settings: list[str]
    methods: list[str]
    baseline: str
    runs: list[Run]
    missing: list[str] = field(default_factory=list)

    def cell_runs(self, setting: str, method: str) -> list[Run]:
        """The runs of one (setting, method), by seed."""
        return sorted((r for r in self.runs if r.setting == setting and r.method == method), key=lambda r: r.seed)


def load_grid_results(out: Path) -> Results:
    """The finished cells of the grid in ``out`` (written by ``fedaug compare``)."""
    meta = json.loads((Path(out) / GRID_FILE).read_text())
    runs, missing = [], []
    for seed in meta["seeds"]:
        for setting in meta["settings"]:
            for method in meta["methods"]:
                path = find_run(cell_dir(out, setting, method, seed))
                if path is not None and (path / SUMMARY).is_file():
                    runs.append(Run.read(path, setting, method))
                else:
                    state = "not started" if path is None else f"unfinished ({path})"
                    missing.append(f"{setting} | {method} | seed {seed}: {state}")
    return Results(meta, list(meta["settings"]), list(meta["methods"]), meta["baseline"], runs, missing)


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    """What makes runs "the same method": the config without seed, name and :data:`IGNORED`."""
    return flatten({k: v for k, v in config.items() if k not in ("seed", "name", *IGNORED)})


def load_run_results(paths: Sequence[Path]) -> Results:
    """Loose run directories (or directories searched for them), grouped into methods by config
    (all but seed, name, threads and out_dir equal); a method is labelled by its runs' name, plus
    the keys that tell it apart when two methods share a name. The first method is the baseline;
    runs without ``summary.json`` are listed as missing."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / CONFIG).is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(c.parent for c in p.rglob(CONFIG))
        else:
            raise ConfigError(f"'{p}' is neither a run directory (with {CONFIG}) nor a directory holding runs")
    if not found:
        raise ConfigError(f"no run directories under {', '.join(map(str, paths))}; give 'fedaug run' or "
                          "'fedaug compare' output directories")
    groups: list[tuple[dict[str, Any], str, dict[int, Run]]] = []  # (identity, label, seed -> run)
    missing = []
    for p in found:
        if not (p / SUMMARY).is_file():
            missing.append(f"{p}: unfinished")
            continue
        run = Run.read(p, DEFAULT_SETTING)
        ident = _identity(run.config)
        group = next((g for g in groups if g[0] == ident), None)
        if group is None:
            clash = next((g for g in groups if g[1] == run.method), None)
            label = run.method
            if clash is not None:
                keys = sorted(k for k in ident.keys() | clash[0].keys() if ident.get(k) != clash[0].get(k))
                label += " (" + ", ".join(f"{k}={ident.get(k)!r}" for k in keys[:3]) + ")"
            group = (ident, label, {})
            groups.append(group)
        if run.seed in group[2]:
            raise ConfigError(f"runs '{group[2][run.seed].path}' and '{p}' have the same config and seed {run.seed}; "
                              "give one of them")
        group[2][run.seed] = replace(run, method=group[1])
    runs = [r for g in groups for r in g[2].values()]
    methods = [g[1] for g in groups]
    meta = {"name": "runs", "description": "", "kind": "", "reproduces": "", "notes": "", "base": None,
            "baseline": methods[0] if methods else "", "seeds": sorted({r.seed for r in runs}),
            "settings": [DEFAULT_SETTING], "methods": methods, "overrides": []}
    return Results(meta, [DEFAULT_SETTING], methods, meta["baseline"], runs, missing)


def load_results(paths: Sequence[str | Path]) -> Results:
    """A grid directory (holding ``grid.json``) alone, or run directories."""
    paths = [Path(p) for p in paths]
    grids = [p for p in paths if (p / GRID_FILE).is_file()]
    if grids and len(paths) > 1:
        raise ConfigError(f"'{grids[0]}' is a grid directory; give it alone, or give run directories only")
    return load_grid_results(grids[0]) if grids else load_run_results(paths)


def _stat(values: list[float]) -> dict[str, Any]:
    mean, std = mean_std(values)
    return {"mean": mean, "std": std, "values": values}


def summarize_cell(runs: list[Run], baseline: list[Run] | None) -> dict[str, Any]:
    """Mean +/- std over seeds of one (setting, method): final and best, per client, the mean over
    clients and their spread (std, worst client, worst 10 %; ``spread_final``, ``spread_best``),
    the fine-tuned final mean (``finetuned_final``) when every run fine-tuned; the paired t-test
    against the baseline's runs on the common seeds; mean communication (bytes) and time per run;
    the mean learning curve (rounds every run evaluated);
    each run's incidents (:func:`~fedaug.report.incidents.run_incidents`, with its seed), and the (eps, delta)
    guarantee per round when the method declares a DP release (:meth:`Run.privacy`)."""
    if not runs:
        return {"n": 0}
    out: dict[str, Any] = {"n": len(runs), "seeds": [r.seed for r in runs], "run_dirs": [str(r.path) for r in runs]}
    base_by_seed = {r.seed: r for r in baseline or []}
    paired = [r for r in runs if r.seed in base_by_seed]
    for which in WHICH:
        out[which] = _stat([r.score(which) for r in runs])
        out[f"spread_{which}"] = {stat: _stat([r.spread(which, stat) for r in runs]) for stat in SPREAD}
        clients = runs[0].client_scores(which)  # a client a run did not evaluate (eval.clients = "sampled"): NaN
        out[f"clients_{which}"] = {c: _stat([r.client_scores(which).get(c, math.nan) for r in runs]) for c in clients}
        if baseline is not None:
            test = paired_ttest([r.score(which) for r in paired], [base_by_seed[r.seed].score(which) for r in paired])
            out.setdefault("vs_baseline", {})[which] = asdict(test) | {"text": test.text()}
    tuned = [r.finetuned_score() for r in runs]
    if all(t is not None for t in tuned):
        out["finetuned_final"] = _stat(tuned)
    comms = [r.comm_bytes() for r in runs]
    out["comm_bytes"] = {k: sum(c[k] for c in comms) / len(comms) for k in comms[0]}
    out["seconds"] = sum(r.seconds() for r in runs) / len(runs)
    curves = [r.curve() for r in runs]
    rounds = sorted(set.intersection(*(set(c) for c in curves)))
    stats = [mean_std([c[t] for c in curves]) for t in rounds]
    out["curve"] = {"rounds": rounds, "mean": [m for m, _ in stats], "std": [s for _, s in stats]}
    out["incidents"] = [{"seed": str(r.seed), **row} for r in runs for row in run_incidents(r.rounds)]
    privacy = runs[0].privacy()  # the accountant's eps depends on the config, not on the seed
    if privacy is not None:
        out["privacy"] = privacy
    return out


def summarize(results: Results) -> dict[str, Any]:
    """Everything the comparison tables and reports show, as plain JSON-serialisable data:
    ``{"grid": meta, "missing": [...], "settings": {setting: {"metric", "clients", "baseline",
    "methods": {method: summarize_cell(...)}}}}``.

    Raises:
        ConfigError: runs of one setting report different metrics (accuracy and Dice mixed).
    """
    out: dict[str, Any] = {"grid": results.meta, "missing": results.missing, "settings": {}}
    for setting in results.settings:
        base = results.cell_runs(setting, results.baseline)
        methods, metrics, clients = {}, set(), {}
        for method in results.methods:
            runs = results.cell_runs(setting, method)
            methods[method] = summarize_cell(runs, None if method == results.baseline else base)
            metrics |= {r.metric for r in runs}
            for r in runs:
                clients.update(dict.fromkeys(r.client_scores("final")))
        if len(metrics) > 1:
            raise ConfigError(f"setting '{setting}' mixes metrics {sorted(metrics)}; compare runs of one task")
        out["settings"][setting] = {"metric": next(iter(metrics), ""), "clients": list(clients),
                                    "baseline": results.baseline, "methods": methods}
    return out


def summary_methods(summary: dict[str, Any]) -> list[str]:
    """Every method of a :func:`summarize` result, in order of first appearance over the settings."""
    methods: list[str] = []
    for s in summary["settings"].values():
        methods += [m for m in s["methods"] if m not in methods]
    return methods


def summary_metric(summary: dict[str, Any]) -> str:
    """The metric name(s) of a :func:`summarize` result (``"acc"``; ``"acc/dice"`` if mixed across settings)."""
    return "/".join(sorted({s["metric"] for s in summary["settings"].values()} - {""}))
