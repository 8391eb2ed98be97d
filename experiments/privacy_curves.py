"""Accuracy versus epsilon of fedaug's four Gaussian mechanisms, one small stand-in each (issue 20,
"Must show 2"; docs/privacy.md, "Accuracy versus epsilon"): cached, resumable.

Usage::

    nice -n 10 .venv/bin/python experiments/privacy_curves.py calibrate        # unclipped norms -> C
    nice -n 10 .venv/bin/python experiments/privacy_curves.py run --jobs 2     # skips finished cells
    .venv/bin/python experiments/privacy_curves.py table                       # JSON, PNGs, Markdown

Mechanisms (:data:`MECHANISMS`), each a ``fedaug compare`` grid under ``--out`` (one run directory
per cell; a finished cell is skipped, an interrupted one resumed from its checkpoint):

* **DP-FedAvg** (client-level, the model update): ``fedavg.weighting = "uniform"``, each update
  clipped at the server to ``clip_norm = C``, noise ``N(0, (z C / m)^2)`` on the mean update.
* **DP FedFA statistics** (client-level): ``method.augs = [fedfa]``, ``dp_clip``/``dp_noise``.
* **DP FedRDN statistics** (sample-level, released once): ``method.augs = [fedrdn]``.
* **DP FLea features** (sample-level, every round): ``method.augs = [flea]`` (stage ``block2``,
  FLea's default loss weights), on FedAvg with the same SGD as the others.

One stand-in for all four (:data:`COMMON`): Fashion-MNIST, a 2,000-image subset, Dir(0.3) label skew
over 8 clients, every client every round (q = 1: no sampling amplification, the bound is exact),
12 rounds of 10 local steps (batch 32, the ``digits4`` preset's small CNN and SGD lr 0.05, momentum
0.9), evaluated every 3 rounds (the best round is picked by validation among those four).

Per mechanism the columns are: no DP (the reference, nothing clipped), z = 0 (clipping only, eps =
infinity) and four noise multipliers z > 0 (six for DP-FedAvg, whose drop comes early) chosen to
span "as without noise" to "noise dominates", each on :data:`SEEDS`. The clip bound C of each
mechanism is fixed in :data:`CLIP` from ``calibrate``: a short no-DP run (seed 0, 5 rounds) that
records every unclipped norm the mechanism would clip (update norms for DP-FedAvg, the whole
statistics upload for FedFA, each image's statistics for FedRDN, each shared feature row for FLea).
C is the median of the update norms for DP-FedAvg (2.62 -> 2.6; the usual choice, McMahan et al.
2018, Andrew et al. 2021) and, for statistics and features, whose scale is their meaning, the 90th
percentile rounded up (FedFA 11.13 -> 12, FedRDN 0.61 -> 0.62, FLea 66.2 -> 67), so that clipping
rarely rescales them.
``calibrate`` writes ``calibration.json`` under ``--out``.

``table`` reads every finished run: final and best mean client test accuracy, and the accountant's
final eps at the run's delta (the last round record's ``privacy``); it writes
``privacy_curves.json``, one PNG per mechanism (accuracy vs eps, log x; no DP and z = 0 as
horizontal lines) and ``privacy_curves.md`` under ``--figures``.

Budget, measured on 2 CPU cores shared with a test suite (load 6-7, ``threads = 1``): one cell of 12
rounds takes about 80-115 s (FedAvg, FedFA, FedRDN) and about 240 s (FLea); 4 mechanisms x 6
columns (8 for DP-FedAvg) x 2 seeds = 52 cells, about 2 h of one core, so about 1 h with two
processes (``--jobs 2``, or two invocations with different ``--mechanisms``); less on an idle machine. The
sweep is seed-major: every mechanism's seed 0 comes first. These are small stand-ins, not the
papers' settings: absolute accuracies are low; the result is where each curve leaves the no-noise
level, and at which eps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from fedaug.core.runtime import configure_process
from fedaug.core.serialize import atomic_write_json, atomic_write_text
from fedaug.report.grid import GridSpec, parse_grid
from fedaug.report.runner import cell_dir, find_run, run_grid, write_grid_file

SEEDS = [0, 1]
DELTA = 1e-5
#: the stand-in of every mechanism: Fashion-MNIST, a 2,000-image subset, Dir(0.3) label skew over 8
#: clients, every client every round (q = 1), 15 rounds of 10 local steps (batch 32), evaluated every
#: 3 rounds (the best round is the best of those five evaluations)
DATA = {"name": "fashion_mnist", "options": {"partition": "dirichlet", "alpha": 0.3, "samples": 2000,
                                             "num_clients": 8, "val_fraction": 0.1}}
COMMON = {"data": DATA, "train": {"rounds": 12, "local_steps": 10, "batch_size": 32, "participation": 1.0},
          "eval": {"every": 3}, "checkpoint_every": 4, "threads": 1, "privacy": {"delta": DELTA}}

#: mechanism -> (label, base preset, common partial config, the option table of the mechanism,
#: (clip key, noise key), the noise multipliers z > 0 swept)
MECHANISMS: dict[str, dict[str, Any]] = {
    "dp_fedavg": {"label": "DP-FedAvg (model update, client-level), FMNIST", "base": "digits4",
                  "common": {**COMMON, "method": {"options": {"fedavg": {"weighting": "uniform"}}}},
                  "component": "fedavg", "keys": ("clip_norm", "noise_multiplier"),
                  "z": [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]},
    "fedfa": {"label": "DP FedFA statistics (client-level), FMNIST", "base": "digits4",
              "common": {**COMMON, "method": {"augs": ["fedfa"]}},
              "component": "fedfa", "keys": ("dp_clip", "dp_noise"), "z": [0.01, 0.03, 0.1, 1.0]},
    "fedrdn": {"label": "DP FedRDN statistics (sample-level, once), FMNIST", "base": "digits4",
               "common": {**COMMON, "method": {"augs": ["fedrdn"]}},
               "component": "fedrdn", "keys": ("dp_clip", "dp_noise"), "z": [1.0, 10.0, 30.0, 100.0]},
    "flea": {"label": "DP FLea features (sample-level), FMNIST", "base": "digits4",
             "common": {**COMMON, "method": {"augs": ["flea"], "options": {"flea": {"stage": "block2"}}}},
             "component": "flea", "keys": ("dp_clip", "dp_noise"), "z": [0.01, 0.03, 0.1, 1.0]},
}
#: the clip bound C per mechanism, from ``calibrate`` (see the module docstring); ``None``: not yet measured
CLIP: dict[str, float | None] = {"dp_fedavg": 2.6, "fedfa": 12.0, "fedrdn": 0.62, "flea": 67.0}
NO_DP, CLIP_ONLY = "no DP", "z=0 (clip only)"


def column(z: float) -> str:
    return f"z={z:g}"


def grid(mech: str, seeds: list[int]) -> GridSpec:
    """The mechanism's grid: no DP, clipping only, and each z > 0 (needs ``CLIP[mech]``)."""
    m, c = MECHANISMS[mech], CLIP[mech]
    if c is None:
        raise SystemExit(f"no clip bound for {mech}: run `calibrate` and fill CLIP")
    clip_key, noise_key = m["keys"]

    def opts(z: float) -> dict[str, Any]:
        return {"method": {"options": {m["component"]: {clip_key: c, noise_key: z}}}}

    methods = {NO_DP: {}, CLIP_ONLY: opts(0.0), **{column(z): opts(z) for z in m["z"]}}
    return parse_grid({"description": f"accuracy vs eps: {m['label']} (experiments/privacy_curves.py)",
                       "kind": "stand-in", "base": m["base"], "seeds": seeds, "common": m["common"],
                       "methods": methods}, f"privacy-{mech}")


# --- calibration: the unclipped norms ----------------------------------------------------------------
def calibrate(out: Path, mechs: list[str], rounds: int) -> dict[str, Any]:
    """A short no-DP run per mechanism (seed 0, C = 1e12 so nothing is clipped, z = 0), recording every
    norm the mechanism would clip; returns their quantiles and the seconds per round."""
    import torch

    from fedaug.config.load import parse_config
    from fedaug.engine.run import build_simulation
    from fedaug.methods.aug import featstats, fedrdn, flea
    from fedaug.methods.base import fedavg

    norms: list[float] = []

    def rec_update(w, ref, c):  # fedavg.clip_update
        out_, n = orig["update"](w, ref, c)
        norms.append(n)
        return out_

    def rec_l2(t, c):  # featstats.clip_by_l2
        out_, n = orig["l2"](t, c)
        norms.append(n)
        return out_, n

    def rec_rows(x, c):  # fedrdn / flea .clip_rows
        norms.extend(x.detach().flatten(1).double().norm(dim=1).tolist())
        return orig["rows"](x, c)

    orig = {"update": fedavg.clip_update, "l2": featstats.clip_by_l2, "rows": flea.clip_rows}
    patches = {"dp_fedavg": [(fedavg, "clip_update", lambda w, r, c: (rec_update(w, r, c), 0.0))],
               "fedfa": [(featstats, "clip_by_l2", rec_l2)], "fedrdn": [(fedrdn, "clip_rows", rec_rows)],
               "flea": [(flea, "clip_rows", rec_rows)]}
    result = json.loads((out / "calibration.json").read_text()) if (out / "calibration.json").is_file() else {}
    for mech in mechs:
        m = MECHANISMS[mech]
        spec = grid_with_clip(mech)
        raw = spec.raw("default", "calibrate", 0)
        raw["train"]["rounds"] = rounds
        raw["out_dir"] = str(out / "calibrate")
        norms.clear()
        for module, name, fn in patches[mech]:
            setattr(module, name, fn)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sim = build_simulation(parse_config(raw))
                t0 = time.perf_counter()
                accs = []
                for r in range(1, rounds + 1):
                    sim.run_round(r)
                    accs.append(sim.evaluate()["mean"]["test_acc"])
                seconds = (time.perf_counter() - t0) / rounds
        finally:
            for module, name, _ in patches[mech]:
                setattr(module, name, orig[{"clip_update": "update", "clip_by_l2": "l2", "clip_rows": "rows"}[name]])
        q = torch.tensor(norms, dtype=torch.float64)
        qs = {f"q{int(100 * p)}": float(q.quantile(p)) for p in (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)}
        result[mech] = {"label": m["label"], "rounds": rounds, "count": len(norms), **qs,
                        "seconds_per_round_with_eval": seconds, "test_acc": accs}
        print(f"{mech}: {len(norms)} norms, quantiles {qs}, {seconds:.1f} s/round, acc {accs}", flush=True)
        atomic_write_text(out / "calibration.json", json.dumps(result, indent=1) + "\n")
    return result


def grid_with_clip(mech: str) -> GridSpec:
    """The calibration grid: one method with C = 1e12 (never binds) and z = 0."""
    m = MECHANISMS[mech]
    clip_key, noise_key = m["keys"]
    return parse_grid({"base": m["base"], "seeds": [0], "common": m["common"],
                       "methods": {"calibrate": {"method": {"options": {m["component"]: {clip_key: 1e12,
                                                                                         noise_key: 0.0}}}}}},
                      f"calibrate-{mech}")


# --- the sweep -------------------------------------------------------------------------------------
def run(out: Path, mechs: list[str], seeds: list[int], jobs: int) -> None:
    """Seed-major over the mechanisms (every mechanism's seed 0 first: a sweep cut short still has
    one full curve each), ``jobs`` cells at a time."""
    for seed in seeds:
        for mech in mechs:
            run_grid(grid(mech, [seed]), out / mech, jobs, keep_going=True,
                     on_done=lambda k, n, o: print(f"[{k}/{n}] {o.cell.label}: {o.status} {o.seconds:.0f} s "
                                                   f"{o.error}", flush=True))
            write_grid_file(grid(mech, seeds), out / mech)


def read_cell(run_dir: Path) -> dict[str, Any] | None:
    """Final and best mean client test accuracy and the last round's ``privacy`` record of a finished run."""
    if not (run_dir / "summary.json").is_file():
        return None
    summary = json.loads((run_dir / "summary.json").read_text())
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()][-1]
    return {"final": summary["final"]["eval"]["mean"]["test_acc"], "best": summary["best"]["eval"]["mean"]["test_acc"],
            "privacy": last.get("privacy"), "run": str(run_dir)}


def collect(out: Path, mechs: list[str], seeds: list[int]) -> dict[str, Any]:
    """Per mechanism and column: z, eps (the accountant's, final round; inf for z = 0, None without DP),
    unit, final/best accuracy per seed and their mean and std."""
    res: dict[str, Any] = {}
    for mech in mechs:
        m = MECHANISMS[mech]
        cols: dict[str, Any] = {}
        for col, z in [(NO_DP, None), (CLIP_ONLY, 0.0), *[(column(z), z) for z in m["z"]]]:
            runs = {}
            for s in seeds:
                d = cell_dir(out / mech, "default", col, s)
                found = find_run(d)
                cell = read_cell(found) if found is not None else None
                if cell is not None:
                    runs[s] = cell
            priv = next((r["privacy"] for r in runs.values() if r["privacy"]), None)
            eps = None if z is None else (math.inf if z == 0 else (priv or {}).get("epsilon"))
            finals, bests = [r["final"] for r in runs.values()], [r["best"] for r in runs.values()]
            cols[col] = {"z": z, "epsilon": eps, "delta": (priv or {}).get("delta", DELTA if z else None),
                         "unit": (priv or {}).get("unit"), "releases": (priv or {}).get("releases"),
                         "model_protected": (priv or {}).get("model_protected"),
                         "sampling_probability": (priv or {}).get("sampling_probability"),
                         "seeds": sorted(runs), "final": finals, "best": bests,
                         "final_mean": statistics.mean(finals) if finals else None,
                         "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0 if finals else None,
                         "best_mean": statistics.mean(bests) if bests else None}
        res[mech] = {"label": m["label"], "clip": CLIP[mech], "clip_key": m["keys"][0],
                     "component": m["component"], "columns": cols}
    return res


def fmt_eps(e: float | None) -> str:
    if e is None:
        return "-"
    if math.isinf(e):
        return "inf"
    return f"{e:.3g}" if e < 1000 else f"{e:.3g}".replace("e+0", "e").replace("e+", "e")


def markdown(res: dict[str, Any]) -> str:
    """One Markdown table per mechanism: z, eps, final and best accuracy (mean ± std over seeds)."""
    out = []
    for r in res.values():
        out += [f"**{r['label']}**, {r['clip_key']} = C = {r['clip']:g}", "",
                "| setting | z | eps (delta = 1e-5) | final test acc (%) | best-by-val test acc (%) | seeds |",
                "|---|---:|---:|---:|---:|---:|"]
        for col, c in r["columns"].items():
            acc = "-" if c["final_mean"] is None else f"{100 * c['final_mean']:.1f} ± {100 * c['final_std']:.1f}"
            best = "-" if c["best_mean"] is None else f"{100 * c['best_mean']:.1f}"
            z = "-" if c["z"] is None else f"{c['z']:g}"
            out.append(f"| {col} | {z} | {fmt_eps(c['epsilon'])} | {acc} | {best} | {len(c['seeds'])} |")
        out.append("")
    return "\n".join(out)


def figure(path: Path, r: dict[str, Any]) -> None:
    """Accuracy vs eps (log x), one point per z > 0 with the seeds' range; no DP and z = 0 as lines."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(c["epsilon"], c) for c in r["columns"].values()
           if c["z"] and c["epsilon"] is not None and c["final"]]
    pts.sort(key=lambda p: p[0])
    fig, ax = plt.subplots(figsize=(4.8, 3.3))
    if pts:
        xs = [p[0] for p in pts]
        for key, style, name in (("final", "o-", "final round"), ("best", "s--", "best round")):
            ys = [100 * statistics.mean(p[1][key]) for p in pts]
            lo = [100 * min(p[1][key]) for p in pts]
            hi = [100 * max(p[1][key]) for p in pts]
            ax.errorbar(xs, ys, yerr=[[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]],
                        fmt=style, markersize=4, capsize=2, label=f"DP, {name}")
            if key == "final":
                for x, y, p in zip(xs, ys, pts):
                    ax.annotate(f"z={p[1]['z']:g}", (x, y), textcoords="offset points", xytext=(3, 4), fontsize=7)
    for col, style in ((NO_DP, "k-"), (CLIP_ONLY, "k:")):
        c = r["columns"][col]
        if c["final_mean"] is not None:
            ax.axhline(100 * c["final_mean"], color="k", linestyle=style[1:], linewidth=1,
                       label=f"{col} (final)")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    unit = next((c["unit"] for c in r["columns"].values() if c["unit"]), "")
    ax.set_xlabel(f"epsilon at delta = {DELTA:g} ({unit}-level)")
    ax.set_ylabel("mean client test acc (%)")
    ax.set_title(r["label"], fontsize=8)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(out: Path, figures: Path, mechs: list[str], seeds: list[int]) -> str:
    res = collect(out, mechs, seeds)
    figures.mkdir(parents=True, exist_ok=True)
    cal = out / "calibration.json"
    payload = {"delta": DELTA, "seeds": seeds, "mechanisms": res,
               "calibration": json.loads(cal.read_text()) if cal.is_file() else None}
    atomic_write_json(figures / "privacy_curves.json", payload)  # strict JSON: an infinite eps (z = 0) is null
    for mech, r in res.items():
        figure(figures / f"{mech}.png", r)
    text = markdown(res)
    atomic_write_text(figures / "privacy_curves.md", text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("calibrate", "run", "table"):
        p = sub.add_parser(cmd)
        p.add_argument("--out", type=Path, default=Path("runs/privacy_curves"))
        p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS), choices=list(MECHANISMS))
        p.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
        if cmd == "calibrate":
            p.add_argument("--rounds", type=int, default=5)
        if cmd == "run":
            p.add_argument("--jobs", type=int, default=1)
        if cmd == "table":
            p.add_argument("--figures", type=Path, default=Path("docs/figures/privacy"))
    args = parser.parse_args()
    configure_process(1)  # a script is a process entry point; the cells set their own threads
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "calibrate":
        calibrate(args.out, args.mechanisms, args.rounds)
        return
    if args.cmd == "run":
        run(args.out, args.mechanisms, args.seeds, args.jobs)
    print(table(args.out, getattr(args, "figures", Path("docs/figures/privacy")), args.mechanisms, args.seeds))


if __name__ == "__main__":
    main()
