"""A tiny segmentation federation for engine tests: one-channel 16x16 images (or 16^3 volumes) segmented by
intensity: synthetic data that any machine has (tests/gpu needs no data set)."""

from __future__ import annotations

import torch

from fedaug.data.base import ClientData, FederatedData, Split

#: intensity thresholds between the classes (class k: above the first k)
THRESHOLDS = (0.5, 0.8)


def toy_segmentation(num_clients: int, num_classes: int = 3, dims: int = 2,
                     samples: tuple[int, int, int] = (8, 2, 4)) -> FederatedData:
    """``num_clients`` clients of ``samples`` = (training, validation, test) images ``(1, 16, 16)``
    (``dims = 3``: volumes ``(1, 16, 16, 16)``), seeded, whose masks count the thresholds a pixel exceeds
    (``num_classes`` <= 3). benchmarks/bench_device.py trains unet3d on its volumes."""
    g = torch.Generator().manual_seed(0)
    shape = (1,) + (16,) * dims

    def split(n: int) -> Split:
        x = torch.rand(n, *shape, generator=g)
        return Split(x, sum((x[:, 0] > t).long() for t in THRESHOLDS[:num_classes - 1]))

    return FederatedData("toyseg", "segmentation", num_classes, shape,
                         [ClientData(f"s{k}", f"s{k}", *map(split, samples)) for k in range(num_clients)])
