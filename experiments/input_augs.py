"""Input-level and local augmentations on Digits-4 (4 clients, one per domain): run, resume, tabulate.

Usage::

    nice -n 10 .venv/bin/python experiments/input_augs.py run --seeds 0 1 2      # skips finished runs
    .venv/bin/python experiments/input_augs.py table [--plot docs/figures/input_augs.png]

Each (method, seed) is one ``digits4`` run under ``--out`` named ``<method>-s<seed>``; a finished run
(its directory holds ``summary.json``) is skipped, an interrupted one is resumed from its checkpoint.
The table reports the final round's mean client test accuracy (mean +/- std over the seeds that ran),
its per-client means, the test accuracy at the round chosen by validation, the paired t-test of
each method against FedAvg over the shared seeds, and the total bytes each method's own message
parts moved (up + down, all rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fedaug.config.load import load_config
from fedaug.core.runtime import configure_process
from fedaug.engine.run import resume_experiment, run_experiment
from fedaug.methods import METHODS
from fedaug.report.stats import mean_std, paired_ttest

#: label -> (augmentations, overrides); all on FedAvg.
METHODS_GRID: dict[str, tuple[list[str], list[str]]] = {
    "fedavg": ([], []),
    "fedavg+norm": (["norm"], []),
    "fedavg+fedmix": (["fedmix"], []),
    "fedavg+fedrdn": (["fedrdn"], []),
    "fedavg+fedrdn_v": (["fedrdn"], ["method.options.fedrdn.variant=average"]),
    "fedfa": (["fedfa"], []),
    "fedfa+fedrdn": (["fedrdn", "fedfa"], []),
    "fedavg+mixstyle": (["mixstyle"], []),
    "fedavg+moex": (["moex"], []),
    "fedavg+mixup": (["mixup"], []),
}


def run_name(label: str, seed: int) -> str:
    return f"{label.replace('+', '_')}-s{seed}"


def find_run(out: Path, name: str) -> Path | None:
    """The newest run directory for ``name`` (``<name>-<timestamp>``), or ``None``."""
    found = sorted(p for p in out.glob(f"{name}-2*") if (p / "config.toml").is_file())
    return found[-1] if found else None


def run(out: Path, seeds: list[int], labels: list[str], extra: list[str]) -> None:
    for seed in seeds:
        for label in labels:
            augs, overrides = METHODS_GRID[label]
            missing = [a for a in augs if a not in METHODS.names()]
            if missing:
                print(f"skip {label}: component(s) {missing} not registered")
                continue
            name = run_name(label, seed)
            done = find_run(out, name)
            if done is not None and (done / "summary.json").is_file():
                print(f"done {name}: {done}")
                continue
            if done is not None:
                print(f"resume {name}: {done}", flush=True)
                resume_experiment(str(done), quiet=True)
                continue
            cfg, _ = load_config("digits4", [f"seed={seed}", f"name={name}", f"out_dir={out}",
                                             f"method.augs=[{', '.join(augs)}]", *overrides, *extra])
            print(f"run {name}", flush=True)
            configure_process(cfg.threads)  # a script is a process entry point
            summary, _ = run_experiment(cfg, quiet=True)
            print(f"  final mean test acc {summary['final']['eval']['mean']['test_acc']:.4f}", flush=True)


def collect(out: Path, labels: list[str]) -> dict[str, dict[int, dict]]:
    """Per label, per seed of a finished run: final mean and per-client test accuracy, the test
    accuracy at the round chosen by validation, and the bytes the method's own parts moved."""
    rows: dict[str, dict[int, dict]] = {}
    for label in labels:
        augs, _ = METHODS_GRID[label]
        rows[label] = {}
        for summary_path in sorted(out.glob(f"{label.replace('+', '_')}-s*-2*/summary.json")):
            summary = json.loads(summary_path.read_text())
            seed = int(summary_path.parent.name.rsplit("-s", 1)[1].split("-")[0])
            records = [json.loads(line) for line in (summary_path.parent / "metrics.jsonl").read_text().splitlines()]
            final = summary["final"]["eval"]
            rows[label][seed] = {
                "acc": final["mean"]["test_acc"],
                "clients": {c: v["test"]["acc"] for c, v in final["clients"].items()},
                "best": summary["best"]["eval"]["mean"]["test_acc"],
                "comm": sum(r["comm"]["up"].get(a, 0) + r["comm"]["down"].get(a, 0) for r in records for a in augs),
            }
    return rows


def table(out: Path, labels: list[str], plot: Path | None) -> None:
    """Print the Markdown table: mean +/- std over seeds, per-client means, the paired t-test of
    each method against FedAvg over the seeds both ran, and the augmentation's traffic."""
    rows = collect(out, labels)
    clients = next((list(r["clients"]) for runs in rows.values() for r in runs.values()), [])
    base = rows.get("fedavg", {})
    print(f"| method | seeds | final mean test acc (%) | {' | '.join(clients)} | best-by-val test acc (%) | "
          "vs FedAvg: mean diff, p (paired) | augmentation traffic, 30 rounds |")
    print("|---|---:|---|" + "---:|" * len(clients) + "---|---|---:|")
    for label, runs in rows.items():
        if not runs:
            print(f"| {label} | 0 | not run |{' |' * len(clients)} | | |")
            continue
        acc, best = mean_std([100 * r["acc"] for r in runs.values()]), mean_std([100 * r["best"] for r in runs.values()])
        per_client = [statistics.mean(100 * r["clients"][c] for r in runs.values()) for c in clients]
        seeds = sorted(set(runs) & set(base))
        test = paired_ttest([100 * runs[s]["acc"] for s in seeds], [100 * base[s]["acc"] for s in seeds])
        versus = "-" if label == "fedavg" else f"{test.diff:+.2f}, p = {test.text()}"
        print(f"| {label} | {len(runs)} | {acc[0]:.2f} +/- {acc[1]:.2f} | "
              f"{' | '.join(f'{a:.1f}' for a in per_client)} | {best[0]:.2f} +/- {best[1]:.2f} | {versus} | "
              f"{int(next(iter(runs.values()))['comm']):,} B |")
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        done = [(k, [100 * r["acc"] for r in v.values()]) for k, v in rows.items() if v]
        stats = [mean_std(a) for _, a in done]
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.bar(range(len(done)), [m for m, _ in stats], yerr=[sd for _, sd in stats], capsize=3)
        for i, (_, a) in enumerate(done):
            ax.plot([i] * len(a), a, "k.", ms=4)
        ax.set_xticks(range(len(done)), [k for k, _ in done], rotation=30, ha="right")
        ax.set_ylabel("final mean client test acc (%)")
        ax.set_ylim(min(min(a) for _, a in done) - 5, 100)
        fig.tight_layout()
        plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=120)
        print(f"wrote {plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run", "table"])
    parser.add_argument("--out", type=Path, default=Path("runs/input_augs"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS_GRID), choices=list(METHODS_GRID))
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="extra key=value config override, repeatable (e.g. --set train.rounds=5)")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.seeds, args.methods, args.overrides)
    else:
        table(args.out, args.methods, args.plot)


if __name__ == "__main__":
    main()
