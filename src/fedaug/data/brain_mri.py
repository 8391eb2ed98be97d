"""Brain MRI "sites" for segmentation smoke tests: one T1 volume per site, labels bg / GM / WM.

A smoke test, not a benchmark: every site is a single template brain.

* ``mni152`` (real template): MNI152 2009 T1 with grey- and white-matter probability maps and a
  brain mask, bundled in ``nilearn`` (Fonov et al., NeuroImage 2011). Label = the larger of the
  GM/WM probabilities where it is >= 1/3 inside the mask, else background.
* ``colin27`` (real image, derived labels): Colin27 T1 *with skull* (``ch2.nii.gz``) and its brain
  extraction (``ch2bet.nii.gz``) from the Debian package ``mricron-data`` (Holmes et al., JCAT 1998).
  Inside ``ch2bet > 0`` a three-class multi-Otsu threshold of the T1 intensity gives CSF (counted
  as background), GM and WM: a derived label, not a manual segmentation.
* ``inia19`` (optional, real image, derived labels): the INIA19 rhesus macaque template
  (``inia19-t1-brain.nii.gz``, skull-stripped; Rohlfing et al., Front. Neuroinf. 2012), labelled
  like ``colin27``. A different species: a strong site shift.

Volumes are reoriented to RAS, intensities scaled to [0, 1] (0.5th-99.5th percentile of non-zero
voxels). 2D samples are axial slices, zero-padded to square and resized to ``size`` (bilinear for
images, nearest for labels); 3D samples are ``patch``^3 crops tiled over the brain's bounding box
after downsampling by ``spacing`` (mean pooling for images, nearest for labels).

``scanners=k`` (>= the number of volumes) makes k clients that image the volumes through simulated
scanners (:mod:`fedaug.data.site_shift`): client j sees volume ``sites[j % len(sites)]`` recorded
with its own acquisition profile (bias field, contrast/gamma, Rician noise level, resolution; drawn
from ``scanner_seed`` and listed in ``info["scanners"]``), then scaled to [0, 1] like every site. The
slices/patches of a volume are dealt between the scanners that image it, so no anatomy is shared
between clients: a site shift of the kind scanners make, on top of the subject shift.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.errors import ConfigError, DataError
from fedaug.core.rng import derive_seed
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.cache import load_or_build, package_versions
from fedaug.data.checks import check_fraction, check_fractions, check_int, raise_problems
from fedaug.data.partition import stratified_split
from fedaug.data.registry import DATASETS
from fedaug.data.site_shift import AcquisitionProfile, acquire, draw_profiles

MRICRON = Path("/usr/share/mricron/templates")
SITES = ("mni152", "colin27", "inia19")
CLASSES = ("background", "grey matter", "white matter")
FORMAT_VERSION = 1
BLOCK = 8  # 2D: consecutive slices kept in one split, so near-identical neighbours do not straddle splits


def _require(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise DataError(f"brain MRI needs the package '{module}' ({what}); install it: pip install 'fedaug[data]'")


def _load(path: Path) -> np.ndarray:
    import nibabel as nib

    if not path.is_file():
        raise DataError(
            f"brain MRI file '{path}' is missing; install the Debian package with "
            "'sudo apt-get install mricron-data', or leave its site out (sites=['mni152'])"
        )
    return np.asarray(nib.as_closest_canonical(nib.load(path)).get_fdata(dtype=np.float32))


def _scale(t1: np.ndarray) -> np.ndarray:
    lo, hi = np.percentile(t1[t1 > 0], (0.5, 99.5))
    return np.clip((t1 - lo) / max(hi - lo, 1e-6), 0, 1).astype(np.float32)


def label_by_intensity(t1: np.ndarray, brain: np.ndarray) -> np.ndarray:
    """Derived GM/WM labels: three-class multi-Otsu thresholds of ``t1`` inside ``brain``.

    Args:
        t1: ``(X, Y, Z)`` T1 intensities (WM brightest, CSF darkest).
        brain: ``(X, Y, Z)`` bool brain mask.

    Returns:
        ``(X, Y, Z)`` uint8: 0 background or CSF, 1 GM, 2 WM.
    """
    from skimage.filters import threshold_multiotsu

    low, high = threshold_multiotsu(t1[brain], classes=3)
    out = np.zeros(t1.shape, np.uint8)
    out[brain & (t1 > low)] = 1
    out[brain & (t1 > high)] = 2
    return out


def load_site(site: str) -> tuple[np.ndarray, np.ndarray]:
    """One site's ``(X, Y, Z)`` float32 T1 in [0, 1] and uint8 labels (0 bg, 1 GM, 2 WM), RAS order."""
    if site == "mni152":
        _require("nilearn", "MNI152 templates")
        from nilearn import datasets, image

        def arr(img: Any) -> np.ndarray:
            return np.asarray(image.reorder_img(img, resample="nearest").get_fdata(dtype=np.float32))

        t1, gm, wm = (arr(f(resolution=1)) for f in (datasets.load_mni152_template, datasets.load_mni152_gm_template,
                                                        datasets.load_mni152_wm_template))
        mask = arr(datasets.load_mni152_brain_mask(resolution=1)) > 0
        labels = np.where(gm > wm, 1, 2).astype(np.uint8)
        labels[~mask | (np.maximum(gm, wm) < 1 / 3)] = 0
        return _scale(t1), labels
    _require("nibabel", "NIfTI reading")
    _require("skimage", "multi-Otsu thresholds")
    if site == "colin27":
        t1, bet = _load(MRICRON / "ch2.nii.gz"), _load(MRICRON / "ch2bet.nii.gz")
        return _scale(t1), label_by_intensity(bet, bet > 0)
    if site == "inia19":
        t1 = _load(MRICRON / "inia19-t1-brain.nii.gz")
        return _scale(t1), label_by_intensity(t1, t1 > 0)
    raise ConfigError(f"unknown brain MRI site {site!r}; choose from {', '.join(SITES)}")


def axial_slices(t1: np.ndarray, labels: np.ndarray, size: int, min_brain: float) -> tuple[Tensor, Tensor, Tensor]:
    """Axial slices with at least ``min_brain`` labelled pixels, padded square and resized.

    Returns:
        ``(x, y, z)``: ``(N, 1, size, size)`` float32, ``(N, size, size)`` uint8, ``(N,)`` slice index.
    """
    x, y = torch.from_numpy(t1).permute(2, 0, 1), torch.from_numpy(labels).permute(2, 0, 1)  # (Z, X, Y)
    side = max(x.shape[1:])
    pad = (0, side - x.shape[2], 0, side - x.shape[1])
    x, y = F.pad(x, pad), F.pad(y, pad)
    keep = torch.nonzero((y > 0).flatten(1).float().mean(1) >= min_brain).flatten()
    xs = F.interpolate(x[keep, None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    ys = F.interpolate(y[keep, None].float(), size=(size, size), mode="nearest")[:, 0]
    return xs.clamp(0, 1), ys.to(torch.uint8), keep


def patches(t1: np.ndarray, labels: np.ndarray, patch: int, spacing: int, min_brain: float) -> tuple[Tensor, Tensor]:
    """Non-overlapping ``patch``^3 crops tiling the brain's bounding box, after ``spacing``x downsampling.

    Crops with fewer than ``min_brain`` labelled voxels are dropped; the box is zero-padded up to
    a whole number of crops.

    Returns:
        ``(x, y)``: ``(N, 1, patch, patch, patch)`` float32 and ``(N, patch, patch, patch)`` uint8.
    """
    x = F.avg_pool3d(torch.from_numpy(t1)[None, None], spacing)[0, 0]
    y = torch.from_numpy(labels)[::spacing, ::spacing, ::spacing][: x.shape[0], : x.shape[1], : x.shape[2]]
    nz = torch.nonzero(y > 0)
    lo, hi = nz.min(0).values.tolist(), (nz.max(0).values + 1).tolist()
    counts = [-(-(h - lo_) // patch) for lo_, h in zip(lo, hi, strict=True)]
    grow = [max(0, lo_ + n * patch - dim) for lo_, n, dim in zip(lo, counts, x.shape, strict=True)]
    pad = (0, grow[2], 0, grow[1], 0, grow[0])
    x, y = F.pad(x, pad), F.pad(y, pad)
    xs, ys = [], []
    for i, j, k in np.ndindex(*counts):
        a, b, c = lo[0] + i * patch, lo[1] + j * patch, lo[2] + k * patch
        yp = y[a : a + patch, b : b + patch, c : c + patch]
        if (yp > 0).float().mean() >= min_brain:
            xs.append(x[a : a + patch, b : b + patch, c : c + patch])
            ys.append(yp)
    if not xs:
        return torch.zeros(0, 1, patch, patch, patch), torch.zeros(0, patch, patch, patch, dtype=torch.uint8)
    return torch.stack(xs)[:, None].contiguous(), torch.stack(ys)


def _site_record(volume: tuple[np.ndarray, np.ndarray], dims: int, size: int, patch: int, spacing: int,
                 min_brain: float, acquisition: tuple[AcquisitionProfile, int] | None = None) -> dict[str, Tensor]:
    """One client's samples: a site's ``(t1, labels)`` (:func:`load_site`; ``t1`` through
    ``acquisition = (profile, seed)`` if given, rescaled to [0, 1]) cut into slices or patches, with
    their split block ids."""
    t1, labels = volume
    if acquisition is not None:
        t1 = _scale(acquire(torch.from_numpy(t1), *acquisition).numpy())
    if dims == 2:
        x, y, z = axial_slices(t1, labels, size, min_brain)
        return {"x": x, "y": y, "block": z // BLOCK}
    x, y = patches(t1, labels, patch, spacing, min_brain)
    return {"x": x, "y": y, "block": torch.arange(len(x))}


def _check(sites: Any, dims: Any, size: Any, patch: Any, spacing: Any, min_brain: Any, val_fraction: Any,
           test_fraction: Any, scanners: Any, scanner_seed: Any) -> None:
    problems: list[str] = []
    sites_ok = (isinstance(sites, (list, tuple)) and bool(sites) and all(s in SITES for s in sites)
                and len(set(sites)) == len(sites))
    if not sites_ok:
        problems.append(f"sites must be a non-empty list of distinct names from {', '.join(SITES)}, got {sites!r}")
    check_int(problems, "scanners", scanners, 0)
    check_int(problems, "scanner_seed", scanner_seed, 0)
    if sites_ok and isinstance(scanners, int) and 0 < scanners < len(sites):
        problems.append(f"scanners must be 0 (off) or >= the {len(sites)} volumes of sites={list(sites)!r} (each "
                        f"volume is imaged by at least one scanner), got {scanners}")
    if dims not in (2, 3):
        problems.append(f"dims must be 2 or 3, got {dims!r}")
    for name, v, lo in (("size", size, 8), ("patch", patch, 4), ("spacing", spacing, 1)):
        check_int(problems, name, v, lo)
    check_fraction(problems, "min_brain", min_brain)
    check_fractions(problems, val_fraction, test_fraction)
    raise_problems("brain_mri", problems)


@DATASETS.register("brain_mri", "brain MRI sites (MNI152 nilearn, Colin27 mricron-data), bg/GM/WM, optional "
                                "simulated scanners; SMOKE TEST")
def brain_mri(
    *,
    seed: int,
    sites: list[str] | tuple[str, ...] = ("mni152", "colin27"),
    dims: int = 2,
    size: int = 64,
    patch: int = 32,
    spacing: int = 2,
    min_brain: float = 0.05,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    scanners: int = 0,
    scanner_seed: int = 0,
) -> FederatedData:
    """Segmentation clients, one per site (or per simulated scanner): axial slices (``dims=2``) or 3D
    patches (``dims=3``).

    Each client's samples are split into train/val/test at random (seeded) by blocks of
    :data:`BLOCK` consecutive slices (2D) or by patch (3D; patches do not overlap).

    Args:
        seed: seeds the splits.
        sites: which of :data:`SITES`; ``colin27`` and ``inia19`` need ``mricron-data``.
        dims: 2 or 3.
        size: 2D slice side after resizing.
        patch: 3D crop side.
        spacing: 3D downsampling factor (1 mm voxels -> ``spacing`` mm).
        min_brain: smallest labelled share of a kept slice or crop.
        val_fraction: the share of each client's blocks (2D) or patches (3D) for validation.
        test_fraction: the share of each client's blocks (2D) or patches (3D) for the test split.
        scanners: 0 (default): one client per volume, as recorded; k >= ``len(sites)``: k clients
            ``scanner<j>-<volume>``, volume ``sites[j % len(sites)]`` through simulated scanner j
            (:func:`fedaug.data.site_shift.draw_profiles`), the volume's blocks dealt between them.
        scanner_seed: seeds the scanners' profiles, bias fields and noise (not ``seed``, so that
            the sites stay the same across a run's seeds).

    Returns:
        ``task="segmentation"``, 3 classes (0 bg, 1 GM, 2 WM); x ``(N, 1, size, size)`` or
        ``(N, 1, patch, patch, patch)`` float32 in [0, 1], y ``(N, H, W)`` or ``(N, D, H, W)`` int64.

    Raises:
        ConfigError: an option is out of range.
        DataError: a package or file is missing (the message gives the install command).
    """
    _check(sites, dims, size, patch, spacing, min_brain, val_fraction, test_fraction, scanners, scanner_seed)
    fractions = (1 - val_fraction - test_fraction, val_fraction, test_fraction)
    versions = package_versions(["nilearn", "nibabel", "scikit-image", "numpy", "torch"])
    profiles = draw_profiles(scanners, scanner_seed) if scanners else []
    plan = ([(f"scanner{j}-{sites[j % len(sites)]}", sites[j % len(sites)], j) for j in range(scanners)] if scanners
            else [(site, site, None) for site in sites])
    volumes: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each volume read once, when a client is not cached

    def volume(site: str) -> tuple[np.ndarray, np.ndarray]:
        if site not in volumes:
            volumes[site] = load_site(site)
        return volumes[site]

    clients = []
    for name, site, j in plan:
        geometry = {"size": size} if dims == 2 else {"patch": patch, "spacing": spacing}
        key = {"format": FORMAT_VERSION, "site": site, "dims": dims, **geometry, "min_brain": min_brain,
               "versions": versions}
        acquisition = None
        if j is not None:
            acquisition = (profiles[j], derive_seed(scanner_seed, "brain_mri", "scanner", j))
            key |= {"scanner": profiles[j].to_dict(), "scanner_seed": scanner_seed, "scanner_index": j}
        rec = load_or_build(key, lambda s=site, a=acquisition: _site_record(volume(s), dims, size, patch, spacing,
                                                                              min_brain, a),
                            f"brain_mri-{name}-{dims}d", ("x", "y", "block"))
        blocks = rec["block"].numpy()
        ids = np.unique(blocks)
        if j is not None:  # the volume's blocks are dealt between the scanners that image it
            sharing = list(range(j % len(sites), scanners, len(sites)))
            order = np.random.default_rng(derive_seed(seed, "brain_mri", site, "scanners")).permutation(ids)
            ids = np.sort(np.array_split(order, len(sharing))[sharing.index(j)])
        chosen = stratified_split(np.zeros(len(ids), np.int64), fractions, derive_seed(seed, "brain_mri", name))
        splits = []
        for part in chosen:
            idx = torch.from_numpy(np.flatnonzero(np.isin(blocks, ids[part])))
            splits.append(Split(rec["x"][idx].float(), rec["y"][idx].long()))
        clients.append(ClientData(name, name, *splits))
    shape = (1, size, size) if dims == 2 else (1, patch, patch, patch)
    params = {"seed": seed, "sites": list(sites), "dims": dims, "size": size, "patch": patch, "spacing": spacing,
              "min_brain": min_brain, "val_fraction": val_fraction, "test_fraction": test_fraction,
              "scanners": scanners, "scanner_seed": scanner_seed}
    info = {
        "sources": {"mni152": "nilearn MNI152 2009 T1 + GM/WM/brain masks (real template)",
                    "colin27": "mricron-data ch2.nii.gz + ch2bet.nii.gz (real image; GM/WM derived by multi-Otsu)",
                    "inia19": "mricron-data inia19-t1-brain.nii.gz (macaque; GM/WM derived by multi-Otsu)"},
        "synthetic": [],
        "derived_labels": [s for s in sites if s != "mni152"],
        "smoke_test": "one template brain per site: a smoke test of the segmentation path, not a benchmark",
        "classes": list(CLASSES),
        "params": params,
        "scanners": [{"name": name, "volume": site, **profiles[j].to_dict()}
                     for name, site, j in plan if j is not None],
    }
    return FederatedData("brain_mri", "segmentation", 3, shape, clients, info)
