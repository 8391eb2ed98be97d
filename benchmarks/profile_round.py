"""Where an engine round's time goes against the lean floor's, on one device (issue 46; not a test: it reports).

For each model of ``bench_device.py`` (the same configurations, FedAvg, 2 clients x 10 steps), one process:

* wall seconds per round of the engine and of the lean loop (``bench_device.LeanRound``), alternating;
* under ``torch.profiler``, per round: the kernels launched, their summed device time, and the host waits
  (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaMemcpyAsync``; ``aten::_local_scalar_dense``,
  torch's own host reads) of each side, and the ATen operators the engine calls most often beyond the lean loop;
* the synchronisations per round and per local step of each side (issue 63): the stream and device
  synchronisations on CUDA (every host read is one, and so is a copy from pageable host memory), the host reads
  on a CPU (where nothing else waits);
* ``cProfile`` of engine rounds: fedaug's functions by cumulative time (on a GPU a host read's wait lands in the
  function that reads).

The gap between wall time and device time is launch and Python cost; host waits are synchronisations. Run:
``PYTHONPATH=src:. python benchmarks/profile_round.py --device cuda`` (``--device cpu`` runs the same here).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import re
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from bench_device import MODELS, LeanRound, config, engine_round, simulation, sync  # benchmarks/ on the path

from fedaug.core.device import environment, resolve_device
from fedaug.models.registry import build_model

WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::_local_scalar_dense")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
#: what a synchronisation is counted as, on CUDA and elsewhere (:func:`synchronisations`)
SYNC_NOTE = {True: "cudaStreamSynchronize + cudaDeviceSynchronize",
             False: "host reads through aten::_local_scalar_dense; a CPU tensor's tolist() makes none"}


def synchronisations(counts: collections.Counter[str], device: torch.device) -> float:
    """The host's waits for the device among a round's profiler ``counts``: on CUDA the stream and device
    synchronisations (a host read, a copy to pageable memory or from it each make one), elsewhere the host reads."""
    if device.type == "cuda":
        return counts["cudaStreamSynchronize"] + counts["cudaDeviceSynchronize"]
    return counts["aten::_local_scalar_dense"]



def profiled(run: Callable[[], object], rounds: int, device: torch.device) -> tuple[collections.Counter[str], float]:
    """Per-round event counts of ``rounds`` calls of ``run`` and their summed device (kernel) milliseconds."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(rounds):
            run()
        sync(device)
    counts: collections.Counter[str] = collections.Counter()
    device_us = 0.0
    for event in prof.events():
        if event.device_type.name == "CUDA":
            device_us += event.device_time
        else:
            counts[event.name] += 1
    return collections.Counter({k: v / rounds for k, v in counts.items()}), device_us / rounds / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="32")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side (alternating)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--top", type=int, default=18, help="rows of the operator and cProfile listings")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    env = environment(resolve_device(args.device), args.precision, False)
    print(f"# {args.device}: {env['device_name']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}")
    for model in args.models:
        cfg = config(model, args.device, args.precision, 10, 10**6)
        sim = simulation(model, cfg)
        lean = LeanRound(sim, cfg, build_model(model, sim.data.input_shape[0], sim.data.num_classes).to(sim.device))
        r = 1
        engine_round(sim, r)
        lean()
        walls: dict[str, list[float]] = {"engine": [], "lean": []}
        for _ in range(args.rounds):
            walls["engine"].append(engine_round(sim, r := r + 1))
            walls["lean"].append(lean())

        def next_engine_round() -> None:
            nonlocal r
            sim.run_round(r := r + 1)

        engine_counts, engine_ms = profiled(next_engine_round, 2, sim.device)
        lean_counts, lean_ms = profiled(lean, 2, sim.device)
        e, f = statistics.median(walls["engine"]) * 1e3, statistics.median(walls["lean"]) * 1e3
        print(f"\n## {model} ({args.precision}): engine {e:.1f} ms/round, lean {f:.1f} ms/round, "
              f"engine / lean {e / f:.2f}")
        print("| per round | engine | lean |\n|---|---:|---:|")
        print(f"| device (kernel) ms | {engine_ms:.1f} | {lean_ms:.1f} |")
        launches = (sum(engine_counts[k] for k in LAUNCHES), sum(lean_counts[k] for k in LAUNCHES))
        print(f"| kernel launches | {launches[0]:.0f} | {launches[1]:.0f} |")
        for name in WAITS:
            print(f"| {name} | {engine_counts[name]:.0f} | {lean_counts[name]:.0f} |")
        steps = len(sim.data.clients) * cfg.train.local_steps  # every client trains in both (bench_device's configs)
        syncs = [synchronisations(c, sim.device) for c in (engine_counts, lean_counts)]
        print(f"synchronisations per round ({SYNC_NOTE[sim.device.type == 'cuda']}): engine {syncs[0]:.0f}, lean "
              f"{syncs[1]:.0f}; per local step ({steps} a round): engine {syncs[0] / steps:.2f}, lean "
              f"{syncs[1] / steps:.2f}")
        extra = sorted(((engine_counts[k] - lean_counts[k], k) for k in engine_counts if k.startswith("aten::")),
                       reverse=True)[: args.top]
        print("ATen operators the engine calls more often (per round, engine - lean): "
              + ", ".join(f"{k} +{d:.0f}" for d, k in extra if d > 0))
        profiler = cProfile.Profile()
        sync(sim.device)
        t0 = time.perf_counter()
        profiler.enable()
        for _ in range(2):
            sim.run_round(r := r + 1)
        sync(sim.device)
        profiler.disable()
        print(f"cProfile, 2 engine rounds ({(time.perf_counter() - t0) * 1e3:.0f} ms under the profiler), "
              "fedaug's functions by cumulative time:")
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats("fedaug", args.top)
        lines = [line for line in text.getvalue().splitlines() if "fedaug" in line or "cumtime" in line]
        print("\n".join(re.sub(r"\S*/src/fedaug/", "fedaug/", line) for line in lines))


if __name__ == "__main__":
    main()
