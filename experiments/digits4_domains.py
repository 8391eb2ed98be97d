"""Per-domain image statistics of Digits-4 (docs/data.md, "Digits-4's usps_like domain").

On the gray (luminance) images of each domain's train split: mean intensity; foreground share (pixels
differing from the median of the image's border by more than 0.3); share of the foreground that is
saturated (a pixel within 0.1 of the image's extreme away from the background); bounding-box fill (the
foreground's box area over the frame) and the box's longer side over the frame side.

    PYTHONPATH=src .venv/bin/python experiments/digits4_domains.py [--samples 600]
"""

from __future__ import annotations

import argparse

import torch

from fedaug.data.digits4 import digits4


def domain_statistics(x: torch.Tensor) -> dict[str, float]:
    """Statistics of gray images ``(N, 1, H, W)`` in [0, 1] (see the module docstring)."""
    x = x[:, 0]
    n, h, w = x.shape
    border = torch.cat([x[:, 0], x[:, -1], x[:, :, 0], x[:, :, -1]], 1).median(1).values[:, None, None]
    away = (x - border).abs()
    fg = away > 0.3
    saturated = (away >= away.amax((1, 2), keepdim=True) - 0.1) & fg

    def extent(m: torch.Tensor, size: int) -> torch.Tensor:
        idx = torch.arange(size)
        return (torch.where(m, idx, -1).amax(1) + 1 - torch.where(m, idx, size).amin(1)).clamp_min(0).float() / size

    rows, cols = extent(fg.any(2), h), extent(fg.any(1), w)
    return {"mean": float(x.mean()), "foreground": float(fg.float().mean()),
            "saturated": float((saturated.float().sum((1, 2)) / fg.float().sum((1, 2)).clamp_min(1)).mean()),
            "box_fill": float((rows * cols).mean()), "longer_side": float(torch.maximum(rows, cols).mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=600, help="images per domain (default %(default)s)")
    args = p.parse_args()
    print("| domain | mean intensity | foreground share | saturated share of foreground | box fill | longer side |")
    print("|---|---|---|---|---|---|")
    for style in ("v1", "v2"):
        fd = digits4(seed=0, samples_per_domain=args.samples, channels=1, usps_style=style)
        for c in fd.clients:
            if style == "v2" and c.name != "usps_like":
                continue
            s = domain_statistics(c.train.x)
            name = f"{c.name} ({style})" if c.name == "usps_like" else c.name
            print(f"| {name} | {s['mean']:.3f} | {s['foreground']:.3f} | {s['saturated']:.3f} | {s['box_fill']:.3f} "
                  f"| {s['longer_side']:.3f} |")


if __name__ == "__main__":
    main()
