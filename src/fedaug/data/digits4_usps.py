"""Digits-4's ``usps_like`` domain: the UCI optical digits (``sklearn.datasets.load_digits``, 8x8,
values 0-16, real) as a stand-in for USPS (Hull, IEEE TPAMI 1994: 16x16 grey digits, deslanted and
size-normalised so that each digit fills the frame), in two styles.

* ``"v1"`` (fedaug <= 0.1.0 runs): the 8x8 image upsampled bilinearly to the dataset's size. Every
  8x8 pixel becomes a ~3.5-pixel block, so strokes are wide soft blobs: 42 % of the pixels are
  foreground (MNIST 15 %), the mean intensity is 0.31 (MNIST 0.13) and the digit touches the frame
  (measured in docs/data.md).
* ``"v2"``: closer to USPS. The digit's bounding box in the 8x8 image is scaled (aspect kept) to
  fill a 16x16 frame with bicubic interpolation, the grey levels are contrast-stretched so that
  strokes saturate with antialiased edges (USPS's look: thin bright strokes, dark background), and
  the 16x16 image is brought to the dataset's shared size bilinearly, as FedBN/FedFA resize USPS
  (16 -> 28).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.rng import derive_seed

#: the styles of the ``usps_like`` domain (``digits4(usps_style=...)``) and their provenance lines
USPS_SOURCES = {
    "v1": "UCI optical digits (real, USPS stand-in): sklearn.datasets.load_digits, 8x8 upsampled",
    "v2": ("UCI optical digits (real, USPS stand-in): sklearn.datasets.load_digits, 8x8 scaled to fill a 16x16 frame "
           "and contrast-stretched (usps_style v2), then resized"),
}
UspsStyle = Literal["v1", "v2"]
USPS_STYLES = tuple(USPS_SOURCES)
USPS_SIDE = 16  # real USPS images are 16x16
#: v2's contrast stretch: grey levels below LOW become background, above HIGH saturate
LOW, HIGH = 0.4, 0.7


def fill_frame(x: Tensor, side: int, threshold: float = 0.0) -> Tensor:
    """Scale each image's bounding box (aspect kept, centred) to fill a ``side x side`` frame.

    Args:
        x: ``(N, 1, h, w)`` in [0, 1]; the box holds the pixels above ``threshold`` (an empty image
            keeps its whole frame).
        side: output side.

    Returns:
        ``(N, 1, side, side)``, bicubic samples clamped to [0, 1]; the box's longer side spans the frame.
    """
    n, _, h, w = x.shape
    fg = x[:, 0] > threshold
    rows, cols = fg.any(2), fg.any(1)  # (N, h), (N, w)

    def span(m: Tensor, size: int) -> tuple[Tensor, Tensor]:
        idx = torch.arange(size, dtype=x.dtype)
        lo = torch.where(m, idx, torch.full_like(idx, size)).amin(1)
        hi = torch.where(m, idx, torch.full_like(idx, -1)).amax(1) + 1
        empty = ~m.any(1)
        lo, hi = torch.where(empty, 0.0, lo), torch.where(empty, float(size), hi)
        return (lo + hi) / size - 1, (hi - lo) / size  # centre and half-extent, normalised [-1, 1] units

    cy, hy = span(rows, h)
    cx, hx = span(cols, w)
    half = torch.maximum(hx, hy)
    zero = torch.zeros(n, dtype=x.dtype)
    theta = torch.stack([torch.stack([half, zero, cx], 1), torch.stack([zero, half, cy], 1)], 1)  # (N, 2, 3)
    grid = F.affine_grid(theta, [n, 1, side, side], align_corners=False)
    return F.grid_sample(x, grid, mode="bicubic", padding_mode="zeros", align_corners=False).clamp(0, 1)


def usps_like(n: int, seed: int, style: str = "v1") -> tuple[Tensor, Tensor]:
    """``n`` UCI optical digits at their style's native resolution and their labels ``(n,)`` int64.

    Args:
        n: images, <= 1,797 (the set's size); a seeded random subset.
        seed: seeds the subset (the same images in both styles).
        style: ``"v1"``: the 8x8 images ``(n, 1, 8, 8)``; ``"v2"``: USPS-like ``(n, 1, 16, 16)`` (see
            the module docstring). Values in [0, 1]; the caller resizes to the dataset's size.

    Raises:
        ValueError: an unknown style (``digits4`` validates it first).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(derive_seed(seed, "digits4", "usps_like"))
    pick = rng.permutation(len(digits.target))[:n]
    x = torch.from_numpy(digits.images[pick].astype(np.float32) / 16).unsqueeze(1)
    y = torch.from_numpy(digits.target[pick].astype(np.int64))
    if style == "v1":
        return x, y
    if style == "v2":
        return ((fill_frame(x, USPS_SIDE) - LOW) / (HIGH - LOW)).clamp(0, 1), y
    raise ValueError(f"usps_style must be one of {', '.join(USPS_STYLES)}, got {style!r}")
