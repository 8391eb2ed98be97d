"""Engine overhead and scaling benchmark (not a test: it reports, it does not assert).

1. Engine vs a bare PyTorch loop doing the same local steps on the same data with the same model
   (FedAvg, 4 clients): median per-round training time (evaluation excluded), their ratio, and
   each one's peak memory (max RSS of its own process).
2. Per-round time and peak memory with 10, 100 and 1,000 total clients at 10 sampled per round.

Every measurement runs in a fresh subprocess; engine and bare loop alternate so that machine noise
hits both. Run: ``.venv/bin/python benchmarks/bench_engine.py`` (add ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from fedaug.core.runtime import retain_freed_memory
from fedaug.engine.records.installation import machine_line


def data_options(num_clients: int, samples: int, channels: int = 3) -> dict:
    return {"num_clients": num_clients, "samples_per_client": samples, "num_classes": 10,
            "channels": channels, "size": 28}


def config(num_clients: int, samples: int, participation: float, rounds: int, steps: int, channels: int = 3):
    from fedaug.config.schema import validate

    return validate({
        "seed": 0, "data": {"name": "synthetic", "options": data_options(num_clients, samples, channels)},
        "model": {"name": "small_cnn"},
        "train": {"rounds": rounds, "participation": participation, "local_steps": steps,
                  "batch_size": 32, "lr": 0.05},
        "eval": {"every": 10**6},
    })


def engine_rounds(num_clients: int, samples: int, participation: float, rounds: int, steps: int,
                  channels: int = 3) -> list[tuple[float, float]]:
    """Per-round (wall, process CPU) seconds of the engine (evaluation excluded: it never runs mid-run)."""
    from fedaug.engine.run import build_simulation

    cfg = config(num_clients, samples, participation, rounds, steps, channels)
    torch.set_num_threads(cfg.threads)  # the library leaves threads to the caller (the CLI sets them)
    sim = build_simulation(cfg)
    times = []
    for r in range(1, rounds + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        sim.run_round(r)
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def bare_rounds(num_clients: int, samples: int, rounds: int, steps: int) -> list[tuple[float, float]]:
    """The same work written as a plain PyTorch FedAvg loop (every client, every round; the loop of
    ``bench_throughput.py``): load, SGD steps, weighted average."""
    from bench_throughput import Job
    from bench_throughput import bare_rounds as bare_loop

    return bare_loop(Job("E", "small_cnn", 3, num_clients, samples, num_clients, steps, 32), rounds, threads=2)


def child(kind: str, args: list[str]) -> None:
    """Run one measurement in this process and print JSON: round times and peak RSS (MB)."""
    n, samples, part, rounds, steps = int(args[0]), int(args[1]), float(args[2]), int(args[3]), int(args[4])
    if kind == "engine":
        times = engine_rounds(n, samples, part, rounds, steps, int(args[5]) if len(args) > 5 else 3)
    else:
        times = bare_rounds(n, samples, rounds, steps)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"times": times, "peak_mb": peak_mb}))


def measure(kind: str, *args: object) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, *map(str, args)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds only (smoke run)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating engine/bare repeats")
    args = parser.parse_args()
    print(machine_line() + "\n")  # docs/benchmarks.md names the machine of every figure
    retain_freed_memory()  # a process setting of every fedaug run: the bare loop gets it too
    rounds, steps, repeats = (3, 5, 1) if args.quick else (6, 20, args.repeats)
    warm = 1  # the first round pays one-time costs (lazy imports, allocator warm-up) in both

    eng, bare, eng_mem, bare_mem = [], [], [], []
    for _ in range(repeats):
        e = measure("engine", 4, 320, 1.0, rounds, steps)
        b = measure("bare", 4, 320, 1.0, rounds, steps)
        eng += e["times"][warm:]
        bare += b["times"][warm:]
        eng_mem.append(e["peak_mb"])
        bare_mem.append(b["peak_mb"])
    wall_e, wall_b = (statistics.median(t[0] for t in x) for x in (eng, bare))
    cpu_e, cpu_b = (statistics.median(t[1] for t in x) for x in (eng, bare))
    print("## Engine vs bare PyTorch loop (FedAvg, 4 clients x "
          f"{steps} local steps of small_cnn, batch 32, 3x28x28; {len(eng)} rounds each)\n")
    print("| loop | median wall s/round | median process CPU s/round | peak RSS (MB) |\n|---|---:|---:|---:|")
    print(f"| fedaug engine | {wall_e:.3f} | {cpu_e:.3f} | {max(eng_mem):.0f} |")
    print(f"| bare PyTorch | {wall_b:.3f} | {cpu_b:.3f} | {max(bare_mem):.0f} |")
    print(f"\nratio engine / bare: wall **{wall_e / wall_b:.3f}**, CPU time **{cpu_e / cpu_b:.3f}** "
          "(target <= 1.05; CPU time is the steadier figure on a shared machine)\n")

    print(f"## Scaling with the number of clients (10 sampled per round, {steps} local steps each, "
          "64 train samples per client, 1x28x28)\n")
    print("| total clients | median s/round | peak RSS (MB) | of which the dataset (MB) |\n|---|---:|---:|---:|")
    for n in (10, 100, 1000):
        res = measure("engine", n, 64, 10 / n, rounds, steps, 1)
        data_mb = n * (64 + 2 * 16) * 28 * 28 * 4 / 2**20  # train + val + test float32 inputs
        wall = statistics.median(t[0] for t in res["times"][warm:])
        print(f"| {n} | {wall:.3f} | {res['peak_mb']:.0f} | {data_mb:.0f} |")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
    else:
        main()
