"""Your own images as a federation: ``<root>/<site>/<class>/<image>``, one client per site.

Classes are the class folders' names (sorted, over every site, so a site that lacks a class keeps
the others' label numbers); images are decoded with Pillow, converted to RGB or luminance and resized
(:func:`~fedaug.data.local_common.read_image`), and cached per site under ``$FEDAUG_CACHE`` keyed by
the files' names, sizes and modification times (:func:`~fedaug.data.cache.load_or_build`), so a
changed image is read again. Each site is split into train/val/test, stratified and seeded, or as a
split file says; ``clients_per_site`` deals each split of a site to several clients (stratified).
"""

from __future__ import annotations

import csv
import hashlib
import re
import warnings
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from torch import Tensor

from fedaug.core.errors import ConfigError, DataError, suggest
from fedaug.core.paths import LocalPath, PathOption
from fedaug.core.rng import derive_seed
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.cache import load_or_build, package_versions
from fedaug.data.checks import check_fractions, check_int, is_int, raise_problems
from fedaug.data.local_common import layout_error, read_image, require_root
from fedaug.data.partition import iid_partition, stratified_split
from fedaug.data.registry import DATASETS

NAME = "image_folder"
#: the cache layout of a site's record; bump it when what is cached changes
FORMAT_VERSION = 1
#: file name endings read as images (case-insensitive); other files are left out
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
SPLITS = ("train", "val", "test")
LAYOUT = ("  <root>/<site>/<class>/<image>   one folder per site (a client), in it one folder per class\n"
          "  (images: " + ", ".join(IMAGE_EXTENSIONS) + "; files and folders starting with '.' are skipped)\n"
          "  <root>/<split file>              optional: lines '<site>/<class>/<image>,<train|val|test>'")
DEFAULT_FRACTIONS = (0.1, 0.2)
#: the ``split`` option: a file inside ``root`` (a relative value is taken from ``root``)
SplitFile = Annotated[str, PathOption(within="root")]


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _folders(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_dir() and _visible(p))


def list_images(root: Path, site: str, classes: list[str]) -> list[tuple[str, int]]:
    """``(path relative to root, label)`` of every image of ``site`` in a folder of ``classes``
    (label = index in ``classes``), in sorted order.

    Raises:
        DataError: an image lies in the site folder itself, not in a class folder.
    """
    stray = sorted(p.name for p in (root / site).iterdir()
                   if p.is_file() and _visible(p) and p.suffix.lower() in IMAGE_EXTENSIONS)
    if stray:
        raise layout_error(NAME, root, f"'{site}/{stray[0]}' is not in a class folder ({len(stray)} such image(s)); "
                           f"move it to '{site}/<class>/'", LAYOUT)
    out = []
    for label, cls in enumerate(classes):
        folder = root / site / cls
        if folder.is_dir():
            out += [(f"{site}/{cls}/{p.name}", label) for p in sorted(folder.iterdir())
                    if p.is_file() and _visible(p) and p.suffix.lower() in IMAGE_EXTENSIONS]
    return out


def _read_site(root: Path, files: list[tuple[str, int]], size: int, channels: int) -> dict[str, Tensor]:
    """The site's images and labels: ``{"x": (N, channels, size, size) float32 in [0, 1], "y": (N,) int64}``."""
    from PIL import Image

    xs = []
    for rel, _ in files:
        try:
            xs.append(read_image(root / rel, size, channels))
        except Image.DecompressionBombError as exc:
            raise DataError(f"{NAME}: image '{root / rel}' was refused as a possible decompression bomb ({exc}); "
                            "remove it, or raise PIL.Image.MAX_IMAGE_PIXELS if the image is genuine") from None
        except OSError as exc:
            raise DataError(f"{NAME}: image '{root / rel}' cannot be read ({exc}); remove or replace it") from None
    return {"x": torch.stack(xs), "y": torch.tensor([label for _, label in files], dtype=torch.int64)}


def read_split_file(path: Path, root: Path) -> dict[str, str]:
    """``{"<site>/<class>/<image>": "train" | "val" | "test"}`` from a split file: one
    ``path,split`` line per image (CSV; a first line ``path,split`` and lines starting with ``#`` are
    skipped).

    Raises:
        DataError: the file is missing, or a line is not ``path,split`` with a known split or
            names a path twice (the message gives its line number).
    """
    if not path.is_file():
        raise layout_error(NAME, root, f"split file '{path}' does not exist", LAYOUT)
    out: dict[str, str] = {}
    with open(path, newline="") as f:
        for number, row in enumerate(csv.reader(f), 1):
            if not row or row[0].startswith("#") or (number == 1 and row == ["path", "split"]):
                continue
            if len(row) != 2 or row[1].strip() not in SPLITS:
                raise DataError(f"{NAME}: line {number} of split file '{path}' is {','.join(row)!r}; each line is "
                                "'<site>/<class>/<image>,<train|val|test>'")
            rel = row[0].strip().replace("\\", "/")
            if rel in out:
                raise DataError(f"{NAME}: line {number} of split file '{path}' names '{rel}' again")
            out[rel] = row[1].strip()
    return out


def _split_indices(files: list[tuple[str, int]], y: np.ndarray, assigned: dict[str, str] | None,
                   fractions: tuple[float, float, float], seed: int, site: str) -> list[np.ndarray]:
    """The site's train/val/test indices: from the split file, else stratified and seeded."""
    if assigned is None:
        return stratified_split(y, fractions, derive_seed(seed, NAME, site, "split"))
    return [np.array([i for i, (rel, _) in enumerate(files) if assigned[rel] == s], dtype=np.int64) for s in SPLITS]


def _check_coverage(path: Path, site: str, classes: list[str], files: list[tuple[str, int]],
                    assigned: dict[str, str]) -> None:
    """Raise a DataError unless the split file lists every image of ``site`` and no other file of its
    ``classes`` folders (a line for a file that is not there is a typo)."""
    have = {rel for rel, _ in files}
    missing = [rel for rel, _ in files if rel not in assigned]
    if missing:
        raise DataError(f"{NAME}: split file '{path}' does not list {len(missing)} image(s) of site '{site}', e.g. "
                        f"'{missing[0]}'; give every image a line '<site>/<class>/<image>,<train|val|test>'")
    extra = sorted(rel for rel in assigned if rel.split("/")[:2] in ([site, c] for c in classes) and rel not in have)
    if extra:
        raise DataError(f"{NAME}: split file '{path}' lists '{extra[0]}', which is not an image under the root "
                        f"({len(extra)} such line(s)); correct or remove those lines")


def _site_clients(site: str, x: Tensor, y: Tensor, splits: list[np.ndarray], k: int, seed: int) -> list[ClientData]:
    """Deal each split of ``site`` to ``k`` clients (stratified: :func:`iid_partition`)."""
    if len(splits[0]) < k:
        raise ConfigError(f"{NAME}: site '{site}' has {len(splits[0])} train image(s), fewer than clients_per_site={k}; "
                          "lower clients_per_site")
    per_split = [[torch.from_numpy(idx[part]) for part in iid_partition(y[idx].numpy(), k,
                                                                        derive_seed(seed, NAME, site, s))]
                 for s, idx in zip(SPLITS, splits, strict=True)]
    return [ClientData(site if k == 1 else f"{site}#{j}", site, *(Split(x[i], y[i]) for i in parts))
            for j, parts in enumerate(zip(*per_split, strict=True))]


def _check(root: Path, sites: list[str] | None, classes: list[str] | None, all_sites: list[str],
           all_classes: list[str], problems: list[str]) -> tuple[list[str], list[str]]:
    """The sites and classes to use; each unknown one appended to ``problems`` with the choices."""
    chosen_sites = all_sites if sites is None else list(sites)
    chosen_classes = all_classes if classes is None else list(classes)
    for what, chosen, found in (("sites", chosen_sites, all_sites), ("classes", chosen_classes, all_classes)):
        if not chosen or not all(isinstance(c, str) for c in chosen) or len(set(chosen)) != len(chosen):
            problems.append(f"{what} must be a non-empty list of distinct folder names, got {chosen!r}")
            continue
        for name in chosen:
            if name not in found:
                problems.append(f"{what}: '{name}' is not a {what[:-1] if what == 'sites' else 'class'} folder "
                                f"under '{root}'; found: {', '.join(found) or 'none'}{suggest(name, found)}")
    return chosen_sites, chosen_classes


@DATASETS.register(NAME, "your images: <root>/<site>/<class>/<image>, one client per site, classes from folder names")
def image_folder(*, seed: int, root: LocalPath | None = None, sites: list[str] | None = None,
                 classes: list[str] | None = None, size: int = 32, channels: Literal[1, 3] = 3,
                 clients_per_site: int = 1, val_fraction: float = DEFAULT_FRACTIONS[0],
                 test_fraction: float = DEFAULT_FRACTIONS[1], split: SplitFile | None = None) -> FederatedData:
    """A federation from a folder of images: ``<root>/<site>/<class>/<image>``.

    Args:
        seed: seeds the train/val/test split and the clients of a site.
        root: the folder holding one folder per site (required).
        sites: the site folders to use, one client each (default: every folder in ``root``, sorted).
        classes: the class folders to use, in label order (default: every class folder of every site,
            sorted); images of other folders are left out.
        size: side the images are resized to (square), >= 8.
        channels: 3 (RGB) or 1 (luminance).
        clients_per_site: clients per site; each split of a site is dealt to them, stratified.
        val_fraction: the share of each site's images for validation (stratified by class);
            ignored with ``split``.
        test_fraction: the share of each site's images for the test split (stratified by class);
            ignored with ``split``.
        split: a split file (relative to ``root``, or absolute) assigning every image to train, val
            or test: ``<site>/<class>/<image>,<split>`` per line; a config records it absolute.

    Returns:
        Classification data, one class per class folder (``info["classes"]`` names them); inputs
        ``(N, channels, size, size)`` float32 in [0, 1], int64 labels.

    Raises:
        ConfigError: an option is out of range, or names a site or class folder that does not exist.
        DataError: ``root`` is not a folder, a site has no images, an image cannot be read, or the
            split file is malformed or does not cover the images (the message names the file).
    """
    problems: list[str] = []
    check_int(problems, "size", size, 8)
    if not is_int(channels) or channels not in (1, 3):
        problems.append(f"channels must be 1 or 3, got {channels!r}")
    check_int(problems, "clients_per_site", clients_per_site, 1)
    check_fractions(problems, val_fraction, test_fraction)
    raise_problems(NAME, problems)
    base = require_root(NAME, root, LAYOUT)
    all_sites = _folders(base)
    if not all_sites:
        raise layout_error(NAME, base, "no site folders", LAYOUT)
    all_classes = sorted({c for s in all_sites for c in _folders(base / s)})
    chosen_sites, chosen_classes = _check(base, sites, classes, all_sites, all_classes, problems)
    raise_problems(NAME, problems)
    assigned = None
    if split is not None:
        if (val_fraction, test_fraction) != DEFAULT_FRACTIONS:
            warnings.warn(f"{NAME}: val_fraction and test_fraction do nothing with a split file", stacklevel=2)
        assigned = read_split_file(base / split, base)
    fractions = (1 - val_fraction - test_fraction, float(val_fraction), float(test_fraction))
    versions = package_versions(["pillow", "torch"])
    clients: list[ClientData] = []
    for site in chosen_sites:
        files = list_images(base, site, chosen_classes)
        if not files:
            raise layout_error(NAME, base, f"site '{site}' has no images in the class folders "
                               f"{', '.join(chosen_classes)}", LAYOUT)
        if assigned is not None:
            _check_coverage(base / str(split), site, chosen_classes, files, assigned)
        stats = [(base / rel).stat() for rel, _ in files]
        listing = "\n".join(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}" for (rel, _), st in zip(files, stats))
        key = {"dataset": NAME, "format": FORMAT_VERSION, "root": str(base.resolve()), "site": site,
               "classes": chosen_classes, "size": size, "channels": channels, "versions": versions,
               "files": hashlib.sha256(listing.encode()).hexdigest()}
        rec = load_or_build(key, lambda f=files: _read_site(base, f, size, channels),
                            f"{NAME}-{re.sub(r'[^A-Za-z0-9_.-]', '_', site)}", ("x", "y"))
        splits = _split_indices(files, rec["y"].numpy(), assigned, fractions, seed, site)
        clients += _site_clients(site, rec["x"], rec["y"], splits, clients_per_site, seed)
    params = {"seed": seed, "root": str(base), "sites": chosen_sites, "classes": chosen_classes, "size": size,
              "channels": channels, "clients_per_site": clients_per_site,
              **({"split": split} if split is not None else {"val_fraction": val_fraction,
                                                            "test_fraction": test_fraction})}
    info = {"sources": {s: f"image files in '{base / s}' (real)" for s in chosen_sites}, "synthetic": [],
            "classes": chosen_classes, "params": params, "versions": versions}
    return FederatedData(NAME, "classification", len(chosen_classes), (channels, size, size), clients, info)
