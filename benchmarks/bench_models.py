"""Time one SGD training step of every zoo model on CPU and print a Markdown table.

Run: ``.venv/bin/python benchmarks/bench_models.py [--steps 10] [--batch 8] [--threads 2]``

For each model at a representative small input: parameters, input shape, default attach points,
and the median wall time of a training step (forward, cross-entropy, backward, SGD step) after
warm-up steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from fedaug.core.rng import scoped_global_seed
from fedaug.core.runtime import retain_freed_memory
from fedaug.models import MODELS, build_model

# name: (in_channels, num_classes, input shape without batch, label shape without batch)
INPUTS = {
    "small_cnn":         (1, 10, (1, 28, 28),     ()),
    "digit_model":       (3, 10, (3, 28, 28),     ()),
    "lenet5":            (1, 62, (1, 28, 28),     ()),
    "alexnet_bn":        (3, 10, (3, 64, 64),     ()),
    "resnet18_cifar":    (3, 10, (3, 32, 32),     ()),
    "mobilenetv2_cifar": (3, 10, (3, 32, 32),     ()),
    "unet2d":            (3, 2,  (3, 64, 64),     (64, 64)),
    "unet3d":            (1, 2,  (1, 32, 32, 32), (32, 32, 32)),
    "harnet":            (1, 6,  (1, 128, 3),     ()),
    "cnn1d":             (6, 6,  (6, 100),        ()),
    "audionet":          (1, 10, (1, 64, 64),     ()),
}  # fmt: skip


def time_step(name: str, batch: int, steps: int, warmup: int) -> tuple[int, float]:
    """Parameters of ``name`` and the median seconds per SGD step on a fixed random batch."""
    cin, ncls, shape, label_shape = INPUTS[name]
    with scoped_global_seed(0, "bench", name):
        model = build_model(name, in_channels=cin, num_classes=ncls).train()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *shape, generator=g)
    y = torch.randint(0, ncls, (batch, *label_shape), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return sum(p.numel() for p in model.parameters()), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=8, help="batch size")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as in every fedaug run (fedaug.core.runtime)
    missing = sorted(set(MODELS.names()) - set(INPUTS))
    if missing:
        raise SystemExit(f"no benchmark input for model(s) {', '.join(missing)}; add them to INPUTS")
    print(f"batch {args.batch}, {args.threads} threads, torch {torch.__version__}, median of {args.steps} steps\n")
    print("| model | parameters | input (C x spatial) | default attach points | ms / SGD step |")
    print("|---|---:|---|---|---:|")
    for name in INPUTS:
        n, sec = time_step(name, args.batch, args.steps, args.warmup)
        cin, ncls, shape, _ = INPUTS[name]
        stages = build_model(name, in_channels=cin, num_classes=ncls).feature_stages
        print(f"| `{name}` | {n:,} | {'x'.join(map(str, shape))} | {', '.join(stages)} | {1e3 * sec:.1f} |", flush=True)


if __name__ == "__main__":
    main()
