"""Per-round time of one experiment on each engine: in-process, Flower's message path in one process,
Flower simulation (Ray) and a loopback Flower deployment (not a test: it reports, it does not assert).

The experiment: FedFA on the synthetic dataset, 2 clients, small_cnn, 5 local steps of batch 32,
evaluation every round. Each engine runs the same config in a fresh subprocess; the per-round times
are the server's own records (``time.train_s`` + ``time.eval_s`` in ``metrics.jsonl``: sampling,
every message both ways, training, aggregation and evaluation of all clients), and the table shows
their medians over rounds 2..R (round 1 also pays one-time costs: data, model, Ray start-up). The
engines also report the final mean test accuracy, which must be equal.

Run: ``.venv/bin/python benchmarks/bench_flower.py`` (``--rounds 3`` for a quicker run; at least 2). Flower
simulation runs where Ray is importable (``pip install 'flwr[simulation]>=1.41,<1.43'``) and is
reported as not installed elsewhere.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENGINES = ("in-process", "flower in-process", "flower simulation", "flower deployment")
NUM_CLIENTS = 2


def config(rounds: int, out_dir: str) -> Any:
    from fedaug.config.schema import validate

    return validate({
        "seed": 0, "name": "bench-flower", "out_dir": out_dir,
        "data": {"name": "synthetic", "options": {"num_clients": NUM_CLIENTS, "samples_per_client": 200,
                                                  "num_classes": 10, "size": 28}},
        "model": {"name": "small_cnn"},
        "method": {"augs": ["fedfa"]},
        "train": {"rounds": rounds, "local_steps": 5, "batch_size": 32, "lr": 0.05},
        "eval": {"every": 1},
    })


def run_engine(engine: str, rounds: int, workdir: Path) -> dict[str, Any]:
    """Run the experiment on ``engine``; return its per-round times and final mean test accuracy."""
    cfg = config(rounds, str(workdir / "runs"))
    if engine == "in-process":
        from fedaug.engine.run import run_experiment

        summary, _ = run_experiment(cfg, quiet=True)
    elif engine == "flower in-process":
        from fedaug.engine.flower.inprocess import run_in_process

        summary = run_in_process(cfg, NUM_CLIENTS, quiet=True)
    elif engine == "flower simulation":
        from fedaug.engine.flower.simulation import run_flower_simulation

        summary = run_flower_simulation(cfg, NUM_CLIENTS, quiet=True)
    elif engine == "flower deployment":
        from fedaug.engine.flower.app import write_app
        from fedaug.engine.flower.local import LoopbackTrial

        trial = LoopbackTrial(write_app(cfg, workdir / "app"), workdir, NUM_CLIENTS)
        with trial.running():
            trial.call(trial.flwr_run(), timeout=3600)
        (run_dir,) = (workdir / "runs").iterdir()
        summary = json.loads((run_dir / "summary.json").read_text())
    else:
        raise ValueError(f"unknown engine '{engine}'; choose from {', '.join(ENGINES)}")
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    times = [json.loads(line)["time"] for line in lines]
    return {"train_s": [t["train_s"] for t in times], "eval_s": [t["eval_s"] for t in times],
            "final_test_acc": summary["final"]["eval"]["mean"]["test_acc"]}


def measure(engine: str, rounds: int) -> dict[str, Any]:
    """Run one engine in a fresh subprocess; its result, or why it did not run."""
    if engine == "flower simulation" and importlib.util.find_spec("ray") is None:
        return {"skipped": "Ray is not installed (pip install 'flwr[simulation]>=1.41,<1.43')"}
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        cmd = [sys.executable, __file__, "--child", engine, "--rounds", str(rounds), "--workdir", tmp]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"})
        wall = time.perf_counter() - t0
    if out.returncode != 0:
        return {"skipped": f"failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}"}
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall_s": wall}


def table(results: dict[str, dict[str, Any]]) -> str:
    base = None
    rows = ["| engine | median round (s) | median train (s) | median eval (s) | vs in-process | whole run (s) "
            "| final mean test acc |", "|---|---:|---:|---:|---:|---:|---:|"]
    for engine, res in results.items():
        if "skipped" in res:
            rows.append(f"| {engine} | {res['skipped']} | | | | | |")
            continue
        train, evals = res["train_s"][1:], res["eval_s"][1:]  # round 1 pays one-time costs
        med = statistics.median(a + b for a, b in zip(train, evals))
        base = base or med
        rows.append(f"| {engine} | {med:.2f} | {statistics.median(train):.2f} | "
                    f"{statistics.median(evals):.2f} | {med / base:.1f}x | {res['wall_s']:.1f} | "
                    f"{res['final_test_acc']:.4f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_engine(args.child, args.rounds, args.workdir)))
        return
    results = {engine: measure(engine, args.rounds) for engine in args.engines}
    print(f"FedFA, synthetic, {NUM_CLIENTS} clients, small_cnn, 5 local steps of 32, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs\n")
    print(table(results))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
