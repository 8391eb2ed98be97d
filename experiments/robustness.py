"""Robustness to attacking clients (issue 20; docs/engine.md, "Attack scenarios"): FedAvg, FedFA and
FLea on Digits-4 and Fashion-MNIST Dir(0.3), with no attacker, one attacker and 25 % attackers, for
each attack kind and each server rule, over seeds; one Markdown table of the final mean client test
accuracy.

Usage::

    nice -n 10 .venv/bin/python experiments/robustness.py run --jobs 2              # skips finished cells
    nice -n 10 .venv/bin/python experiments/robustness.py run --rules fedavg median  # some rules only
    .venv/bin/python experiments/robustness.py table [--rules ...]                  # writes robustness.md
    .venv/bin/python experiments/robustness.py run --only "Digits-4 | fedavg | sign_flip | 1" --methods FedAvg \\
        --seeds 0                                                                  # one cell

The cells are ``fedaug compare`` grids under ``--out`` (resumable, parallel, one run directory
per cell): ``robustness`` (every method; no attack and the kinds that hit the server rule's part or
the data: sign_flip, scale, gaussian, nan, inf, label_flip), ``robustness-stats`` (FedFA and FedFA
with median statistics under poisoned statistics), ``robustness-features`` (FedFA and FLea under
shared tensors replaced by noise; :data:`SHARED_COLUMNS`) and ``robustness-stats-clean`` (FedFA
with median statistics without attack, its reference). A setting is
``dataset | server rule | attack kind | attackers``; ``--rules`` takes any server rules (default:
fedavg, median, trimmed_mean, krum, with :data:`RULE_OPTIONS`). NaN and Inf uploads are rejected
at the trust boundary before any rule sees them, at the same place, so ``inf`` runs under fedavg
only (:data:`AS_NAN_KINDS`) and each rule's ``nan`` rows hold for it. A run that stops with an error (an attack that drives the global model so far that
every client's upload of a round is rejected: "only 0 of 8 uploads passed validation") is a result,
not a crash of the grid: it is listed in the grid's ``collapsed.json`` and counted in its cell
(``collapsed k/3``), and the other cells run on.

Budget, sized for 2 CPU cores: 8 clients per dataset (Digits-4: 2 per domain, 300 images per
domain at 16x16 (the 8x8 UCI digits upsampled: 28x28 adds no detail); Fashion-MNIST: a 2,000-image
subset, Dir(0.3) label skew), every client every round, 20 rounds of 10 (Digits-4) or 5
(Fashion-MNIST) local steps (:data:`BUDGETS`; batch 16; small_cnn at width 16 and the digits4
preset's SGD), evaluated after rounds 10 and 20. One attacker is ``fraction = 1/8``, 25 % is
``fraction = 0.25`` (2 clients), both chosen from the seed. With the four default rules and 3
seeds: 828 + 96 + 96 + 24 + 36 = 1,080 runs, about 6 s (Digits-4) and 15-25 s (Fashion-MNIST) each on one
thread, so about 2 h with ``--jobs 2`` on an idle 2-core machine. The
first budget (28x28, width 32, 10 steps of 32) measured about 3 min per cell per job, 26 h for the
grid, and FLea's distance correlation alone cost 180 ms a step before it used a Gram matrix.

The update screening's edge cases (issue 48, :data:`SCREEN_GRID`, its own two tables): tiny synthetic
federations of 2, 3 and 8 clients, FedAvg under ``trust.screen`` reject (at 10 and 5 times the median),
clip and off, and each robust rule alone, against one free-rider, a majority of free-riders, one
update boosted x3 and x10 (parameters only) and one update scaled by 0.05; 342 runs of about 4 s on one
thread, 24 min with ``--jobs 1`` on the shared 2-core machine (beside other engineers' jobs)::

    nice -n 10 .venv/bin/python experiments/robustness.py run --grids robustness-screen --jobs 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from fedaug.core.runtime import configure_process
from fedaug.core.serialize import atomic_write_json, atomic_write_text
from fedaug.engine.records.rundir import RunDir
from fedaug.report.grid import GridSpec, parse_grid
from fedaug.report.results import load_grid_results, summarize
from fedaug.report.runner import CellError, cell_dir, find_run, run_grid, write_grid_file

NUM_CLIENTS = 8
DATASETS: dict[str, dict[str, Any]] = {
    "Digits-4": {"name": "digits4", "options": {"samples_per_domain": 300, "clients_per_domain": 2, "size": 16}},
    "Fashion-MNIST Dir(0.3)": {"name": "fashion_mnist",
                               "options": {"alpha": 0.3, "samples": 2000, "num_clients": NUM_CLIENTS}},
}
#: each dataset's training budget (merged over :data:`COMMON`'s): clean FedAvg reaches about 30 %
#: on Digits-4 at 5 steps a round, too close to chance (10 %) to read a drop; Fashion-MNIST's runs
#: cost 3x as much a step (28x28) and reach about 45 % at 5
BUDGETS: dict[str, dict[str, Any]] = {"Digits-4": {"local_steps": 10}, "Fashion-MNIST Dir(0.3)": {"local_steps": 5}}
METHODS: dict[str, dict[str, Any]] = {"FedAvg": {}, "FedFA": {"method": {"augs": ["fedfa"]}},
                                      "FLea": {"method": {"augs": ["flea"]}}}
#: FedFA with the clients' statistics combined by the coordinate-wise median (docs/robustness.md,
#: "Robust shared statistics"): the "with robust aggregation of the statistics" column of the stats attack
ROBUST_STATS = {"FedFA, median stats": {"method": {"augs": ["fedfa"], "options": {"fedfa": {"stats_rule": "median"}}}}}
#: every column of the table
COLUMNS = {**METHODS, **ROBUST_STATS}
#: FedFA's "direct fusion" variant (Table 7: the clients add the shared variances themselves), with
#: the mean and the median of the statistics: its noise grows with a poisoned variance without
#: bound, where the default variant's gamma (Eq. 6) sums to C whatever the variances are
DIRECT = {"FedFA direct": {"method": {"augs": ["fedfa"], "options": {"fedfa": {"variance": "direct"}}}},
          "FedFA direct, median stats": {"method": {"augs": ["fedfa"], "options": {
              "fedfa": {"variance": "direct", "stats_rule": "median"}}}}}
#: each robust rule's options for 8 clients of which up to 2 attack: Krum assumes f = 2 Byzantine
#: clients (it needs M > 2f + 2 = 6); the trimmed mean drops floor(0.25 * 8) = 2 values at each end
#: (at its default beta = 0.1 it would trim nothing of 8)
RULE_OPTIONS: dict[str, dict[str, Any]] = {"krum": {"f": 2}, "trimmed_mean": {"beta": 0.25}}
#: kinds that change the server rule's part or the data (every method), and what augmentations share
MODEL_KINDS = ("sign_flip", "scale", "gaussian", "nan", "inf", "label_flip")
#: the columns each shared-artefact kind runs: ``stats`` changes tensors named like a spread or a
#: centre (FedFA's statistics; FLea shares none, so it would rerun FLea's clean cell), ``features``
#: adds noise to every shared tensor (FLea's features, FedFA's statistics)
SHARED_COLUMNS = {"stats": ["FedFA", *ROBUST_STATS], "features": ["FedFA", "FLea"]}
#: kinds run under fedavg only: an Inf upload is rejected at the trust boundary exactly where a NaN
#: one is, so under any rule the accepted replies, and so the run, are those of ``nan`` (its fedavg
#: rows check that); ``nan`` itself runs under every rule, which aggregates the honest rest its way
#: (Krum with f = 2 needs 2f + 3 = 7 accepted replies: 2 rejected of 8 leave it none to choose)
AS_NAN_KINDS = ("inf",)
SHARED_KINDS = ("stats", "features")
#: attackers column -> attack.fraction
ATTACKERS = {"1": 1 / NUM_CLIENTS, "25 %": 0.25}
#: every grid measures the server rules alone: the update screening (``trust.screen``, issue 41, on by
#: default since) is off, as it was (it did not exist) when the first table was measured; the in-bound
#: grid (:data:`INBOUND_GRID`) turns it on per setting
COMMON = {"model": {"name": "small_cnn", "options": {"width": 16}},
          "train": {"rounds": 20, "batch_size": 16}, "eval": {"every": 10},
          "checkpoint_every": 10, "threads": 1, "trust": {"screen": "off"}}
NO_ATTACK = ("none", "0")
#: the runs that stopped with an error (every upload of a round rejected: the attack broke the
#: federation), one file per grid; a later ``run`` retries them and records them again
COLLAPSED = "collapsed.json"
#: the grid of FedFA's direct variant (:data:`DIRECT`), tabulated apart by :func:`direct_table`
DIRECT_GRID = "robustness-stats-direct"
#: the in-bound scaling attack (issue 41): one attacker sends half of ``trust.max_abs`` (5e5) in every
#: weight of its upload (``attack.kind = "fill"``), which passes the magnitude bound; each rule alone
#: (screening off) and FedAvg under the update screening (``trust.screen``), FedAvg column only;
#: tabulated apart by :func:`inbound_table`
INBOUND_GRID = "robustness-inbound"
INBOUND_RULES: dict[str, list[str]] = {"off": ["fedavg", "median", "trimmed_mean", "krum"],
                                       "reject": ["fedavg"], "clip": ["fedavg"]}
#: the update screening's edge cases (issue 48): free-riders, boosted and small parameter updates on
#: tiny synthetic federations of 2, 3 and 8 clients (48 samples each, 4 classes, 8x8; small_cnn at width 8,
#: 8 rounds of 4 local steps), FedAvg under each ``trust.screen`` and each robust rule alone (screening
#: off); tabulated apart by :func:`screen_table` and :func:`screen_decisions`
SCREEN_GRID = "robustness-screen"
SCREEN_SIZES = (2, 3, 8)
SCREEN_RUNS = {"model": {"options": {"width": 8}}, "eval": {"every": 8}, "checkpoint_every": 8,
               "train": {"rounds": 8, "local_steps": 4, "lr": 0.05}}
#: the screening grid's columns: label -> (server rule, [trust]); the robust rules alone (screening off)
SCREEN_COLUMNS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg, reject": ("fedavg", {"screen": "reject"}),
    "fedavg, reject at 5 x": ("fedavg", {"screen": "reject", "screen_multiple": 5.0}),
    "fedavg, clip": ("fedavg", {"screen": "clip"}), "fedavg, off": ("fedavg", {"screen": "off"}),
    **{rule: (rule, {"screen": "off"}) for rule in ("median", "trimmed_mean", "krum")}}
#: attack label -> [attack] (``"clients": None``: a majority, the first ``floor(N/2) + 1`` ids; none of 2)
SCREEN_ATTACKS: dict[str, dict[str, Any]] = {
    "none": {"kind": "none"}, "free-rider": {"kind": "free_ride", "clients": [0]},
    "free-riders, majority": {"kind": "free_ride", "clients": None},
    "boost x3": {"kind": "scale", "scale": 3.0, "clients": [0]}, "boost x10": {"kind": "scale", "scale": 10.0, "clients": [0]},
    "small x0.05": {"kind": "scale", "scale": 0.05, "clients": [0]}}


def screen_rule_options(rule: str, n: int) -> dict[str, Any]:
    """A robust rule's options for ``n`` clients with up to one attacker: the trimmed mean drops one value
    at each end where it can (none of 2), Krum assumes f = 1 where M > 2f + 2 allows it (f = 0 of 3)."""
    if rule == "trimmed_mean":
        return {"beta": {2: 0.0, 3: 0.34}.get(n, 1 / n)}
    if rule == "krum":
        return {"f": 0 if n <= 4 else 1}
    return {}


def screen_label(n: int, column: str, attack: str) -> str:
    return f"{n} clients | {column} | {attack}"


def screen_cells() -> list[tuple[int, str, str]]:
    """(clients, column, attack) of every screening setting: Krum needs 3 uploads, a majority of 2 is all."""
    return [(n, column, attack) for n in SCREEN_SIZES for column in SCREEN_COLUMNS for attack in SCREEN_ATTACKS
            if not (n == 2 and (column == "krum" or attack == "free-riders, majority"))]


def screen_settings() -> dict[str, dict[str, Any]]:
    """The :data:`SCREEN_GRID` settings as partial configs."""
    out = {}
    for n, column, attack in screen_cells():
        rule, trust = SCREEN_COLUMNS[column]
        options = screen_rule_options(rule, n)
        kind = dict(SCREEN_ATTACKS[attack])
        if kind.get("clients", []) is None:
            kind["clients"] = list(range(n // 2 + 1))
        out[screen_label(n, column, attack)] = {
            **SCREEN_RUNS, "data": {"name": "synthetic", "options": {"num_clients": n, "samples_per_client": 48,
                                                                      "num_classes": 4, "size": 8}},
            "method": {"base": rule, **({"options": {rule: options}} if options else {})},
            "attack": kind, "trust": trust}
    return out


def setting_label(dataset: str, rule: str, kind: str, attackers: str) -> str:
    return f"{dataset} | {rule} | {kind} | {attackers}"


def setting_of(dataset: str, rule: str, kind: str, count: str) -> dict[str, Any]:
    """One (dataset, rule, kind, attackers) setting as a partial config."""
    attack = {"kind": kind} if kind == "none" else {"kind": kind, "fraction": ATTACKERS[count]}
    method = {"base": rule, **({"options": {rule: RULE_OPTIONS[rule]}} if rule in RULE_OPTIONS else {})}
    return {"data": DATASETS[dataset], "train": BUDGETS[dataset], "method": method, "attack": attack}


def settings_of(rules: list[str], kinds: tuple[str, ...], with_baseline: bool) -> dict[str, dict[str, Any]]:
    """Every (dataset, rule, kind, attackers) setting as a partial config."""
    out = {}
    for dataset in DATASETS:
        for rule in rules:
            cells = [NO_ATTACK] if with_baseline else []
            cells += [(kind, count) for kind in kinds for count in ATTACKERS
                      if rule == "fedavg" or kind not in AS_NAN_KINDS]
            for kind, count in cells:
                out[setting_label(dataset, rule, kind, count)] = setting_of(dataset, rule, kind, count)
    return out


def inbound_label(dataset: str, rule: str, screen: str, kind: str) -> str:
    return f"{dataset} | {rule} | screen={screen} | {kind}"


def inbound_settings() -> dict[str, dict[str, Any]]:
    """The :data:`INBOUND_GRID` settings: each (dataset, screening, rule) without attack and with one
    ``fill`` attacker."""
    return {inbound_label(dataset, rule, screen, kind): {**setting_of(dataset, rule, kind, count),
                                                          "trust": {"screen": screen}}
            for dataset in DATASETS for screen, rules in INBOUND_RULES.items() for rule in rules
            for kind, count in (NO_ATTACK, ("fill", "1"))}


def grids(rules: list[str], seeds: list[int]) -> dict[str, GridSpec]:
    """The grids (see the module docstring), checked (unknown rules are refused here)."""
    def spec(name: str, kinds: tuple[str, ...], methods: list[str], baseline: bool,
             on: list[str] = rules, settings: dict[str, dict[str, Any]] | None = None) -> GridSpec:
        return parse_grid({"description": "robustness to attacking clients (experiments/robustness.py)",
                           "kind": "stand-in", "base": "digits4", "seeds": seeds, "common": COMMON,
                           "settings": settings if settings is not None else settings_of(on, kinds, baseline),
                           "methods": {m: {**COLUMNS, **DIRECT}[m] for m in methods}}, name)
    return {"robustness": spec("robustness", MODEL_KINDS, list(METHODS), True),
            **{f"robustness-{kind}": spec(f"robustness-{kind}", (kind,), SHARED_COLUMNS[kind], False)
               for kind in SHARED_KINDS},
            "robustness-stats-clean": spec("robustness-stats-clean", (), list(ROBUST_STATS), True),
            DIRECT_GRID: spec(DIRECT_GRID, ("stats",), list(DIRECT), True, ["fedavg"]),
            INBOUND_GRID: spec(INBOUND_GRID, (), ["FedAvg"], True, settings=inbound_settings()),
            SCREEN_GRID: spec(SCREEN_GRID, (), ["FedAvg"], True, settings=screen_settings())}


def subset(spec: GridSpec, only: list[str] | None, methods: list[str] | None) -> GridSpec | None:
    """``spec`` restricted to the settings in ``only`` and the ``methods`` (``None``: all); ``None``
    when nothing of it is left."""
    settings = {k: v for k, v in spec.settings.items() if only is None or k in only}
    chosen = {k: v for k, v in spec.methods.items() if methods is None or k in methods}
    if not settings or not chosen:
        return None
    return dataclasses.replace(spec, methods=chosen, settings=settings,
                               baseline=spec.baseline if spec.baseline in chosen else next(iter(chosen)))


def run(out: Path, rules: list[str], seeds: list[int], jobs: int, only: list[str] | None,
        methods: list[str] | None, names: list[str] | None = None) -> None:
    for name, spec in grids(rules, seeds).items():
        part = subset(spec, only, methods) if names is None or name in names else None
        if part is None:
            continue
        try:
            outcomes = run_grid(part, out / name, jobs, keep_going=True,
                                on_done=lambda k, n, o: print(f"[{k}/{n}] {o.cell.label}: {o.status}", flush=True))
        except CellError as exc:  # a federation the attack broke: a result, kept for the table
            outcomes = exc.outcomes
        collapsed = load_collapsed(out / name)
        for o in outcomes:
            if o.status == "failed":
                collapsed[o.cell.label] = {"setting": o.cell.setting, "method": o.cell.method,
                                           "seed": o.cell.seed, "error": o.error}
            elif o.status != "busy":
                collapsed.pop(o.cell.label, None)
        atomic_write_json(out / name / COLLAPSED, collapsed)
        write_grid_file(spec, out / name)  # grid.json describes the whole grid, finished or not


def load_collapsed(grid_dir: Path) -> dict[str, dict[str, Any]]:
    """The grid's failed cells (:data:`COLLAPSED`): cell label -> setting, method, seed, error."""
    path = grid_dir / COLLAPSED
    return json.loads(path.read_text()) if path.is_file() else {}


def collapsed_counts(grid_dir: Path, seeds: list[int]) -> dict[tuple[str, str], int]:
    """(setting, method) -> how many of ``seeds`` collapsed, from the grid's :data:`COLLAPSED`."""
    counts: dict[tuple[str, str], int] = {}
    for c in load_collapsed(grid_dir).values():
        if c["seed"] in seeds:
            counts[c["setting"], c["method"]] = counts.get((c["setting"], c["method"]), 0) + 1
    return counts


def _cell(stat: dict[str, Any], clean: float | None, seeds: int, collapsed: int = 0) -> str:
    """``"61.20 ± 1.10 (-12.3)"``: final accuracy (%) over the finished seeds and its drop from the
    same method without attack; ``collapsed k/seeds`` for runs the attack stopped (every upload of a
    round rejected); ``-`` when no run ended, ``[n=k]`` when fewer than ``seeds`` did."""
    broke = f"collapsed {collapsed}/{seeds}"
    if stat["n"] == 0:
        return broke if collapsed else "-"
    mean, std = stat["final"]["mean"], stat["final"]["std"]
    if math.isnan(mean):
        return "no score (evaluations rejected)"
    text = f"{100 * mean:.2f} ± {100 * (0.0 if math.isnan(std) else std):.2f}"
    if clean is not None:
        text += f" ({100 * (mean - clean):+.1f})"
    text += f", {broke}" if collapsed else ""
    return text + ("" if stat["n"] + collapsed == seeds else f" [n={stat['n'] + collapsed}]")


def finished(out: Path, spec: GridSpec, seeds: list[int]) -> tuple[dict[str, Any], dict[tuple[str, str], int]]:
    """The grid's summary per setting (:func:`summarize`) over ``seeds`` and its collapsed counts
    (:func:`collapsed_counts`); grid.json is rewritten for ``seeds`` first, whichever invocation ran which."""
    write_grid_file(spec, out / spec.name)
    return summarize(load_grid_results(out / spec.name))["settings"], collapsed_counts(out / spec.name, seeds)


def table(out: Path, rules: list[str], seeds: list[int]) -> str:
    """The Markdown table: one row per setting, one column per method."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    broken: dict[tuple[str, str], int] = {}  # (setting, method) -> collapsed seeds
    for name, spec in grids(rules, seeds).items():
        if name not in (DIRECT_GRID, INBOUND_GRID, SCREEN_GRID) and (out / name).is_dir():
            settings, counts = finished(out, spec, seeds)
            for setting, s in settings.items():
                rows.setdefault(setting, {}).update(s["methods"])
            broken.update(counts)
    lines = ["| dataset | server rule | attack | attackers | " + " | ".join(COLUMNS) + " |",
             "|---|---|---|---|" + "---:|" * len(COLUMNS)]
    for dataset in DATASETS:
        for rule in rules:
            clean = rows.get(setting_label(dataset, rule, *NO_ATTACK), {})
            for kind, count in [NO_ATTACK] + [(k, c) for k in MODEL_KINDS + SHARED_KINDS for c in ATTACKERS]:
                if kind in AS_NAN_KINDS and rule != "fedavg":
                    continue  # the nan rows of the rule hold for it
                label = setting_label(dataset, rule, kind, count)
                cells = rows.get(label)
                texts = []
                for m in COLUMNS:
                    base = clean.get(m, {"n": 0})
                    ref = base["final"]["mean"] if base["n"] and kind != "none" else None
                    if kind in SHARED_KINDS and m not in SHARED_COLUMNS[kind] and m not in ROBUST_STATS:
                        texts.append("n/a")  # nothing of that kind shared (FedAvg: the weights only)
                    elif m in ROBUST_STATS and kind not in ("none", "stats"):
                        texts.append("")  # the robust-statistics column answers the stats attack only
                    else:
                        stat = cells[m] if cells and m in cells else {"n": 0}
                        texts.append(_cell(stat, ref, len(seeds), broken.get((label, m), 0)))
                lines.append(f"| {dataset} | {rule} | {kind} | {count} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def direct_table(out: Path, seeds: list[int]) -> str:
    """The Markdown table of the ``robustness-stats-direct`` grid: FedFA's direct variant under
    poisoned statistics, mean against median statistics (server rule fedavg)."""
    spec = grids(["fedavg"], seeds)[DIRECT_GRID]
    if not (out / spec.name).is_dir():
        return ""
    rows, broken = finished(out, spec, seeds)
    lines = ["| dataset | attack | attackers | " + " | ".join(DIRECT) + " |", "|---|---|---|" + "---:|" * len(DIRECT)]
    for dataset in DATASETS:
        clean = rows.get(setting_label(dataset, "fedavg", *NO_ATTACK), {"methods": {}})["methods"]
        for kind, count in [NO_ATTACK, ("stats", "1"), ("stats", "25 %")]:
            label = setting_label(dataset, "fedavg", kind, count)
            cells = rows.get(label, {"methods": {}})["methods"]
            texts = [_cell(cells.get(m, {"n": 0}),
                           clean[m]["final"]["mean"] if kind != "none" and clean.get(m, {"n": 0})["n"] else None,
                           len(seeds), broken.get((label, m), 0)) for m in DIRECT]
            lines.append(f"| {dataset} | {kind} | {count} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def inbound_table(out: Path, seeds: list[int]) -> str:
    """The Markdown table of the :data:`INBOUND_GRID` grid: FedAvg's final accuracy under one ``fill``
    attacker, each rule alone and FedAvg under the update screening."""
    spec = grids(["fedavg"], seeds)[INBOUND_GRID]
    if not (out / spec.name).is_dir():
        return ""
    rows, broken = finished(out, spec, seeds)
    lines = ["| dataset | server rule | update screening | no attack | one attacker, 5e5 in every weight |",
             "|---|---|---|---:|---:|"]
    for dataset in DATASETS:
        for screen, rules in INBOUND_RULES.items():
            for rule in rules:
                texts, clean = [], None
                for kind in ("none", "fill"):
                    label = inbound_label(dataset, rule, screen, kind)
                    stat = rows.get(label, {"methods": {}})["methods"].get("FedAvg", {"n": 0})
                    texts.append(_cell(stat, clean, len(seeds), broken.get((label, "FedAvg"), 0)))
                    clean = stat["final"]["mean"] if stat["n"] else None
                lines.append(f"| {dataset} | {rule} | {screen} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def screen_table(out: Path, seeds: list[int]) -> str:
    """The Markdown table of the :data:`SCREEN_GRID` grid: final accuracy per (clients, attack), one
    column per (rule, screening), with the change from the same column without attack."""
    spec = grids(["fedavg"], seeds)[SCREEN_GRID]
    if not (out / spec.name).is_dir():
        return ""
    rows, broken = finished(out, spec, seeds)
    lines = ["| clients | attack | " + " | ".join(SCREEN_COLUMNS) + " |", "|---|---|" + "---:|" * len(SCREEN_COLUMNS)]
    cells = set(screen_cells())
    for n in SCREEN_SIZES:
        for attack in SCREEN_ATTACKS:
            if (n, "fedavg, off", attack) not in cells:
                continue
            texts = []
            for column in SCREEN_COLUMNS:
                if (n, column, attack) not in cells:
                    texts.append("n/a")
                    continue
                label, clean = screen_label(n, column, attack), screen_label(n, column, "none")
                stat = rows.get(label, {"methods": {}})["methods"].get("FedAvg", {"n": 0})
                base = rows.get(clean, {"methods": {}})["methods"].get("FedAvg", {"n": 0})
                ref = base["final"]["mean"] if base["n"] and attack != "none" else None
                texts.append(_cell(stat, ref, len(seeds), broken.get((label, "FedAvg"), 0)))
            lines.append(f"| {n} | {attack} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def screened_uploads(out: Path, label: str, seeds: list[int], attackers: set[int]) -> dict[str, int]:
    """Over ``seeds`` and rounds of one screening cell: uploads screened (rejected by the screening or
    clipped) of the attackers and of the honest clients, and how many each sent."""
    counts = {"attackers": 0, "attackers_sent": 0, "honest": 0, "honest_sent": 0}
    for seed in seeds:
        path = find_run(cell_dir(out / SCREEN_GRID, label, "FedAvg", seed))
        for rec in RunDir(path).rounds() if path is not None else []:
            screened = set(rec.get("updates", {}).get("clipped", []))
            screened |= {x["client"] for x in rec["rejected"] if "update norm" in x["reason"]}
            for cid in rec["sampled"]:
                who = "attackers" if cid in attackers else "honest"
                counts[who] += cid in screened
                counts[f"{who}_sent"] += 1
    return counts


def screen_decisions(out: Path, seeds: list[int]) -> str:
    """The Markdown table of what the screening did in the :data:`SCREEN_GRID` grid (its FedAvg columns
    with the screening on): the attackers' and the honest clients' uploads it screened, of those sent."""
    spec = grids(["fedavg"], seeds)[SCREEN_GRID]
    if not (out / spec.name).is_dir():
        return ""
    columns = [c for c, (rule, trust) in SCREEN_COLUMNS.items() if rule == "fedavg" and trust["screen"] != "off"]
    lines = ["| clients | attack | " + " | ".join(f"{c}: attackers' | {c}: honest" for c in columns) + " |",
             "|---|---|" + "---:|" * (2 * len(columns))]
    for n in SCREEN_SIZES:
        for attack in SCREEN_ATTACKS:
            label = screen_label(n, columns[0], attack)
            if label not in spec.settings:
                continue
            attackers = set(spec.settings[label]["attack"].get("clients", []))
            texts = []
            for column in columns:
                c = screened_uploads(out, screen_label(n, column, attack), seeds, attackers)
                texts += [f"{c['attackers']}/{c['attackers_sent']}" if c["attackers_sent"] else "-",
                          f"{c['honest']}/{c['honest_sent']}"]
            lines.append(f"| {n} | {attack} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("run", "table"):
        p = sub.add_parser(cmd)
        p.add_argument("--out", type=Path, default=Path("runs/robustness"))
        p.add_argument("--rules", nargs="+", default=["fedavg", "median", "trimmed_mean", "krum"],
                       help="server rules (method.base)")
        p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
        if cmd == "run":
            p.add_argument("--jobs", type=int, default=1)
            p.add_argument("--only", nargs="+", default=None, metavar="SETTING",
                           help='settings to run, e.g. "Digits-4 | fedavg | sign_flip | 1" (default: all)')
            p.add_argument("--methods", nargs="+", default=None, choices=[*COLUMNS, *DIRECT])
            p.add_argument("--grids", nargs="+", default=None, metavar="GRID",
                           help=f"run these grids only (default: all), e.g. {INBOUND_GRID}")
    args = parser.parse_args()
    if args.cmd == "run":
        configure_process(1)  # a script is a process entry point; the cells set their own threads
        run(args.out, args.rules, args.seeds, args.jobs, args.only, args.methods, args.grids)
    text = "\n\n".join([table(args.out, args.rules, args.seeds), direct_table(args.out, args.seeds),
                        inbound_table(args.out, args.seeds), screen_table(args.out, args.seeds),
                        screen_decisions(args.out, args.seeds)])
    atomic_write_text(args.out / "robustness.md", text + "\n")
    print(text)
    print("\nfinal mean client test accuracy (%), mean ± std over seeds (change from the same method without "
          f"attack); n/a: the attack hits nothing of that method. Written to {args.out / 'robustness.md'}")


if __name__ == "__main__":
    main()
