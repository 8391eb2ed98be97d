"""Ray's overhead (issue 49; not a test: it reports, it does not assert), on bench_throughput.py's jobs W1 and W2.

- **Per round**: the job's rounds with ``workers = 2, threads = 1`` on worker processes of this machine
  (``fleet = "local"``) and on two Ray actors (``fleet = "ray"``, a Ray started on this machine, 1 CPU per
  actor), against ``workers = 1, threads = 1``. Each measurement is a fresh process: one warm-up round (the
  workers or actors start), then timed rounds; medians.
- **Per cell**: a grid of two cells of the job (2 seeds, ``--rounds`` rounds, ``threads = 1``, evaluation
  and checkpoints at the end only), run by the local runner (``--jobs 2``) and as Ray tasks (``--ray``,
  the Ray of this machine already started: a cluster is up before a grid is sent to it); the grid's
  wall time over its cells, and Ray's start on its own.

Only 127.0.0.1 is used (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's single-host mode). Run:
``.venv/bin/python benchmarks/bench_ray.py`` (~6 min on 2 cores); ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_throughput import JOBS, LR, MOMENTUM, WEIGHT_DECAY, Job, engine_config, timed_round  # noqa: E402


def rounds_child(job: Job, rounds: int, workers: int, fleet: str) -> list[float]:
    """Wall seconds of each round of ``job`` (the first included)."""
    from fedaug.config.schema import validate
    from fedaug.core.runtime import configure_process
    from fedaug.engine.run import build_simulation

    raw = engine_config(job, rounds, 1, workers).to_dict()
    cfg = validate({**raw, "fleet": fleet, "ray": {"address": "local"}})
    configure_process(1)
    with build_simulation(cfg) as sim:
        return [timed_round(sim.run_round, r, "cpu")[0][0] for r in range(1, rounds + 1)]


def grid_raw(job: Job, rounds: int) -> dict:
    """A grid file's contents: ``job`` as FedAvg, 2 seeds, evaluation and checkpoints at the end only."""
    return {"description": f"job {job.name}", "kind": "stand-in", "reproduces": "nothing (a benchmark)",
            "seeds": [0, 1], "methods": {"FedAvg": {}},
            "common": {"threads": 1, "checkpoint_every": rounds, "data": {"name": "synthetic",
                                                                         "options": job.data_options},
                       "model": {"name": job.model}, "eval": {"every": rounds},
                       "train": {"rounds": rounds, "participation": job.per_round / job.num_clients,
                                 "local_steps": job.steps, "batch_size": job.batch, "lr": LR, "momentum": MOMENTUM,
                                 "weight_decay": WEIGHT_DECAY}}}


def cells_child(job: Job, rounds: int, where: str) -> dict:
    """Wall seconds of the two-cell grid of ``job`` run ``where`` (``"jobs"``: --jobs 2; ``"ray"``), and of
    Ray's start (before the grid)."""
    from fedaug.core.cluster import connect
    from fedaug.core.runtime import configure_process
    from fedaug.report.grid import parse_grid
    from fedaug.report.ray_cells import RayCells
    from fedaug.report.runner import run_grid

    configure_process()
    spec = parse_grid(grid_raw(job, rounds), f"bench-{job.name}")
    start = 0.0
    if where == "ray":
        t0 = time.perf_counter()
        connect("local")
        start = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        run_grid(spec, Path(out), jobs=2 if where == "jobs" else 1, ray=RayCells("local") if where == "ray" else None)
        return {"grid_s": time.perf_counter() - t0, "ray_start_s": start}


def measure(**spec: object) -> object:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=["W1", "W2"], choices=sorted(JOBS))
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per measurement (after 1 warm-up)")
    parser.add_argument("--cell-rounds", type=int, default=3, help="rounds of each grid cell")
    parser.add_argument("--quick", action="store_true", help="2 timed rounds, 1-round cells (smoke run)")
    args = parser.parse_args()
    from fedaug.engine.records.installation import machine_line

    print(machine_line() + "\n")
    rounds, cell_rounds = (2, 1) if args.quick else (args.rounds, args.cell_rounds)
    print(f"## Per round ({rounds} timed rounds after 1 warm-up; median wall s/round)\n")
    print("| job | workers = 1 | workers = 2, processes | workers = 2, Ray actors | Ray / processes | "
          "first round: processes, Ray (s) |\n|---|---:|---:|---:|---:|---:|")
    for name in args.jobs:
        job = JOBS[name]
        got = {k: measure(kind="rounds", job=name, rounds=rounds + 1, workers=w, fleet=f)
               for k, (w, f) in {"one": (1, "local"), "proc": (2, "local"), "ray": (2, "ray")}.items()}
        med = {k: statistics.median(v[1:]) for k, v in got.items()}
        print(f"| {name} | {med['one']:.3f} | {med['proc']:.3f} | {med['ray']:.3f} | {med['ray'] / med['proc']:.2f} "
              f"| {got['proc'][0]:.1f}, {got['ray'][0]:.1f} |")
    print(f"\n## Per cell (a grid of 2 cells x {cell_rounds} rounds; wall s of the grid)\n")
    print("| job | --jobs 2 | --ray (Ray already up) | Ray / local per cell (s) | Ray's start (s) |\n"
          "|---|---:|---:|---:|---:|")
    for name in args.jobs:
        local = measure(kind="cells", job=name, rounds=cell_rounds, where="jobs")
        ray = measure(kind="cells", job=name, rounds=cell_rounds, where="ray")
        print(f"| {name} | {local['grid_s']:.1f} | {ray['grid_s']:.1f} | "
              f"{(ray['grid_s'] - local['grid_s']) / 2:+.1f} | {ray['ray_start_s']:.1f} |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        spec = json.loads(sys.argv[2])
        job = JOBS[spec["job"]]
        if spec["kind"] == "rounds":
            print(json.dumps(rounds_child(job, spec["rounds"], spec["workers"], spec["fleet"])))
        else:
            print(json.dumps(cells_child(job, spec["rounds"], spec["where"])))
    else:
        main()
