"""Shared pieces of the local-directory loaders: layout errors and client assembly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.errors import DataError
from fedaug.core.rng import derive_seed
from fedaug.data.base import ClientData, Split
from fedaug.data.checks import check_fractions, raise_problems
from fedaug.data.label_split import check_partition_options, partition_labels
from fedaug.data.partition import iid_partition, stratified_split


def layout_error(dataset: str, root: str | os.PathLike[str], problem: str, layout: str) -> DataError:
    """A DataError that shows the expected directory layout (nothing is downloaded by fedaug)."""
    return DataError(
        f"{dataset}: {problem} under '{root}'. Expected layout (download it yourself and pass root=<dir>):\n{layout}"
    )


def require_root(dataset: str, root: Any, layout: str) -> Path:
    """``root`` as a Path; a DataError showing ``layout`` when it is None or not a directory."""
    if root is None or not Path(root).is_dir():
        raise layout_error(dataset, root, "no such directory (set the root option)", layout)
    return Path(root)


def read_image(path: Path, size: int, channels: int = 3) -> Tensor:
    """One image file, decoded with Pillow as RGB (``channels=3``) or luminance (``1``) and resized
    with antialiased bilinear interpolation: ``(channels, size, size)`` float32 in [0, 1].

    Raises:
        OSError: it cannot be read (callers name the file and the fix), or
            ``PIL.Image.DecompressionBombError``: it has more pixels than Pillow allows.
    """
    from PIL import Image

    with Image.open(path) as im:
        img = torch.from_numpy(np.asarray(im.convert("RGB" if channels == 3 else "L"), np.uint8).copy())
    img = img.permute(2, 0, 1) if img.ndim == 3 else img[None]
    return F.interpolate(img[None].float() / 255, size=(size, size), mode="bilinear", antialias=True,
                         align_corners=False)[0].clamp(0, 1)


def split_fractions(dataset: str, val_fraction: Any, test_fraction: Any = 0.0) -> tuple[float, float, float]:
    """The ``(train, val, test)`` shares; a ConfigError (see :func:`fedaug.data.checks.check_fractions`) when
    a fraction is outside ``[0, 1)`` or they leave no train share."""
    problems: list[str] = []
    check_fractions(problems, val_fraction, test_fraction)
    raise_problems(dataset, problems)
    return (1 - val_fraction - test_fraction, float(val_fraction), float(test_fraction))


def label_skew_clients(dataset: str, x: Tensor, y: Tensor, x_test: Tensor, y_test: Tensor, seed: int,
                       partition: str, min_size: int, val_fraction: float, **opts: Any) -> list[ClientData]:
    """Partition the training set by labels (:mod:`fedaug.data.label_split`); split each share into
    train/val (stratified); deal the test set to clients IID (near-equal, same label mix).

    Args:
        x, y: ``(N, ...)`` training inputs and ``(N,)`` int64 labels.
        x_test, y_test: the official test set.
        opts: ``num_clients``, ``alpha``, ``q``, ``shards_per_client``, ``mean_size``.
    """
    check_partition_options(dataset, partition, opts)
    split_fractions(dataset, val_fraction)
    shares = partition_labels(y.numpy(), partition, derive_seed(seed, dataset, "partition"), min_size, **opts)
    tests = iid_partition(y_test.numpy(), len(shares), derive_seed(seed, dataset, "test"))
    clients = []
    for k, (share, test) in enumerate(zip(shares, tests, strict=True)):
        tr, va = stratified_split(y.numpy()[share], (1 - val_fraction, val_fraction), derive_seed(seed, dataset, k))
        pick = [torch.from_numpy(share[tr]), torch.from_numpy(share[va])]
        t = torch.from_numpy(test)
        clients.append(ClientData(f"client-{k}", f"client-{k}", Split(x[pick[0]], y[pick[0]]),
                                  Split(x[pick[1]], y[pick[1]]), Split(x_test[t], y_test[t])))
    return clients


def group_clients(groups: dict[str, tuple[Tensor, Tensor]], fractions: tuple[float, float, float], seed: int,
                  dataset: str) -> list[ClientData]:
    """One client per group (domain, site), its samples split stratified into train/val/test."""
    clients = []
    for name, (x, y) in groups.items():
        strat = y.numpy() if y.ndim == 1 else np.zeros(len(y), np.int64)
        parts = stratified_split(strat, fractions, derive_seed(seed, dataset, name))
        clients.append(ClientData(name, name, *(Split(x[torch.from_numpy(p)], y[torch.from_numpy(p)]) for p in parts)))
    return clients
