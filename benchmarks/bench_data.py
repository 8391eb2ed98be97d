"""Data-loading cost of the default experiment (digits4, small_cnn, FedAvg; `fedaug run`).

Reports (not a test: it measures, it does not assert):
1. ``load_dataset("digits4")`` time, cold (empty cache: generation) and warm (cached files).
2. Per-batch indexing (``x[idx]`` for shuffled batches of 32, every client, one epoch per round
   for the preset's 30 rounds) vs the training steps of the same batches (small_cnn, SGD),
   extrapolated from the median of ``--steps`` timed steps; the share of data time in local
   training time. Target: < 10 %.

Run: ``.venv/bin/python benchmarks/bench_data.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from fedaug.data import load_dataset
from fedaug.models.registry import build_model

ROUNDS, BATCH = 30, 32  # src/fedaug/presets/digits4.toml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--steps", type=int, default=60, help="training steps to time")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["FEDAUG_CACHE"] = cache
        t0 = time.perf_counter()
        data = load_dataset("digits4", seed=0)
        cold = time.perf_counter() - t0
        warm_times = []
        for _ in range(3):
            t0 = time.perf_counter()
            data = load_dataset("digits4", seed=0)
            warm_times.append(time.perf_counter() - t0)
    warm = min(warm_times)
    g = torch.Generator().manual_seed(0)
    batches = 0
    t0 = time.perf_counter()
    for _ in range(ROUNDS):
        for c in data.clients:
            order = torch.randperm(len(c.train), generator=g)
            for i in range(0, len(order), BATCH):
                idx = order[i : i + BATCH]
                x, y = c.train.x[idx], c.train.y[idx]
                batches += 1
    index_time = time.perf_counter() - t0
    model = build_model("small_cnn", data.input_shape[0], data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    c = data.clients[0]
    steps = 10 if args.quick else args.steps
    times = []
    for s in range(steps + 3):
        idx = torch.randint(0, len(c.train), (BATCH,), generator=g)
        x, y = c.train.x[idx], c.train.y[idx]
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if s >= 3:  # warm-up
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    train_time = step * batches
    share = (warm + index_time) / (warm + index_time + train_time)
    print(f"digits4 load: cold (generate + cache) {cold:.2f} s, warm (cached) {warm:.3f} s")
    print(f"{batches} batches of {BATCH} over {ROUNDS} rounds x {data.num_clients} clients: "
          f"indexing {index_time:.3f} s ({1e6 * index_time / batches:.0f} us/batch)")
    print(f"training step (small_cnn, median of {steps}): {1e3 * step:.1f} ms -> {train_time:.0f} s of local training")
    print(f"data share of local training time (warm load + indexing): {100 * share:.2f} % (target < 10 %)")


if __name__ == "__main__":
    main()
