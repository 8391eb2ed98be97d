"""FLea's privacy-accuracy trade-off over a finished grid (Xia et al., KDD 2024, Sec. 4.3.2 / Fig. 11:
accuracy against the distance correlation c of Eq. 8 as lambda2 grows; Sec. 4.4 / Fig. 9c: the
reconstruction attack).

``nice -n 10 .venv/bin/python experiments/flea_tradeoff.py runs/compare/flea_lambda_stage_fmnist``
reads the grid directory written by ``fedaug compare flea_lambda_stage_fmnist`` and, for every
finished run, restores its final checkpoint and measures, at the split stage:

* dCor^2 (Eq. 8) between 512 pooled raw training images and their features under the final global
  model (``fedaug privacy dcor``), and
* the reconstruction attack's test MSE (a decoder trained 20 epochs on the features of half of 512
  pooled test images, scored on the other half, or of all the test images when the federation
  holds fewer; ``fedaug privacy attack --kind reconstruction``).

FLea runs are measured at their ``flea.stage``; runs without FLea (the FedAvg baseline) at every
stage that a FLea method of the grid uses, so each FLea cell has the undefended model beside it.
Per-run numbers are cached in ``OUT/runs.json`` (a rerun measures only new runs). Writes
``OUT/tradeoff.md`` (mean +/- std over seeds per setting, method and stage: final and best test
accuracy, dCor^2, MSE), ``OUT/tradeoff.json``, ``OUT/tradeoff.png`` (final accuracy against
dCor^2, one panel per setting) and ``OUT/curves.png`` (mean client test accuracy per round, mean
over seeds: one panel per setting and stage, FedAvg beside FLea at each lambda2, to see whether
both have converged). ``OUT`` defaults to ``GRID_DIR/tradeoff``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedaug.cli.privacy_runs import pooled_dcor, reconstruction, restore_run
from fedaug.report.results import Results, Run, load_grid_results, summarize as summarize_grid
from fedaug.report.stats import mean_std

#: per-run measurements, in the order of the table's columns
MEASURES = ("final", "best", "dcor2", "mse")


def flea_options(run: Run) -> dict[str, Any] | None:
    """The run's ``[method.options.flea]`` (``{}`` when FLea runs at its defaults), ``None`` without FLea."""
    method = run.config.get("method", {})
    return method.get("options", {}).get("flea", {}) if "flea" in method.get("augs", []) else None


def run_stages(run: Run, grid_stages: Sequence[str]) -> list[str]:
    """Where a run is measured: its ``flea.stage``, or every stage of ``grid_stages`` (runs without FLea)."""
    options = flea_options(run)
    if options is None:
        return list(grid_stages)
    stage = options.get("stage")
    if stage is None:
        raise SystemExit(f"{run.path}: flea.stage is not set in its config.toml; the trade-off needs the split stage")
    return [stage]


def measure(run: Run, stages: Sequence[str], samples: int, epochs: int) -> list[dict[str, Any]]:
    """One row per stage: the run's cell, lambda2, final and best test accuracy, dCor^2 and the MSE."""
    sim, _ = restore_run(run.path)
    options = flea_options(run)
    rows = []
    attack = min(samples, sum(c.test.x.shape[0] for c in sim.data.clients))  # the test pool may be smaller
    for stage in stages:
        res, _ = reconstruction(sim, stage, attack, epochs)
        rows.append({"path": str(run.path), "setting": run.setting, "method": run.method, "seed": run.seed,
                     "stage": stage, "lambda2": None if options is None else options.get("dcor_weight", 3.0),
                     "final": run.score("final"), "best": run.score("best"),
                     "dcor2": pooled_dcor(sim, stage, samples), "mse": res.mse, "samples": samples,
                     "attack_samples": attack, "epochs": epochs})
        print(f"tradeoff | {run.setting} | {run.method} | seed {run.seed} | {stage} | "
              f"dCor^2 {rows[-1]['dcor2']:.3f} | MSE {res.mse:.4f}", flush=True)
    return rows


def collect(results: Results, cache: Path, samples: int, epochs: int) -> list[dict[str, Any]]:
    """Every finished run's rows, from ``cache`` where it holds them for the same sample and epoch
    counts, else measured (the cache is rewritten after each measured run)."""
    grid_stages = sorted({s for r in results.runs if flea_options(r) is not None for s in run_stages(r, ())})
    key = lambda r: (r["path"], r["stage"], r["samples"], r["epochs"])  # noqa: E731
    store = {key(r): r for r in (json.loads(cache.read_text()) if cache.is_file() else [])}
    rows: list[dict[str, Any]] = []
    for run in results.runs:
        stages = run_stages(run, grid_stages)
        todo = [s for s in stages if (str(run.path), s, samples, epochs) not in store]
        if todo:
            store.update({key(r): r for r in measure(run, todo, samples, epochs)})
            cache.write_text(json.dumps(list(store.values()), indent=1))
        rows += [store[(str(run.path), s, samples, epochs)] for s in stages]
    return rows


def summarize(rows: Sequence[dict[str, Any]], results: Results) -> list[dict[str, Any]]:
    """Mean and sample std over seeds per (setting, method, stage), in the grid's order."""
    out = []
    for setting in results.settings:
        for method in results.methods:
            for stage in sorted({r["stage"] for r in rows if (r["setting"], r["method"]) == (setting, method)}):
                cell = [r for r in rows if (r["setting"], r["method"], r["stage"]) == (setting, method, stage)]
                stats = {m: mean_std([r[m] for r in cell]) for m in MEASURES}
                out.append({"setting": setting, "method": method, "stage": stage, "lambda2": cell[0]["lambda2"],
                            "seeds": sorted(r["seed"] for r in cell),
                            **{m: {"mean": s[0], "std": s[1]} for m, s in stats.items()}})
    return out


def table(cells: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per (setting, method, stage); accuracy in %, dCor^2 and MSE as measured."""
    lines = ["| setting | method | stage | seeds | final acc (%) | best acc (%) | dCor^2 | reconstruction MSE |",
             "|---|---|---|---:|---|---|---|---|"]
    for c in cells:
        acc = [f"{100 * c[m]['mean']:.2f} +/- {100 * c[m]['std']:.2f}" for m in ("final", "best")]
        priv = [f"{c[m]['mean']:.3f} +/- {c[m]['std']:.3f}" if m == "dcor2" else
                f"{c[m]['mean']:.4f} +/- {c[m]['std']:.4f}" for m in ("dcor2", "mse")]
        lines.append(f"| {c['setting']} | {c['method']} | {c['stage']} | {len(c['seeds'])} | " + " | ".join(acc + priv)
                     + " |")
    return "\n".join(lines) + "\n"


def figure(cells: Sequence[dict[str, Any]], settings: Sequence[str], path: Path) -> None:
    """Final accuracy against dCor^2 (error bars: std over seeds), one panel per setting; colour =
    lambda2 (black: no FLea), marker = stage (matplotlib's object API, no pyplot)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    stages = sorted({c["stage"] for c in cells})
    markers = dict(zip(stages, "osD^v<>"))
    lams = sorted({c["lambda2"] for c in cells if c["lambda2"] is not None})
    colours = {lam: colormaps["viridis"](i / max(len(lams) - 1, 1)) for i, lam in enumerate(lams)}
    fig = Figure(figsize=(4.5 * len(settings) + 1.8, 4))
    for k, setting in enumerate(settings):
        ax = fig.add_subplot(1, len(settings), k + 1)
        for c in (c for c in cells if c["setting"] == setting):
            ax.errorbar(c["dcor2"]["mean"], 100 * c["final"]["mean"], xerr=c["dcor2"]["std"],
                        yerr=100 * c["final"]["std"], fmt=markers[c["stage"]], capsize=2,
                        color="black" if c["lambda2"] is None else colours[c["lambda2"]])
        ax.set(title=setting, xlabel="dCor^2 (Eq. 8) of the final global model", ylabel="final test accuracy (%)")
        ax.grid(alpha=0.3)
    handles = ([Line2D([], [], color="black", marker="o", ls="", label="no FLea (FedAvg)")]
               + [Line2D([], [], color=colours[lam], marker="o", ls="", label=f"lambda2 = {lam:g}") for lam in lams]
               + [Line2D([], [], color="grey", marker=markers[s], ls="", label=s) for s in stages])
    fig.legend(handles=handles, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / (4.5 * len(settings) + 1.8), 1))
    fig.savefig(path, dpi=120)


def curves(cells: Sequence[dict[str, Any]], results: Results, path: Path) -> None:
    """Learning curves (mean over seeds of the mean client test accuracy per round): a row of panels
    per setting, a column per FLea stage; in each, the runs without FLea (black) and FLea at each
    lambda2 (the colours of :func:`figure`)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    summary = summarize_grid(results)
    flea = [c for c in cells if c["lambda2"] is not None]
    stages = sorted({c["stage"] for c in flea})
    settings = [s for s in results.settings if any(c["setting"] == s for c in flea)]
    lams = sorted({c["lambda2"] for c in flea})
    colours = {lam: colormaps["viridis"](i / max(len(lams) - 1, 1)) for i, lam in enumerate(lams)}
    fig = Figure(figsize=(4.2 * len(stages), 3.2 * len(settings)))
    for i, setting in enumerate(settings):
        methods = summary["settings"][setting]["methods"]
        for j, stage in enumerate(stages):
            ax = fig.add_subplot(len(settings), len(stages), i * len(stages) + j + 1)
            shown = [(c["method"], "black" if c["lambda2"] is None else colours[c["lambda2"]],
                      "no FLea" if c["lambda2"] is None else f"lambda2 = {c['lambda2']:g}")
                     for c in cells if c["setting"] == setting and c["stage"] == stage]
            for method, colour, label in shown:
                curve = methods[method]["curve"]
                ax.plot(curve["rounds"], [100 * v for v in curve["mean"]], color=colour, label=label, linewidth=1.2)
            ax.set(title=f"{setting}, {stage}", xlabel="round", ylabel="mean client test acc (%)")
            ax.grid(alpha=0.3)
            if i == j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid_dir", type=Path, help="a directory written by 'fedaug compare' (holding grid.json)")
    parser.add_argument("--out", type=Path, help="output directory (default: GRID_DIR/tradeoff)")
    parser.add_argument("--samples", type=int, default=512, help="pooled samples for dCor and the attack (512; the attack takes every test image when the federation holds fewer)")
    parser.add_argument("--epochs", type=int, default=20, help="decoder training epochs (20, as the paper)")
    args = parser.parse_args(argv)
    out = args.out or args.grid_dir / "tradeoff"
    out.mkdir(parents=True, exist_ok=True)
    results = load_grid_results(args.grid_dir)
    for line in results.missing:
        print(f"tradeoff | skipped (not finished): {line}", flush=True)
    cells = summarize(collect(results, out / "runs.json", args.samples, args.epochs), results)
    (out / "tradeoff.json").write_text(json.dumps(cells, indent=1))
    (out / "tradeoff.md").write_text(table(cells))
    figure(cells, [s for s in results.settings if any(c["setting"] == s for c in cells)], out / "tradeoff.png")
    curves(cells, results, out / "curves.png")
    print(table(cells), end="")


if __name__ == "__main__":
    main()
