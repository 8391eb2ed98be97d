"""The papers' sensor, audio and MRI benchmarks from a local directory: UCI-HAR, UrbanSound8K, ProstateMRI.

Nothing is downloaded: the user names ``root``; a missing or malformed layout raises a DataError
that shows the expected layout (docs/data.md lists them and the assumptions behind them).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from fedaug.core.errors import ConfigError
from fedaug.core.paths import LocalPath
from fedaug.data.audio import fix_length, log_mel, read_wav, resample
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.brain_mri import axial_slices
from fedaug.data.cache import load_or_build, package_versions
from fedaug.data.label_split import Partition
from fedaug.data.local_common import group_clients, label_skew_clients, layout_error, require_root, split_fractions
from fedaug.data.registry import DATASETS

HAR_SIGNALS = tuple(f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz")
HAR_CLASSES = ("WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING")
HAR_LAYOUT = ("  <root>/{train,test}/y_{split}.txt, subject_{split}.txt   (one integer per line)\n"
              "  <root>/{train,test}/Inertial Signals/<signal>_{split}.txt   (128 numbers per line), signals "
              + ", ".join(HAR_SIGNALS))
US8K_LAYOUT = ("  <root>/metadata/UrbanSound8K.csv   (slice_file_name, fsID, start, end, salience, fold, classID, class)\n"
               "  <root>/audio/fold1 ... fold10/<slice_file_name>.wav")
PROSTATE_SITES = ("BIDMC", "HK", "I2CVB", "ISBI", "ISBI_1.5", "UCL")
PROSTATE_LAYOUT = ("  <root>/<site>/CaseNN.nii.gz and CaseNN_segmentation.nii.gz (or _Segmentation), sites "
                   + ", ".join(PROSTATE_SITES))
US8K_RATE = 22050


def read_uci_har(root: Any, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One UCI-HAR split: ``(x (N, 9, 128) float32, y (N,) int64 in 0..5, subject (N,) int64)``."""
    root = require_root("uci_har", root, HAR_LAYOUT)
    d = root / split
    try:
        y = np.loadtxt(d / f"y_{split}.txt", dtype=np.int64, ndmin=1) - 1
        subj = np.loadtxt(d / f"subject_{split}.txt", dtype=np.int64, ndmin=1)
        x = np.stack([np.loadtxt(d / "Inertial Signals" / f"{s}_{split}.txt", dtype=np.float32, ndmin=2)
                      for s in HAR_SIGNALS], axis=1)
    except (OSError, ValueError) as exc:
        raise layout_error("uci_har", root, f"the {split} files are missing or malformed ({exc})", HAR_LAYOUT) from None
    if x.shape[0] != len(y) or len(y) != len(subj) or x.shape[2] != 128 or (len(y) and not 0 <= y.min() <= y.max() <= 5):
        raise layout_error("uci_har", root, f"{split}: x {x.shape}, {len(y)} labels (1..6), {len(subj)} subjects "
                           "do not pair up", HAR_LAYOUT)
    return x, y, subj


@DATASETS.register("uci_har", "UCI-HAR from a local directory (9 inertial channels, 128 steps); subject or label-skew clients")
def uci_har(*, seed: int, root: LocalPath | None = None, partition: Literal["subject", Partition] = "subject", num_clients: int = 10,
            alpha: float = 0.5, q: int = 2, shards_per_client: int = 2, mean_size: int = 100, min_size: int = 10,
            val_fraction: float = 0.1, test_fraction: float = 0.2) -> FederatedData:
    """UCI-HAR clients, x ``(N, 9, 128)``.

    ``partition="subject"``: the 30 subjects (train and test files together) are the clients; each
    subject's windows of one activity are split in time order (first train, then val, then test),
    since neighbouring windows overlap by 50 %. Any other partition (FLea's setting) splits the
    official train set by labels and deals the official test set to clients IID
    (``test_fraction`` unused). The label partitions' options are those of
    :func:`fedaug.data.fashion_mnist.fashion_mnist`.

    Args:
        root: the dataset's directory (``UCI HAR Dataset``; layout in docs/data.md).
        partition: ``"subject"`` (default: one client per subject) or a label partition.
        val_fraction: the share of each subject's windows per activity for validation (``subject``).
        test_fraction: the share of each subject's windows per activity for the test split
            (``subject``; the official test set otherwise).
    """
    tr, te = read_uci_har(root, "train"), read_uci_har(root, "test")
    fractions = split_fractions("uci_har", val_fraction, test_fraction)
    params = {"seed": seed, "root": str(root), "partition": partition}
    if partition == "subject":
        x, y, subj = (np.concatenate([a, b]) for a, b in zip(tr, te, strict=True))
        clients = []
        for s in np.unique(subj):
            parts: list[list[int]] = [[], [], []]  # train, val, test
            for c in np.unique(y[subj == s]):
                idx = np.flatnonzero((subj == s) & (y == c))  # file order = time order
                cuts = np.round(np.cumsum((0.0, *fractions)) * len(idx)).astype(int)
                for i in range(3):
                    parts[i] += idx[cuts[i] : cuts[i + 1]].tolist()
            name = f"subject-{s:02d}"
            clients.append(ClientData(name, name, *(Split(torch.from_numpy(x[p]), torch.from_numpy(y[p]))
                                                    for p in (np.asarray(q, np.int64) for q in parts))))
    else:
        arrays = [torch.from_numpy(a) for a in (tr[0], tr[1], te[0], te[1])]
        clients = label_skew_clients("uci_har", *arrays, seed, partition, min_size, val_fraction,
                                     num_clients=num_clients, alpha=alpha, q=q, shards_per_client=shards_per_client,
                                     mean_size=mean_size)
    info = {"sources": {"uci_har": f"local files in '{root}' (real)"}, "synthetic": [], "classes": list(HAR_CLASSES),
            "params": params}
    return FederatedData("uci_har", "classification", 6, (9, 128), clients, info)


def read_us8k_metadata(root: Path) -> list[dict[str, str]]:
    try:
        with open(root / "metadata" / "UrbanSound8K.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            r["fold"], r["classID"] = str(int(r["fold"])), str(int(r["classID"]))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise layout_error("urbansound8k", root, f"metadata CSV missing or malformed ({exc})", US8K_LAYOUT) from None
    return rows


def _us8k_features(root: Path, rows: list[dict[str, str]], duration: float, n_mels: int) -> dict[str, torch.Tensor]:
    clips = []
    for r in rows:
        path = root / "audio" / f"fold{r['fold']}" / r["slice_file_name"]
        if not path.is_file():
            raise layout_error("urbansound8k", root, f"'{path.relative_to(root)}' listed in the CSV is missing",
                               US8K_LAYOUT)
        x, rate = read_wav(path)
        clips.append(fix_length(resample(x, rate, US8K_RATE), round(duration * US8K_RATE)))
    x = log_mel(torch.from_numpy(np.stack(clips)), US8K_RATE, n_fft=1024, hop=512, n_mels=n_mels)
    return {"x": x.unsqueeze(1), "y": torch.tensor([int(r["classID"]) for r in rows])}


@DATASETS.register("urbansound8k", "UrbanSound8K from a local directory (wav + CSV), log-mel; label-skew clients")
def urbansound8k(*, seed: int, root: LocalPath | None = None, test_folds: list[int] | tuple[int, ...] = (10,),
                 duration: float = 4.0, n_mels: int = 64, partition: Partition = "dirichlet", num_clients: int = 10,
                 alpha: float = 0.5, q: int = 2, shards_per_client: int = 2, mean_size: int = 100,
                 min_size: int = 1, val_fraction: float = 0.1) -> FederatedData:
    """UrbanSound8K: folds not in ``test_folds`` are partitioned by labels; the test folds are dealt
    IID. Features: log-mel (22,050 Hz, n_fft 1024, hop 512), cached; x ``(N, 1, n_mels, frames)``.
    The label partitions' options are those of :func:`fedaug.data.fashion_mnist.fashion_mnist`.

    Args:
        root: the dataset's directory (``metadata/`` and ``audio/``; layout in docs/data.md).
        test_folds: the folds (1..10) that make the test set.
        duration: seconds of each clip (cut or zero-padded).
        n_mels: mel bands of the features.
    """
    root = require_root("urbansound8k", root, US8K_LAYOUT)
    if not isinstance(test_folds, (list, tuple)) or not test_folds or any(f not in range(1, 11) for f in test_folds):
        raise ConfigError(f"urbansound8k: test_folds must be a non-empty list of folds in 1..10, got {test_folds!r}")
    rows = read_us8k_metadata(root)
    csv_stat = (root / "metadata" / "UrbanSound8K.csv").stat()
    key = {"root": str(root.resolve()), "csv": [csv_stat.st_size, csv_stat.st_mtime_ns], "duration": duration,
           "n_mels": n_mels, "versions": package_versions(["numpy", "scipy", "torch"])}
    rec = load_or_build(key, lambda: _us8k_features(root, rows, duration, n_mels), "urbansound8k", ("x", "y"))
    is_test = torch.tensor([int(r["fold"]) in test_folds for r in rows])
    x, y = rec["x"], rec["y"]
    clients = label_skew_clients("urbansound8k", x[~is_test], y[~is_test], x[is_test], y[is_test], seed, partition,
                                 min_size, val_fraction, num_clients=num_clients, alpha=alpha, q=q,
                                 shards_per_client=shards_per_client, mean_size=mean_size)
    info = {"sources": {"urbansound8k": f"local files in '{root}' (real)"}, "synthetic": [],
            "params": {"seed": seed, "root": str(root), "test_folds": list(test_folds), "partition": partition}}
    return FederatedData("urbansound8k", "classification", 10, tuple(x.shape[1:]), clients, info)


@DATASETS.register("prostate_mri", "ProstateMRI six sites from a local directory (NIfTI + masks); 2D slices, site clients")
def prostate_mri(*, seed: int, root: LocalPath | None = None, sites: list[str] | None = None, size: int = 64,
                 val_fraction: float = 0.1, test_fraction: float = 0.2) -> FederatedData:
    """ProstateMRI (FedFA/FedDG sites): axial slices with prostate, resized to ``size``; masks > 0 -> 1.

    Args:
        root: the dataset's directory, one folder per site (layout in docs/data.md).
        sites: the sites to use, one client each (default: all six).
        size: side of the resized slices.
        val_fraction: the share of each site's slices for validation (stratified split).
        test_fraction: the share of each site's slices for the test split (stratified split).

    Returns:
        Segmentation, 2 classes; x ``(N, 1, size, size)`` in [0, 1] per volume, y ``(N, size, size)``.
    """
    import nibabel as nib

    root = require_root("prostate_mri", root, PROSTATE_LAYOUT)
    sites = list(PROSTATE_SITES if sites is None else sites)
    if not sites or any(s not in PROSTATE_SITES for s in sites):
        raise ConfigError(f"prostate_mri: sites must be a non-empty list from {', '.join(PROSTATE_SITES)}, got {sites!r}")
    fractions = split_fractions("prostate_mri", val_fraction, test_fraction)
    groups = {}
    for site in sites:
        cases = sorted(p for p in (root / site).glob("*.nii*") if "segmentation" not in p.name.lower())
        if not cases:
            raise layout_error("prostate_mri", root, f"no volumes in '{site}/'", PROSTATE_LAYOUT)
        xs, ys = [], []
        for case in cases:
            stem = case.name.split(".")[0]
            masks = [m for m in case.parent.glob(f"{stem}_*egmentation.nii*")]
            if not masks:
                raise layout_error("prostate_mri", root, f"no mask '{stem}_segmentation.nii.gz' for '{site}/{case.name}'",
                                   PROSTATE_LAYOUT)
            img = np.asarray(nib.as_closest_canonical(nib.load(case)).get_fdata(dtype=np.float32))
            seg = np.asarray(nib.as_closest_canonical(nib.load(masks[0])).get_fdata(dtype=np.float32)) > 0
            lo, hi = np.percentile(img, (0.5, 99.5))
            x, y, _ = axial_slices(np.clip((img - lo) / max(hi - lo, 1e-6), 0, 1), seg.astype(np.uint8), size, 1e-9)
            xs.append(x)
            ys.append(y.long())
        groups[site] = (torch.cat(xs), torch.cat(ys))
    clients = group_clients(groups, fractions, seed, "prostate_mri")
    info = {"sources": {"prostate_mri": f"local NIfTI files in '{root}' (real)"}, "synthetic": [],
            "params": {"seed": seed, "root": str(root), "sites": sites, "size": size}}
    return FederatedData("prostate_mri", "segmentation", 2, (1, size, size), clients, info)
