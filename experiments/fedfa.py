"""FedFA / VFDA experiment grids: resumable, one run directory per (grid, method, seed).

Run: ``nice -n 5 .venv/bin/python experiments/fedfa.py GRID [--seeds 0 1 2] [--out runs/fedfa]``
then ``.venv/bin/python experiments/fedfa.py GRID --table`` for the Markdown table (mean +/- std
over seeds of the final mean client test metric). GRID is one of ``digits4``, ``smartwatch``,
``brain2d``, ``brain3d``, ``brain3d-long`` (60 rounds), ``digits4-why`` and ``smartwatch-why``
(follow-up runs on why FedFA trails FedAvg). A finished run (``summary.json`` present) is
skipped; an interrupted one is resumed from its newest checkpoint, so the command can be re-run
until the grid is complete.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from fedaug import load_config
from fedaug.core.runtime import configure_process
from fedaug.engine.run import resume_experiment, run_experiment

FEDFA = ["method.augs=[fedfa]"]
#: VFDA's noise scaled by the fused variance (Eq. 7 as printed), the presets' value until issue 18
EQ7 = "method.options.vfda.noise_scale=variance"
# grid -> (preset, common overrides, {label: method overrides})
GRIDS: dict[str, tuple[str, list[str], dict[str, list[str]]]] = {
    "digits4": ("digits4", [], {
        "FedAvg": [],
        "FedFA": FEDFA,
        "FedFA (official-compat)": ["method.augs=[fedfa]", "method.options.fedfa.official_compat=true",
                                    "method.options.fedavg.weighting=uniform"],
        "FedFA-C": [*FEDFA, "method.options.fedfa.variance=client"],
        "FedFA-R": [*FEDFA, "method.options.fedfa.variance=fixed"],
    }),
    # why FedFA trails FedAvg at 30 rounds: more rounds, a lower p, later placement, smaller lr, local BN
    "digits4-why": ("digits4", [], {
        "FedAvg, 90 rounds": ["train.rounds=90"],
        "FedFA, 90 rounds": [*FEDFA, "train.rounds=90"],
        "FedFA p=0.2": [*FEDFA, "method.options.fedfa.p=0.2"],
        "FedFA at block3-4": [*FEDFA, "method.options.fedfa.at=[block3,block4]"],
        "FedFA lr 0.02": [*FEDFA, "train.lr=0.02"],
        "FedAvg lr 0.02": ["train.lr=0.02"],
        "FedBN": ["method.base=fedbn"],
        "FedBN + FedFA": ["method.base=fedbn", *FEDFA],
    }),
    "smartwatch": ("fedfa_smartwatch", [], {
        "FedAvg": ["method.augs=[]", "method.options={}"],
        "FedFA": [],
    }),
    # why FedFA trails FedAvg on sensor windows: placement, p, the client-specific variance alone
    "smartwatch-why": ("fedfa_smartwatch", [], {
        "FedFA at block3": ["method.options.fedfa.at=[block3]"],
        "FedFA p=0.2": ["method.options.fedfa.p=0.2"],
        "FedFA-C": ["method.options.fedfa.variance=client"],
    }),
    # VFDA with the noise by the variance (Eq. 7 as printed): the presets' value when these were recorded
    "brain2d": ("vfda_brain_mri_2d", [], {
        "FedAvg": ["method.augs=[]", "method.options={}"],
        "VFDA": [EQ7],
        "VFDA w/o Global": [EQ7, "method.options.vfda.global_variance=false"],
    }),
    "brain3d": ("vfda_brain_mri_3d", [], {
        "FedAvg": ["method.augs=[]", "method.options={}"],
        "VFDA": [EQ7],
    }),
    "brain3d-long": ("vfda_brain_mri_3d", ["train.rounds=60"], {
        "FedAvg": ["method.augs=[]", "method.options={}"],
        "VFDA": [EQ7],
    }),
}


def slug(label: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in label).strip("-").lower()


def claim(cell: Path) -> bool:
    """Take the cell's lock (a file holding our pid) unless a live process holds it: several
    workers can share one grid."""
    cell.mkdir(parents=True, exist_ok=True)
    lock = cell / ".lock"
    try:
        os.kill(int(lock.read_text()), 0)
        return int(lock.read_text()) == os.getpid()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        lock.write_text(str(os.getpid()))
        return lock.read_text() == str(os.getpid())


def run_one(grid: str, label: str, seed: int, out: Path, threads: int) -> dict | None:
    """Run (or resume, or skip) one cell; return its summary (``None`` if another worker has it)."""
    preset, common, methods = GRIDS[grid]
    cell = out / grid / f"{slug(label)}-s{seed}"
    done = sorted(cell.glob("*/summary.json"))
    if done:
        return json.loads(done[-1].read_text())
    if not claim(cell):
        return None
    started = sorted(p for p in cell.glob("*") if (p / "config.toml").is_file())
    t0 = time.time()
    if started:
        summary, _ = resume_experiment(str(started[-1]), quiet=True)
    else:
        overrides = [*common, *methods[label], f"seed={seed}", f"out_dir={cell}", f"name={slug(label)}",
                     f"threads={threads}"]
        cfg, _ = load_config(preset, overrides)
        summary, _ = run_experiment(cfg, quiet=True)
    print(f"{grid} | {label} | seed {seed} | {summary['metric']} "
          f"{summary['final']['eval']['mean']['test_' + summary['metric']]:.4f} | {time.time() - t0:.0f} s", flush=True)
    return summary


def table(grid: str, seeds: list[int], out: Path) -> str:
    """Markdown table of finished runs: mean +/- std over seeds of the final mean client test metric."""
    _, _, methods = GRIDS[grid]
    rows = ["| method | seeds | final mean client test | best-by-val round's test |", "|---|---:|---|---|"]
    for label in methods:
        finals, bests = [], []
        for seed in seeds:
            found = sorted((out / grid / f"{slug(label)}-s{seed}").glob("*/summary.json"))
            if found:
                s = json.loads(found[-1].read_text())
                key = "test_" + s["metric"]
                finals.append(s["final"]["eval"]["mean"][key])
                bests.append(s["best"]["eval"]["mean"][key])
        if not finals:
            rows.append(f"| {label} | 0 | not run | not run |")
            continue

        def fmt(v: list[float]) -> str:
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            return f"{100 * statistics.mean(v):.2f} +/- {100 * sd:.2f}"

        rows.append(f"| {label} | {len(finals)} | {fmt(finals)} | {fmt(bests)} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", choices=sorted(GRIDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", help="labels to run (default: all of the grid)")
    parser.add_argument("--out", type=Path, default=Path("runs/fedfa"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--table", action="store_true", help="print the table of finished runs and exit")
    args = parser.parse_args()
    configure_process(args.threads)  # a script is a process entry point
    if args.table:
        print(table(args.grid, args.seeds, args.out))
        return
    labels = args.methods or list(GRIDS[args.grid][2])
    for seed in args.seeds:  # seed-major: partial grids still give paired comparisons
        for label in labels:
            run_one(args.grid, label, seed, args.out, args.threads)
    print(table(args.grid, args.seeds, args.out))


if __name__ == "__main__":
    main()
