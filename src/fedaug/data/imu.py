"""Smartwatch IMU exercise recognition with subjects as natural clients (real data).

Burns et al., "Shoulder Physiotherapy Exercise Recognition: Machine Learning the Inertial Signals
from a Smartwatch", Physiol. Meas. 2018 (arXiv:1802.01489); the recordings ship with ``seglearn``
(BSD-3) as ``data/watch_dataset.npy``: 140 recordings, 6 channels (3-axis accelerometer and
gyroscope), 50 Hz, 7 exercise classes, 10 subjects, each subject with every class on both arms.
The file is read with numpy; seglearn is never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from fedaug.core.errors import DataError
from fedaug.core.rng import derive_seed
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.checks import check_fractions, check_int, raise_problems
from fedaug.data.partition import natural_partition, stratified_split
from fedaug.data.registry import DATASETS

CLASSES = ("PEN", "ABD", "FEL", "IR", "ER", "TRAP", "ROW")
CHANNELS = ("ax", "ay", "az", "wx", "wy", "wz")
Layout = Literal["channels_first", "harnet"]
LAYOUTS: tuple[str, ...] = get_args(Layout)
SplitBy = Literal["time", "recording"]
SPLIT_BY: tuple[str, ...] = get_args(SplitBy)


def watch_file() -> Path:
    """The path of seglearn's ``watch_dataset.npy``.

    Raises:
        DataError: seglearn or the file is not installed.
    """
    spec = importlib.util.find_spec("seglearn")
    path = Path(spec.submodule_search_locations[0]) / "data" / "watch_dataset.npy" if spec else None
    if path is None or not path.is_file():
        raise DataError("smartwatch IMU needs seglearn's data/watch_dataset.npy; install it: pip install 'fedaug[data]'")
    return path


def read_watch(path: str | Path) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Read the pickled dict ``{"X": [(T_i, 6)], "y": (R,), "subject": (R,), ...}``.

    Returns:
        ``(recordings, labels, subjects)``: R float32 ``(T_i, 6)`` arrays, ``(R,)`` int64 class
        indices in 0..6 and ``(R,)`` int64 subject ids.

    Raises:
        DataError: the file is not such a dict.
    """
    try:
        d = np.load(path, allow_pickle=True).item()
        xs = [np.asarray(x, np.float32) for x in d["X"]]
        y, subj = np.asarray(d["y"], np.int64), np.asarray(d["subject"], np.int64)
        if len(xs) != len(y) or len(y) != len(subj) or any(x.ndim != 2 or x.shape[1] != 6 for x in xs):
            raise ValueError("X, y and subject do not pair up as (T, 6) recordings")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(
            f"'{path}' is not the seglearn watch dataset (a pickled dict with X: list of (T, 6) arrays, "
            f"y and subject: (R,) ints): {exc}"
        ) from None
    return xs, y, subj


def windows(x: np.ndarray, window: int, stride: int) -> np.ndarray:
    """Sliding windows of a ``(T, C)`` series: ``(W, C, window)`` with ``W = (T - window) // stride + 1``
    (0 when ``T < window``)."""
    if len(x) < window:
        return np.zeros((0, x.shape[1], window), x.dtype)
    return np.lib.stride_tricks.sliding_window_view(x, window, axis=0)[::stride].copy()


def _check(window: Any, stride: Any, layout: Any, split_by: Any, val_fraction: Any, test_fraction: Any,
           clients_per_subject: Any) -> None:
    problems: list[str] = []
    check_int(problems, "clients_per_subject", clients_per_subject, 1, 14, note=" (recordings per subject)")
    check_int(problems, "window", window, 1)
    check_int(problems, "stride", stride, 1)
    if layout not in LAYOUTS:
        problems.append(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if split_by not in SPLIT_BY:
        problems.append(f"split_by must be one of {', '.join(SPLIT_BY)}, got {split_by!r}")
    check_fractions(problems, val_fraction, test_fraction)
    raise_problems("smartwatch_imu", problems)


@DATASETS.register("smartwatch_imu", "smartwatch IMU exercises (seglearn, real), 7 classes, 10 subjects as clients")
def smartwatch_imu(
    *,
    seed: int,
    window: int = 100,
    stride: int = 50,
    layout: Layout = "channels_first",
    clients_per_subject: int = 1,
    split_by: SplitBy = "time",
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
) -> FederatedData:
    """Windows of smartwatch IMU recordings, one client per subject (or several per subject).

    Splits never share a time step. ``split_by="time"`` (default) cuts every recording into three
    consecutive blocks (train, val, test in the given fractions) and windows each block separately,
    so every client's splits hold every class of that client. ``split_by="recording"`` assigns whole
    recordings (stratified by class; a subject has two recordings per class, one per arm), so a
    split may lack a class. A subject split into ``clients_per_subject`` clients is divided by
    whole recordings, stratified by class.

    Args:
        seed: seeds the recording assignment (``clients_per_subject > 1`` or ``split_by="recording"``).
        window: steps per window (50 Hz: 100 = 2 s).
        stride: steps between window starts.
        layout: ``"channels_first"``: ``(N, 6, window)`` for 1D CNNs; ``"harnet"``:
            ``(N, 1, window, 6)`` for HARNet-style ``(k, 1)`` kernels.
        clients_per_subject: clients per subject, 1 to 14.
        split_by: ``"time"`` or ``"recording"``.
        val_fraction: the share of each recording (or of the recordings) for validation.
        test_fraction: the share of each recording (or of the recordings) for the test split.

    Returns:
        Classification data, 7 classes, float32 inputs (raw sensor units), int64 labels; client
        names ``subject-<id>`` (``subject-<id>#<j>`` when split), groups ``subject-<id>``.

    Raises:
        ConfigError: an option is out of range.
        DataError: seglearn's file is missing or malformed.
    """
    _check(window, stride, layout, split_by, val_fraction, test_fraction, clients_per_subject)
    xs, y, subj = read_watch(watch_file())
    fractions = (1 - val_fraction - test_fraction, val_fraction, test_fraction)
    groups = np.array([f"subject-{s:02d}" for s in subj])
    names, parts = natural_partition(groups, clients_per_subject, derive_seed(seed, "imu", "clients"), y)

    def make(pieces: list[tuple[np.ndarray, int]]) -> Split:
        ws = [windows(x, window, stride) for x, _ in pieces]
        x = np.concatenate([np.zeros((0, 6, window), np.float32), *ws])
        labels = np.concatenate([np.zeros(0, np.int64), *(np.full(len(w), c) for w, (_, c) in zip(ws, pieces))])
        xt = torch.from_numpy(x)
        return Split(xt.permute(0, 2, 1).unsqueeze(1).contiguous() if layout == "harnet" else xt, torch.from_numpy(labels))

    clients = []
    for k, (name, recs) in enumerate(zip(names, parts, strict=True)):
        if split_by == "time":
            cuts = [(np.round(np.cumsum((0.0, *fractions)) * len(xs[r])).astype(int), r) for r in recs]
            splits = [make([(xs[r][b[i] : b[i + 1]], int(y[r])) for b, r in cuts]) for i in range(3)]
        else:
            chosen = stratified_split(y[recs], fractions, derive_seed(seed, "imu", "split", k))
            splits = [make([(xs[r], int(y[r])) for r in recs[c]]) for c in chosen]
        clients.append(ClientData(name, name.split("#")[0], *splits))
    shape = (1, window, 6) if layout == "harnet" else (6, window)
    params = {"seed": seed, "window": window, "stride": stride, "layout": layout,
              "clients_per_subject": clients_per_subject, "split_by": split_by,
              "val_fraction": val_fraction, "test_fraction": test_fraction}
    info = {"sources": {"smartwatch_imu": "seglearn data/watch_dataset.npy (real, Burns et al. 2018)"},
            "synthetic": [], "classes": list(CLASSES), "channels": list(CHANNELS), "params": params}
    return FederatedData("smartwatch_imu", "classification", 7, shape, clients, info)
