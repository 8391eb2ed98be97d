"""Figures of the privacy analyses (matplotlib, Agg backend; PNG files)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from torch import Tensor


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_reconstructions(path: str | os.PathLike[str], originals: Tensor, reconstructions: Mapping[str, Tensor],
                         num: int = 8) -> None:
    """A grid: the first ``num`` originals ``(N, C, H, W)`` on the top row, each named set of
    reconstructions (e.g. ``{"with dCor": ..., "without dCor": ...}``) on the rows below."""
    plt = _pyplot()
    rows = [("original", originals), *reconstructions.items()]
    fig, axes = plt.subplots(len(rows), num, figsize=(1.2 * num, 1.3 * len(rows)), squeeze=False)
    for r, (label, imgs) in enumerate(rows):
        for i in range(num):
            img = imgs[i].detach().clamp(0, 1)
            ax = axes[r][i]
            pixels = (img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)).numpy()
            ax.imshow(pixels, cmap="gray" if img.shape[0] == 1 else None)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel(label, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_curves(path: str | os.PathLike[str], curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                xlabel: str, ylabel: str, logx: bool = False) -> None:
    """Line plot of named ``(x, y)`` curves."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
