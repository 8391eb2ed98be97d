"""Ray's overhead (issue 49; not a test: it reports, it does not assert), on bench_throughput.py's jobs W1 and W2.

- **Per round**: the job's rounds (evaluation off, ``threads = 1``) with ``workers = 1``, with ``workers = 2``
  worker processes of this machine (``fleet = "local"``) and with two Ray actors (``fleet = "ray"``, a Ray
  started on this machine for the measurement, 1 CPU per actor). Each measurement is a fresh process: one
  warm-up round (the workers or actors start: reported as "first round"), then timed rounds; the three
  settings alternate, ``--repeats`` times, in rotating order, so that what slows the machine for a while slows
  all three. Reported: the median s/round of each and the ratios of the medians.
- **Per cell**: a grid of two cells of the job (2 seeds, ``--cell-rounds`` rounds, ``threads = 1``, evaluation
  and checkpoints at the end only) run by the local runner (``--jobs 1``) and as Ray tasks (``--ray``) on a Ray
  of 1 CPU (so that one cell runs at a time, as with ``--jobs 1``), started before the grid as on a cluster
  that is up; alternating, ``--repeats`` times. Reported: the grid's median wall time,
  Ray's extra time per cell (the difference over the two cells) and Ray's start, which a grid sent to a
  running cluster does not pay.

Run it on one core, so that the figures are CPU overhead, not parallelism: ``taskset -c 0 .venv/bin/python
benchmarks/bench_ray.py`` (every child and Ray process inherits the core; ~30 min on the shared 2-core development
machine); ``--quick`` for a smoke run.
Only 127.0.0.1 is used (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's single-host mode).
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

#: the per-round settings: label -> (workers, fleet)
SETTINGS = {"workers = 1": (1, "local"), "workers = 2, processes": (2, "local"), "workers = 2, Ray actors": (2, "ray")}


def start_ray(num_cpus: int) -> float:
    """Start a Ray on this machine with ``num_cpus`` CPUs (no dashboard); the seconds it took."""
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    return time.perf_counter() - t0


def rounds_child(job: Job, rounds: int, workers: int, fleet: str) -> list[float]:
    """Wall seconds of each round of ``job`` (the first included)."""
    from fedaug.config.schema import validate
    from fedaug.core.runtime import configure_process
    from fedaug.engine.run import build_simulation

    if fleet == "ray":
        start_ray(workers)  # an actor reserves 1 CPU (threads = 1): room for every one, as the processes have
    cfg = validate({**engine_config(job, rounds, 1, workers).to_dict(), "fleet": fleet})
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
    """Wall seconds of the two-cell grid of ``job`` run ``where`` (``"local"``: --jobs 1; ``"ray"``), and of
    Ray's start (before the grid)."""
    from fedaug.core.runtime import configure_process
    from fedaug.report.grid import parse_grid
    from fedaug.report.ray_cells import RayCells
    from fedaug.report.runner import run_grid

    configure_process()
    spec = parse_grid(grid_raw(job, rounds), f"bench-{job.name}")
    start = start_ray(1) if where == "ray" else 0.0  # a cell reserves 1 CPU: one at a time, as --jobs 1
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        run_grid(spec, Path(out), ray=RayCells("auto") if where == "ray" else None)  # auto: the Ray just started
        return {"grid_s": time.perf_counter() - t0, "ray_start_s": start}


def measure(**spec: object) -> object:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_round(jobs: list[str], rounds: int, repeats: int) -> None:
    print(f"## Per round ({repeats} alternating repeats x {rounds} timed rounds after 1 warm-up; median wall s)\n")
    print("| job | workers = 1 | workers = 2, processes | workers = 2, Ray actors | Ray / processes | Ray / workers = 1 "
          "| first round: processes, Ray (s) |\n|---|---:|---:|---:|---:|---:|---:|")
    for name in jobs:
        times: dict[str, list[float]] = {k: [] for k in SETTINGS}
        first: dict[str, list[float]] = {k: [] for k in SETTINGS}
        labels = list(SETTINGS)
        for rep in range(repeats):
            for label in labels[rep % 3:] + labels[:rep % 3]:  # each setting first, second and last in turn
                workers, fleet = SETTINGS[label]
                got = measure(kind="rounds", job=name, rounds=rounds + 1, workers=workers, fleet=fleet)
                first[label].append(got[0])
                times[label] += got[1:]
        med = {k: statistics.median(v) for k, v in times.items()}
        one, proc, ray = (med[k] for k in labels)
        print(f"| {name} | {one:.3f} | {proc:.3f} | {ray:.3f} | {ray / proc:.2f} | {ray / one:.2f} | "
              f"{statistics.median(first[labels[1]]):.1f}, {statistics.median(first[labels[2]]):.1f} |")
    print()


def per_cell(jobs: list[str], rounds: int, repeats: int) -> None:
    print(f"## Per cell (a grid of 2 cells x {rounds} rounds; {repeats} alternating repeats; median wall s)\n")
    print("| job | local runner (--jobs 1) | --ray (Ray already up) | Ray / local | Ray's extra per cell (s) "
          "| Ray's start (s) |\n|---|---:|---:|---:|---:|---:|")
    for name in jobs:
        got: dict[str, list[dict]] = {"local": [], "ray": []}
        for rep in range(repeats):
            for where in (("local", "ray") if rep % 2 == 0 else ("ray", "local")):
                got[where].append(measure(kind="cells", job=name, rounds=rounds, where=where))
        local, ray = (statistics.median(g["grid_s"] for g in got[w]) for w in ("local", "ray"))
        start = statistics.median(g["ray_start_s"] for g in got["ray"])
        print(f"| {name} | {local:.1f} | {ray:.1f} | {ray / local:.2f} | {(ray - local) / 2:+.1f} | {start:.1f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", default=["W1", "W2"], choices=sorted(JOBS))
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds per measurement (after 1 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repeats of each measurement")
    parser.add_argument("--cell-rounds", type=int, default=3, help="rounds of each grid cell")
    parser.add_argument("--quick", action="store_true", help="2 timed rounds, 1-round cells, 1 repeat (smoke run)")
    args = parser.parse_args()
    from fedaug.engine.records.installation import machine_line

    print(machine_line() + f"; this process on CPUs {sorted(os.sched_getaffinity(0))}\n")
    rounds, cell_rounds, repeats = (2, 1, 1) if args.quick else (args.rounds, args.cell_rounds, args.repeats)
    per_round(args.jobs, rounds, repeats)
    per_cell(args.jobs, cell_rounds, repeats)


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
