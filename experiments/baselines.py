"""The baselines table (FedRDN, arXiv:2310.14390, Table 1, on fedaug's data): every baseline with
no augmentation, with FedRDN and with FedFA, on Digits-4 (feature shift) and Fashion-MNIST Dir(0.3)
(label skew), over seeds; mean +/- std of the final mean-over-clients test accuracy.

Each cell is one run directory under ``<out>/<setting>/<method>+<aug>/``; a finished one (it holds
``summary.json``) is skipped, an interrupted one is resumed from its checkpoint, so re-running the
command continues the grid. The table is rebuilt from the run directories every time.

    python experiments/baselines.py --quick                      # smoke test: 1 seed, 2 rounds
    nice -n 10 python experiments/baselines.py --settings digits4 --seeds 0 --rounds 10
    python experiments/baselines.py --table-only                 # just rebuild the table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from fedaug.config.load import load_config
from fedaug.core.serialize import atomic_write_text
from fedaug.engine.simulate import resume_experiment, run_experiment
from fedaug.methods import METHODS

#: setting -> overrides of the digits4 preset (small_cnn, SGD 0.05, batch 32, 1 local epoch).
SETTINGS = {
    "digits4": ["data.name=digits4"],
    "fmnist-dir0.3": ["data.name=fashion_mnist", "data.options.alpha=0.3"],
}
#: rows: (label, base, add-on augmentations). Add-ons (FedDecorr, CCVR) go on FedAvg, after the column's augmentation.
ROWS = [(name, name, []) for name in ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedbn", "scaffold",
                                      "fednova", "feddyn", "fedsam", "moon", "fedlc", "fedntd", "fedproto", "fedrs")]
ROWS += [("fedavg+feddecorr", "fedavg", ["feddecorr"]), ("fedavg+ccvr", "fedavg", ["ccvr"])]
COLUMNS = ["none", "fedrdn", "fedfa"]


def cell_dir(out: Path, setting: str, row: str, aug: str) -> Path:
    return out / setting / f"{row}+{aug}"


def find_run(cell: Path, seed: int) -> Path | None:
    """The newest run directory of ``seed`` in ``cell`` (``seed<k>-<timestamp>``), if any."""
    runs = sorted(p for p in cell.glob(f"seed{seed}-*") if (p / "config.toml").is_file())
    return runs[-1] if runs else None


def run_cell(out: Path, setting: str, row: tuple[str, str, list[str]], aug: str, seed: int,
             extra: list[str]) -> str:
    """Run (or resume, or skip) one (setting, row, column, seed); return what happened."""
    label, base, addons = row
    augs = ([] if aug == "none" else [aug]) + addons
    cell = cell_dir(out, setting, label, aug)
    existing = find_run(cell, seed)
    if existing is not None and (existing / "summary.json").is_file():
        return "done before"
    if existing is not None:
        resume_experiment(str(existing), quiet=True)
        return "resumed"
    overrides = SETTINGS[setting] + [f"method.base={base}", f"method.augs=[{', '.join(augs)}]", f"seed={seed}",
                                     f"out_dir={cell}", f"name=seed{seed}"] + extra
    cfg, _ = load_config("digits4", overrides)
    run_experiment(cfg, quiet=True)
    return "ran"


def final_accuracy(run: Path) -> float | None:
    summary = json.loads((run / "summary.json").read_text())
    final = summary.get("final")
    return None if final is None else final["eval"]["mean"][f"test_{summary['metric']}"]


def table(out: Path, settings: list[str], rows: list[tuple[str, str, list[str]]], seeds: list[int]) -> str:
    """Markdown: one row per method, one column per (setting, augmentation): mean +/- std (n runs)."""
    cols = [(s, a) for s in settings for a in COLUMNS]
    lines = ["| method | " + " | ".join(f"{s} {a}" for s, a in cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, _, _ in rows:
        cells = []
        for s, a in cols:
            accs = []
            for seed in seeds:
                run = find_run(cell_dir(out, s, label, a), seed)
                if run is not None and (run / "summary.json").is_file():
                    accs.append(100 * final_accuracy(run))
            if not accs:
                cells.append("-")
            elif len(accs) == 1:
                cells.append(f"{accs[0]:.2f} (n=1)")
            else:
                cells.append(f"{statistics.mean(accs):.2f} ± {statistics.stdev(accs):.2f} (n={len(accs)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="root of the run directories (runs/baselines, or runs/baselines-quick)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    ap.add_argument("--rows", default="", help="comma list of method rows (default: all)")
    ap.add_argument("--augs", default=",".join(COLUMNS), help=f"comma list of {', '.join(COLUMNS)}")
    ap.add_argument("--seeds", default="0,1,2", help="comma list of seeds")
    ap.add_argument("--rounds", type=int, default=None, help="override train.rounds (preset: 30)")
    ap.add_argument("--quick", action="store_true", help="smoke test: seed 0, 2 rounds of 5 local steps")
    ap.add_argument("--table-only", action="store_true", help="only rebuild the table from existing runs")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides for every run")
    args = ap.parse_args(argv)

    out = Path(args.out or ("runs/baselines-quick" if args.quick else "runs/baselines"))
    settings = [s for s in args.settings.split(",") if s]
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",") if s]
    rows = [r for r in ROWS if not args.rows or r[0] in args.rows.split(",")]
    augs = [a for a in args.augs.split(",") if a]
    extra = list(args.overrides)
    if args.quick:
        extra += ["train.rounds=2", "train.local_steps=5", "eval.every=2"]
    elif args.rounds is not None:
        extra += [f"train.rounds={args.rounds}"]
    problems = [f"unknown setting '{s}'" for s in settings if s not in SETTINGS]
    problems += [f"unknown column '{a}'" for a in augs if a not in COLUMNS]
    if problems:
        ap.error("; ".join(problems))
    missing = [a for a in augs if a != "none" and a not in METHODS]
    if missing:
        print(f"skipping column(s) {', '.join(missing)}: not registered in this fedaug", file=sys.stderr)
        augs = [a for a in augs if a not in missing]

    if not args.table_only:
        cells = [(s, r, a, seed) for s in settings for r in rows for a in augs for seed in seeds]
        for i, (s, r, a, seed) in enumerate(cells, 1):
            t0 = time.perf_counter()
            try:
                what = run_cell(out, s, r, a, seed, extra)
            except Exception as exc:  # one failing cell must not stop the grid; it is reported
                what = f"FAILED: {type(exc).__name__}: {exc}"
            print(f"[{i}/{len(cells)}] {s} {r[0]}+{a} seed {seed}: {what} ({time.perf_counter() - t0:.0f} s)", flush=True)
    text = table(out, settings, rows, seeds)
    atomic_write_text(out / "table.md", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
