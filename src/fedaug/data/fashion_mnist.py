"""Fashion-MNIST from local idx files, split between clients with label skew (Dirichlet) or IID.

Xiao et al., "Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine Learning Algorithms",
arXiv:1708.07747. The files come from the Debian package ``dataset-fashion-mnist`` (installed
under ``/usr/share/datasets/fashion-mnist``) or any directory with the four published files.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedaug.core.errors import ConfigError, DataError
from fedaug.core.paths import LocalPath
from fedaug.core.rng import derive_seed
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.checks import check_fractions, check_int, is_int, raise_problems
from fedaug.data.label_split import Partition, check_partition_options, partition_labels
from fedaug.data.registry import DATASETS

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a gzipped idx file (LeCun's MNIST format): magic ``00 00 <dtype> <ndim>``, big-endian
    uint32 dimensions, then the data.

    Args:
        path: the ``.gz`` file.

    Returns:
        The array with the file's shape (e.g. ``(N, 28, 28)`` uint8 images, ``(N,)`` uint8 labels),
        in native byte order.

    Raises:
        DataError: the file is not a well-formed gzipped idx file.
    """
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
        zero, code, ndim = struct.unpack(">HBB", raw[:4])
        dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
        dtype = np.dtype(_IDX_DTYPES[code])
        if zero != 0 or len(raw) != 4 + 4 * ndim + math.prod(dims) * dtype.itemsize:
            raise ValueError("header does not match the data length")
    except (OSError, EOFError, KeyError, struct.error, ValueError) as exc:
        raise DataError(f"'{path}' is not a gzipped idx file ({type(exc).__name__}: {exc})") from None
    return np.frombuffer(raw, dtype, offset=4 + 4 * ndim).reshape(dims).astype(dtype.newbyteorder("="))


def load_arrays(root: str | os.PathLike[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Images ``(N, 28, 28)`` uint8 and labels ``(N,)`` of the ``"train"`` and ``"test"`` files in ``root``.

    Raises:
        DataError: a file is missing or malformed; the message names the path, the expected files
            and how to install them.
    """
    root = Path(root)
    missing = [name for pair in FILES.values() for name in pair if not (root / name).is_file()]
    if missing:
        raise DataError(
            f"Fashion-MNIST files missing in '{root}': {', '.join(missing)} (expected "
            f"{', '.join(n for pair in FILES.values() for n in pair)}); install them with "
            "'sudo apt-get install dataset-fashion-mnist' or pass root=<directory with these files>"
        )
    out = {}
    for split, (images, labels) in FILES.items():
        x, y = read_idx(root / images), read_idx(root / labels)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8:
            raise DataError(f"'{root / images}' {x.shape} {x.dtype} and '{root / labels}' {y.shape} do not pair up")
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise DataError(f"'{root / labels}' holds labels outside 0-9 ({y.min()}..{y.max()})")
        out[split] = (x, y.astype(np.int64))
    return out


def _check(min_size: Any, samples: Any, val_fraction: Any) -> None:
    problems: list[str] = []
    check_int(problems, "min_size", min_size, 0)
    if samples is not None and (not is_int(samples) or samples < 1):
        problems.append(f"samples must be None (all) or an integer >= 1, got {samples!r}")
    check_fractions(problems, val_fraction)
    raise_problems("fashion_mnist", problems)


def _test_indices(train_labels: list[np.ndarray], test_labels: np.ndarray, rate: float, seed: int) -> list[np.ndarray]:
    """Per client, ``round(rate * n_c)`` test indices of each class c it trains on (n_c train samples).

    Each class's test indices are shuffled and dealt out in consecutive runs, so clients share no
    test sample unless the demand for a class exceeds its supply; then runs wrap around (never
    repeating a sample within one client).
    """
    rng = np.random.default_rng(seed)
    out: list[list[np.ndarray]] = [[np.zeros(0, np.int64)] for _ in train_labels]
    for c in range(10):
        pool = rng.permutation(np.flatnonzero(test_labels == c))
        start = 0
        for k, labels in enumerate(train_labels):
            want = min(round(rate * int((labels == c).sum())), len(pool))
            out[k].append(pool[(start + np.arange(want)) % max(len(pool), 1)])
            start += want
    return [rng.permutation(np.concatenate(parts)) for parts in out]


@DATASETS.register("fashion_mnist", "Fashion-MNIST (Debian dataset-fashion-mnist); dirichlet(_balanced), iid, "
                                    "quantity, shards or scarcity clients")
def fashion_mnist(
    *,
    seed: int,
    root: LocalPath | os.PathLike[str] = DEFAULT_ROOT,
    num_clients: int = 10,
    partition: Partition = "dirichlet",
    alpha: float = 0.5,
    q: int = 2,
    shards_per_client: int = 2,
    mean_size: int = 100,
    min_size: int = 10,
    samples: int | None = None,
    val_fraction: float = 0.1,
) -> FederatedData:
    """Build federated Fashion-MNIST: clients with their own train/val split and a matching test split.

    The (optionally subsampled) 60,000 training images are partitioned between clients; each
    client's share is split into train and val (``floor(val_fraction * n)`` to val). Each client's
    test split is drawn from the 10,000 test images with the label distribution of its train split,
    at the file's test/train rate (capped so that no class runs out), without sharing samples
    between clients where the supply allows.

    Args:
        seed: seeds the subset, the partition, the val split and the test draw.
        root: directory with the four gzipped idx files.
        num_clients: number of clients.
        partition: ``"dirichlet"`` (Dir(alpha) label skew), ``"dirichlet_balanced"`` (the same,
            clients capped at ``N / num_clients``: NIID-Bench/PFLlib), ``"iid"``, ``"quantity"`` (Qua(q):
            q classes per client), ``"shards"`` (FedAvg's sorted shards) or ``"scarcity"``
            (FLea: ``round(N / mean_size)`` clients with Dir(alpha) label skew; ``num_clients``
            is then unused). See :mod:`fedaug.data.label_split`.
        alpha: Dirichlet concentration, > 0 (``dirichlet``, ``dirichlet_balanced``, ``scarcity``).
        q: classes per client (``quantity``).
        shards_per_client: shards per client (``shards``).
        mean_size: mean samples per client before the val split (``scarcity``).
        min_size: fewest train samples per client for ``dirichlet(_balanced)``; draws are repeated until it holds.
        samples: use a seeded random subset of this many training images (None: all).
        val_fraction: share of each client's data held out for validation, in [0, 1).

    Returns:
        Classification data, 10 classes; inputs ``(N, 1, 28, 28)`` float32 in [0, 1], int64 labels.

    Raises:
        ConfigError: an option is out of range, or no partition satisfies ``min_size``.
        DataError: the files are missing or malformed.
    """
    opts = {"num_clients": num_clients, "alpha": alpha, "q": q, "shards_per_client": shards_per_client,
            "mean_size": mean_size}
    check_partition_options("fashion_mnist", partition, opts)
    _check(min_size, samples, val_fraction)
    arrays = load_arrays(root)
    (x_all, y_all), (x_test, y_test) = arrays["train"], arrays["test"]
    n_all = len(y_all)
    if samples is not None and samples > n_all:
        raise ConfigError(f"fashion_mnist: samples must be <= {n_all} (the training images in '{root}'), got {samples}")
    pick = np.random.default_rng(derive_seed(seed, "fashion_mnist", "subset")).permutation(n_all)[:samples]
    labels = y_all[pick]
    share_min = math.ceil(min_size / (1 - val_fraction))  # so that train = share - floor(vf * share) >= min_size
    if partition in ("dirichlet", "dirichlet_balanced") and num_clients * max(share_min, 1) > len(pick):
        raise ConfigError(
            f"fashion_mnist: {len(pick)} samples cannot give num_clients={num_clients} clients "
            f"min_size={min_size} train samples each; lower num_clients or min_size, or raise samples"
        )
    part_seed = derive_seed(seed, "fashion_mnist", "partition", partition)
    shares = partition_labels(labels, partition, part_seed, share_min, **opts)
    splits = [(s[math.floor(val_fraction * len(s)) :], s[: math.floor(val_fraction * len(s))]) for s in shares]
    train_labels = [labels[tr] for tr, _ in splits]
    totals = np.bincount(np.concatenate(train_labels), minlength=10)
    supply = np.bincount(y_test, minlength=10)
    rate = min(len(y_test) / (n_all * (1 - val_fraction)), *(supply[totals > 0] / totals[totals > 0]))
    tests = _test_indices(train_labels, y_test, rate, derive_seed(seed, "fashion_mnist", "test"))

    def split(x: np.ndarray, y: np.ndarray, idx: np.ndarray) -> Split:
        return Split(torch.from_numpy(x[idx].astype(np.float32) / 255).unsqueeze(1), torch.from_numpy(y[idx]))

    clients = [
        ClientData(
            f"client-{k}",
            f"client-{k}",
            split(x_all, y_all, pick[tr]),
            split(x_all, y_all, pick[va]),
            split(x_test, y_test, te),
        )
        for k, ((tr, va), te) in enumerate(zip(splits, tests, strict=True))
    ]
    params = {
        "seed": seed,
        "root": str(root),
        "partition": partition,
        **opts,
        "min_size": min_size,
        "samples": samples,
        "val_fraction": val_fraction,
    }
    return FederatedData(
        name="fashion_mnist",
        task="classification",
        num_classes=10,
        input_shape=(1, 28, 28),
        clients=clients,
        info={
            "sources": {"fashion_mnist": f"Fashion-MNIST idx files in '{root}' (real)"},
            "synthetic": [],
            "classes": list(CLASSES),
            "test_rate": rate,
            "params": params,
        },
    )
