"""The papers' image benchmarks from a local directory: CIFAR-10, EMNIST, Office-Caltech10, DomainNet.

Nothing is downloaded: the user names ``root``; a missing or malformed layout raises a DataError
that shows the expected layout (docs/data.md lists them and the assumptions behind them).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedaug.core.errors import DataError
from fedaug.core.paths import LocalPath
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.checks import check_fractions, check_int, raise_problems
from fedaug.data.fashion_mnist import read_idx
from fedaug.data.label_split import Partition
from fedaug.data.local_common import group_clients, label_skew_clients, layout_error, read_image, require_root
from fedaug.data.registry import DATASETS

CIFAR_LAYOUT = "  <root>/data_batch_1 ... data_batch_5, test_batch   (python pickles, as in cifar-10-batches-py/)"
EMNIST_LAYOUT = ("  <root>/emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte.gz   (the 'gzip' folder), or\n"
                 "  <root>/emnist-byclass.mat   (the 'matlab' folder)")
FEDBN_LAYOUT = ("  <root>/{prefix}/<site>_train.pkl, <site>_test.pkl   pickled (paths, labels) arrays, FedBN format;\n"
                "  <root>/<each path>   the images, paths relative to <root> (e.g. {prefix}/<site>/<class>/x.jpg)")
OFFICE_SITES = ("amazon", "caltech", "dslr", "webcam")
OFFICE_CLASSES = ("back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer", "monitor",
                  "mouse", "mug", "projector")
DOMAINNET_SITES = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
DOMAINNET_CLASSES = ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill",
                     "wine_glass", "zebra")
PARTITION_DEFAULTS: dict[str, Any] = {"partition": "dirichlet", "num_clients": 10, "alpha": 0.5, "q": 2,
                                      "shards_per_client": 2, "mean_size": 100, "min_size": 10, "val_fraction": 0.1}


def read_cifar10(root: str | os.PathLike[str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10 python batches -> ``(x_train (50000, 3, 32, 32) float32 in [0, 1], y_train, x_test, y_test)``."""
    root = require_root("cifar10", root, CIFAR_LAYOUT)

    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            with open(root / name, "rb") as f:
                d = pickle.load(f, encoding="bytes")
            x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32)
            y = np.asarray(d[b"labels"], np.int64)
        except (OSError, pickle.UnpicklingError, KeyError, ValueError, EOFError) as exc:
            raise layout_error("cifar10", root, f"'{name}' is missing or malformed ({exc})", CIFAR_LAYOUT) from None
        if len(x) != len(y) or (len(y) and not 0 <= y.min() <= y.max() <= 9):
            raise layout_error("cifar10", root, f"'{name}' has {len(x)} images, {len(y)} labels in 0..9", CIFAR_LAYOUT)
        return x, y

    train = [batch(f"data_batch_{i}") for i in range(1, 6)]
    x_te, y_te = batch("test_batch")
    x = torch.from_numpy(np.concatenate([b[0] for b in train])).float() / 255
    return x, torch.from_numpy(np.concatenate([b[1] for b in train])), torch.from_numpy(x_te).float() / 255, \
        torch.from_numpy(y_te)


def read_emnist(root: str | os.PathLike[str], split: str = "byclass") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """EMNIST (idx.gz or .mat) -> ``(x_train (N, 1, 28, 28) float32 in [0, 1], y_train, x_test, y_test)``.

    EMNIST stores images transposed; they are transposed back to upright digits/letters.
    """
    root = require_root("emnist", root, EMNIST_LAYOUT)
    idx = {s: (root / f"emnist-{split}-{s}-images-idx3-ubyte.gz", root / f"emnist-{split}-{s}-labels-idx1-ubyte.gz")
           for s in ("train", "test")}
    mat = root / f"emnist-{split}.mat"
    out = []
    if all(p.is_file() for pair in idx.values() for p in pair):
        for s in ("train", "test"):
            out += [read_idx(idx[s][0]), read_idx(idx[s][1]).astype(np.int64)]
    elif mat.is_file():
        from scipy.io import loadmat

        try:
            ds = loadmat(mat)["dataset"]
            for s in ("train", "test"):
                part = ds[s][0, 0]
                out += [np.asarray(part["images"][0, 0], np.uint8).reshape(-1, 28, 28, order="F").transpose(0, 2, 1),
                        np.asarray(part["labels"][0, 0], np.int64).ravel()]
        except (KeyError, ValueError, IndexError, TypeError) as exc:
            raise layout_error("emnist", root, f"'{mat.name}' is malformed ({exc})", EMNIST_LAYOUT) from None
    else:
        raise layout_error("emnist", root, f"no EMNIST {split} files", EMNIST_LAYOUT)
    x_tr, y_tr, x_te, y_te = out
    if x_tr.ndim != 3 or len(x_tr) != len(y_tr) or len(x_te) != len(y_te):
        raise layout_error("emnist", root, "images and labels do not pair up", EMNIST_LAYOUT)

    def imgs(a: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1))).float().unsqueeze(1) / 255

    return imgs(x_tr), torch.from_numpy(y_tr), imgs(x_te), torch.from_numpy(y_te)


def _label_skew(name: str, arrays: tuple[Tensor, ...], seed: int, num_classes: int, root: Any,
                opts: dict[str, Any]) -> FederatedData:
    x, y, x_te, y_te = arrays
    extra = {k: opts[k] for k in ("num_clients", "alpha", "q", "shards_per_client", "mean_size")}
    clients = label_skew_clients(name, x, y, x_te, y_te, seed, opts["partition"], opts["min_size"],
                                 opts["val_fraction"], **extra)
    info = {"sources": {name: f"local files in '{root}' (real)"}, "synthetic": [], "params": {"seed": seed, **opts}}
    return FederatedData(name, "classification", num_classes, tuple(x.shape[1:]), clients, info)


@DATASETS.register("cifar10", "CIFAR-10 from a local directory (python batches); label-skew clients")
def cifar10(*, seed: int, root: LocalPath | None = None, partition: Partition = "dirichlet", num_clients: int = 10,
            alpha: float = 0.5, q: int = 2, shards_per_client: int = 2, mean_size: int = 100, min_size: int = 10,
            val_fraction: float = 0.1) -> FederatedData:
    """CIFAR-10 clients; options as :func:`fedaug.data.fashion_mnist.fashion_mnist` (x ``(N, 3, 32, 32)``)."""
    opts = {k: v for k, v in locals().items() if k in PARTITION_DEFAULTS}
    return _label_skew("cifar10", read_cifar10(root), seed, 10, root, opts)


@DATASETS.register("emnist", "EMNIST byclass (62 classes) from a local directory (idx.gz or .mat); label-skew clients")
def emnist(*, seed: int, root: LocalPath | None = None, partition: Partition = "dirichlet", num_clients: int = 10,
           alpha: float = 0.5, q: int = 2, shards_per_client: int = 2, mean_size: int = 100, min_size: int = 10,
           val_fraction: float = 0.1) -> FederatedData:
    """EMNIST byclass clients; options as :func:`fedaug.data.fashion_mnist.fashion_mnist` (x ``(N, 1, 28, 28)``)."""
    opts = {k: v for k, v in locals().items() if k in PARTITION_DEFAULTS}
    return _label_skew("emnist", read_emnist(root), seed, 62, root, opts)


def read_fedbn_site(root: Path, prefix: str, site: str, split: str, classes: tuple[str, ...], size: int,
                    dataset: str) -> tuple[Tensor, Tensor]:
    """One FedBN split file and its images -> ``((N, 3, size, size) float32 in [0, 1], (N,) int64)``."""
    from PIL import Image

    layout = FEDBN_LAYOUT.format(prefix=prefix)
    path = root / prefix / f"{site}_{split}.pkl"
    try:
        with open(path, "rb") as f:
            paths, names = pickle.load(f)
    except (OSError, pickle.UnpicklingError, ValueError, EOFError, TypeError) as exc:
        raise layout_error(dataset, root, f"split file '{path.relative_to(root)}' is missing or malformed ({exc})",
                           layout) from None
    bad = sorted({str(n) for n in names} - set(classes))
    if bad or len(paths) != len(names):
        raise layout_error(dataset, root, f"'{path.name}' has labels {bad} outside {', '.join(classes)}", layout)
    xs = []
    for p in paths:
        try:
            xs.append(read_image(root / str(p), size))
        except Image.DecompressionBombError as exc:
            raise DataError(f"{dataset}: image '{root / str(p)}' listed in '{path.name}' was refused as a possible "
                            f"decompression bomb ({exc}); remove it from the split file, or raise "
                            "PIL.Image.MAX_IMAGE_PIXELS if the image is genuine") from None
        except OSError as exc:
            raise layout_error(dataset, root, f"image '{p}' listed in '{path.name}' cannot be read ({exc})",
                               layout) from None
    y = torch.tensor([classes.index(str(n)) for n in names], dtype=torch.int64)
    return (torch.stack(xs) if xs else torch.zeros(0, 3, size, size)), y


def _fedbn(name: str, prefix: str, all_sites: tuple[str, ...], classes: tuple[str, ...], seed: int, root: Any,
           sites: Any, size: Any, val_fraction: Any) -> FederatedData:
    sites = list(all_sites if sites is None else sites)
    problems: list[str] = []
    if not sites or any(s not in all_sites for s in sites):
        problems.append(f"sites must be a non-empty list from {', '.join(all_sites)}, got {sites!r}")
    check_int(problems, "size", size, 8)
    check_fractions(problems, val_fraction)
    raise_problems(name, problems)
    root = require_root(name, root, FEDBN_LAYOUT.format(prefix=prefix))
    clients = []
    for site in sites:
        train = read_fedbn_site(root, prefix, site, "train", classes, size, name)
        test = read_fedbn_site(root, prefix, site, "test", classes, size, name)
        (c,) = group_clients({site: train}, (1 - val_fraction, val_fraction, 0.0), seed, name)
        clients.append(ClientData(c.name, c.group, c.train, c.val, Split(*test)))
    params = {"seed": seed, "root": str(root), "sites": sites, "size": size, "val_fraction": val_fraction}
    info = {"sources": {name: f"FedBN split files and images in '{root}' (real)"}, "synthetic": [],
            "classes": list(classes), "params": params}
    return FederatedData(name, "classification", len(classes), (3, size, size), clients, info)


@DATASETS.register("office_caltech10", "Office-Caltech10 from a local FedBN-layout directory; one client per domain")
def office_caltech10(*, seed: int, root: LocalPath | None = None, sites: list[str] | None = None, size: int = 64,
                     val_fraction: float = 0.1) -> FederatedData:
    """Office-Caltech10 (amazon, caltech, dslr, webcam), FedBN's split files; test = ``<site>_test.pkl``.

    Args:
        root: the directory holding ``office_caltech_10/`` (layout in docs/data.md).
        sites: the domains to use, one client each (default: all four).
        size: side the images are resized to, >= 8.
        val_fraction: share of each site's train file held out for validation, in [0, 1).
    """
    return _fedbn("office_caltech10", "office_caltech_10", OFFICE_SITES, OFFICE_CLASSES, seed, root, sites, size,
                  val_fraction)


@DATASETS.register("domainnet", "DomainNet 10-class subset (FedBN split files) from a local directory; domain clients")
def domainnet(*, seed: int, root: LocalPath | None = None, sites: list[str] | None = None, size: int = 64,
              val_fraction: float = 0.1) -> FederatedData:
    """DomainNet's ten-class FedBN subset (six domains); test = ``<site>_test.pkl``.

    Args:
        root: the directory holding ``DomainNet/`` (layout in docs/data.md).
        sites: the domains to use, one client each (default: all six).
        size: side the images are resized to, >= 8.
        val_fraction: share of each site's train file held out for validation, in [0, 1).
    """
    return _fedbn("domainnet", "DomainNet", DOMAINNET_SITES, DOMAINNET_CLASSES, seed, root, sites, size, val_fraction)
