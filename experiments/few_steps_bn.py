"""Why a small image-folder federation sits at chance: BatchNorm running statistics after few steps.

Writes a small federation of texture crops as image folders (3 sites x 3 classes of 32x32 textures:
stripes, checks, blobs; each site its own tint, contrast and brightness), then trains it in process
with the default run's settings (the ``digits4`` preset's training: FedAvg, one local epoch of batch
32, SGD lr 0.05) and variants, and after every round evaluates the global model three ways:

* ``running``: as a run evaluates, in ``eval()`` with the aggregated BatchNorm running statistics;
* ``batch``: with each client's whole test split as one batch normalised by its own statistics
  (train-mode BatchNorm, running statistics left untouched);
* ``pooled``: with running statistics re-estimated on the pooled training inputs of every client
  (the statistics the running ones tend to once the weights stop changing).

It also prints ``var1``, the first BatchNorm's running variance over the re-estimated one (median over
channels): 1 when the running statistics have caught up with the weights. docs/data.md ("Few steps per
round: BatchNorm's running statistics") quotes the numbers.

    PYTHONPATH=src .venv/bin/python experiments/few_steps_bn.py [--rounds 12] [--per-class 45]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bn_check import accuracy, reestimate_bn  # noqa: E402  (a sibling script)

from fedaug.config.load import load_config  # noqa: E402
from fedaug.data.base import FederatedData, Split  # noqa: E402
from fedaug.data.registry import load_dataset  # noqa: E402
from fedaug.engine.run import Simulation  # noqa: E402
from fedaug.methods.recipe import build_recipe  # noqa: E402
from fedaug.models import build_model  # noqa: E402

CLASSES = ("stripes", "checks", "blobs")
#: site -> (RGB tint, contrast, brightness shift)
SITES = {"site_a": ((1.0, 0.9, 0.8), 1.0, 0.0), "site_b": ((0.6, 1.0, 0.7), 0.6, 0.2),
         "site_c": ((0.9, 0.7, 1.0), 0.8, -0.1)}
SIZE = 32


def texture(label: int, rng: np.random.Generator) -> np.ndarray:
    """One grey texture ``(SIZE, SIZE)`` around [0, 1] of class ``label`` (random frequency, phase and
    angle, plus pixel noise of std 0.05)."""
    from PIL import Image

    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    f, ph, th = rng.uniform(3, 6), rng.uniform(0, 2 * np.pi), rng.uniform(-0.3, 0.3)
    if label == 0:
        t = 0.5 + 0.5 * np.sin(2 * np.pi * f * (np.cos(th) * yy + np.sin(th) * xx) + ph)
    elif label == 1:
        t = 0.5 + 0.5 * np.sign(np.sin(2 * np.pi * f * xx + ph) * np.sin(2 * np.pi * f * yy + ph))
    elif label == 2:
        coarse = Image.fromarray(rng.normal(size=(8, 8)).astype(np.float32))
        t = np.asarray(coarse.resize((SIZE, SIZE), Image.Resampling.BICUBIC))
        t = (t - t.min()) / (np.ptp(t) + 1e-6)
    else:
        raise ValueError(f"label must be 0, 1 or 2 ({', '.join(CLASSES)}), got {label}")
    return t + rng.normal(0, 0.05, t.shape)


def write_textures(root: Path, per_class: int, seed: int = 0) -> Path:
    """``root/<site>/<class>/<i>.png``: ``per_class`` textures per class at each site of :data:`SITES`,
    each site's tint, contrast and brightness applied (8-bit RGB)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for site, (tint, contrast, shift) in SITES.items():
        for label, cls in enumerate(CLASSES):
            folder = root / site / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                grey = (texture(label, rng) - 0.5) * contrast + 0.5 + shift
                rgb = np.clip(grey[..., None] * np.array(tint), 0, 1)
                Image.fromarray((rgb * 255).astype(np.uint8)).save(folder / f"{i:03d}.png")
    return root


def batchnorms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def batch_stats_accuracy(model: nn.Module, split: Split) -> float:
    """Accuracy on ``split`` as one batch, each BatchNorm normalising by the batch's own statistics
    (on a copy: ``model``'s running statistics are left as they are)."""
    m = copy.deepcopy(model).train()
    with torch.no_grad():
        return float((m(split.x).argmax(1) == split.y).float().mean())


def evaluate_three_ways(model: nn.Module, data: FederatedData) -> dict[str, float]:
    """Mean test accuracy over the clients with the running, the batch's own and the re-estimated
    pooled statistics (see the module docstring), and ``var1``."""
    pooled = Split(torch.cat([c.train.x for c in data.clients]), torch.cat([c.train.y for c in data.clients]))
    fitted = copy.deepcopy(model)
    reestimate_bn(fitted, pooled)
    out = {"running": statistics.mean(accuracy(model, c.test) for c in data.clients),
           "batch": statistics.mean(batch_stats_accuracy(model, c.test) for c in data.clients),
           "pooled": statistics.mean(accuracy(fitted, c.test) for c in data.clients)}
    norms = batchnorms(model)
    if norms:
        out["var1"] = float((norms[0].running_var / batchnorms(fitted)[0].running_var).median())
    return out


def standardise(data: FederatedData) -> FederatedData:
    """``data`` with every input channel shifted and scaled to mean 0, std 1 over the pooled training
    inputs (what a torchvision ``Normalize`` with the dataset's statistics does)."""
    x = torch.cat([c.train.x for c in data.clients])
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)

    def norm(s: Split) -> Split:
        return Split((s.x - mean) / std, s.y)

    clients = [replace(c, train=norm(c.train), val=norm(c.val), test=norm(c.test)) for c in data.clients]
    return replace(data, clients=clients)


def trace(root: Path, rounds: int, overrides: list[str],
          transform: Callable[[FederatedData], FederatedData] | None = None,
          bn_momentum: float | None = 0.1) -> list[dict[str, float]]:
    """Train the image folder at ``root`` for ``rounds`` rounds with the default run's settings plus
    ``overrides``; per round: the local steps per client, the mean training loss and
    :func:`evaluate_three_ways` of the global model.

    Args:
        transform: applied to the loaded data before training (e.g. :func:`standardise`).
        bn_momentum: every BatchNorm's momentum (PyTorch's default 0.1; ``None``: cumulative average).
    """
    cfg, _ = load_config(None, ["data.name=image_folder", f"data.options.root={root}", f"train.rounds={rounds}",
                                *overrides])
    data = load_dataset(cfg.data.name, cfg.seed, **cfg.data.options)
    data = transform(data) if transform is not None else data
    sim = Simulation(cfg, data, build_recipe(cfg.method.base, cfg.method.augs, cfg.method.options))
    for m in batchnorms(sim.model):
        m.momentum = bn_momentum
    model = build_model(cfg.model.name, data.input_shape[0], data.num_classes, **cfg.model.options)
    rows = []
    for r in range(1, rounds + 1):
        record = sim.run_round(r)
        model.load_state_dict(sim.server[cfg.method.base]["weights"])
        steps = statistics.mean(c["steps"] for c in record["train"]["clients"].values())
        rows.append({"round": r, "steps": steps, "loss": record["train"]["loss"], **evaluate_three_ways(model, data)})
    return rows


#: name -> (overrides, data transform, BatchNorm momentum)
VARIANTS: dict[str, tuple[list[str], Callable[[FederatedData], FederatedData] | None, float | None]] = {
    "default": ([], None, 0.1),
    "local_epochs=5": (["train.local_epochs=5"], None, 0.1),
    "batch_size=8": (["train.batch_size=8"], None, 0.1),
    "inputs standardised": ([], standardise, 0.1),
    "BN momentum None (cumulative)": ([], None, None),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--per-class", type=int, default=45, help="images per class per site (default %(default)s)")
    p.add_argument("--root", type=Path, help="an image folder to use instead of the written textures")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or write_textures(Path(tmp) / "textures", args.per_class)
        for name in args.variants:
            overrides, transform, momentum = VARIANTS[name]
            print(f"\n{name}\n\n| round | steps | train loss | running (%) | batch (%) | pooled (%) | var1 |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            for row in trace(root, args.rounds, overrides, transform, momentum):
                print(f"| {row['round']} | {row['steps']:g} | {row['loss']:.3f} | {100 * row['running']:.1f} | "
                      f"{100 * row['batch']:.1f} | {100 * row['pooled']:.1f} | {row.get('var1', float('nan')):.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
