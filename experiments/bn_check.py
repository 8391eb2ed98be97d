"""Is a client's low accuracy a BatchNorm-statistics mismatch? Re-estimate them per client and see.

For each finished run directory given, loads the final global model (newest checkpoint), and for
every client reports the test accuracy with the global BatchNorm running statistics (what the run
recorded) and with statistics re-estimated on that client's own training inputs (weights
unchanged; one pass, cumulative averages). A large jump means the averaged statistics, not the
weights, fail that client: the feature-shift failure FedBN addresses. ``--stats-from test`` takes
the statistics from the client's test inputs instead (labels unused): for a run with
``data.options.held_out`` the test split is the unseen domain, so this asks whether the model would
recognise that domain once normalised by its own statistics (test-time BatchNorm adaptation).

    .venv/bin/python experiments/bn_check.py runs/fedfa/digits4/fedavg-s*/*/ [--stats-from test]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from torch import nn

from fedaug.config.load import parse_config, read_toml
from fedaug.data.base import Split
from fedaug.data.registry import load_dataset
from fedaug.engine.records.rundir import CONFIG, RunDir
from fedaug.metrics.classification import ClassificationMeter
from fedaug.models import build_model


def accuracy(model: nn.Module, split: Split, batch: int = 256) -> float:
    model.eval()
    meter = ClassificationMeter()
    with torch.no_grad():
        for i in range(0, len(split), batch):
            meter.update(model(split.x[i:i + batch]), split.y[i:i + batch])
    return meter.result()["acc"]


def reestimate_bn(model: nn.Module, split: Split, batch: int = 64) -> None:
    """Replace every BatchNorm's running statistics by their average over ``split``'s inputs."""
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
            mod.momentum = None  # cumulative moving average: the plain mean over batches
    model.train()
    with torch.no_grad():
        for i in range(0, len(split), batch):
            model(split.x[i:i + batch])


def check(run: Path, stats_from: str = "train") -> dict[str, tuple[float, float]]:
    """client name -> (test accuracy with the global statistics, with the client's own, taken from
    its ``stats_from`` split's inputs)."""
    cfg = parse_config(read_toml(run / CONFIG))
    payload = RunDir.open(str(run)).load_latest()
    if payload is None:
        raise SystemExit(f"{run}: no checkpoint to load")
    weights = payload["server"][cfg.method.base]["weights"]
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    model = build_model(cfg.model.name, data.input_shape[0], data.num_classes, **cfg.model.options)
    out = {}
    for client in data.clients:
        model.load_state_dict(weights)
        before = accuracy(model, client.test)
        reestimate_bn(model, getattr(client, stats_from))
        out[client.name] = (before, accuracy(model, client.test))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stats-from", choices=("train", "test"), default="train",
                        help="the client's split whose inputs give the re-estimated statistics")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| run | client: global BN -> own BN (%) | mean |")
    print("|---|---|---|")
    for run in args.runs:
        res = check(run, args.stats_from)
        cells = ", ".join(f"{k} {100 * a:.1f} -> {100 * b:.1f}" for k, (a, b) in res.items())
        before = statistics.mean(a for a, _ in res.values())
        after = statistics.mean(b for _, b in res.values())
        print(f"| {run.parent.name} | {cells} | {100 * before:.1f} -> {100 * after:.1f} |", flush=True)


if __name__ == "__main__":
    main()
