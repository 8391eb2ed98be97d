"""A tiny image folder written by the tests: ``<root>/<site>/<class>/<image>`` with awkward names."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: sites and classes with a space, parentheses and non-ASCII letters (sorted as fedaug sorts them)
SITES = ("Site A", "hôpital-2")
CLASSES = ("cat (x)", "dög")


def grey(site: int, label: int, i: int) -> int:
    """The grey level of image ``i`` of class ``label`` at site ``site``: unique per image, so an image's
    pixels say which file it came from (a constant image stays constant when resized)."""
    return 20 + 100 * label + 40 * site + 2 * i


def write_image_folder(root: Path, per_class: int = 10) -> Path:
    """``per_class`` PNGs of constant grey per (site, class), of two sizes (20x24 and 31x17), plus files
    the loader must skip (a text file, a hidden file)."""
    from PIL import Image

    for s, site in enumerate(SITES):
        for label, cls in enumerate(CLASSES):
            folder = root / site / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                shape = (20, 24) if i % 2 else (31, 17)
                Image.fromarray(np.full((*shape, 3), grey(s, label, i), np.uint8)).save(folder / f"img {i}.png")
            (folder / "notes.txt").write_text("not an image")
            (folder / ".hidden.png").write_bytes(b"not even a PNG")
    return root


def image_of(x: np.ndarray) -> tuple[int, int, int]:
    """``(site, label, i)`` of a loaded image ``(C, H, W)`` in [0, 1] (from its grey level)."""
    v = int(round(float(x.mean()) * 255)) - 20
    label, rest = divmod(v, 100)
    site, twice_i = divmod(rest, 40)
    return site, label, twice_i // 2
