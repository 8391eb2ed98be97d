"""Statistics for comparison tables and feature analyses: mean +/- std over seeds, the paired
t-test against a baseline with the confidence interval of the mean difference, the Davies-Bouldin
score and an exact, deterministic PCA."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedaug.core.errors import ConfigError

#: the two-sided confidence level of :attr:`PairedTest.ci_low` and :attr:`PairedTest.ci_high`
CONFIDENCE = 0.95


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value).

    Raises:
        ValueError: ``values`` is empty.

    >>> mean_std([0.25, 0.75])
    (0.5, 0.3535533905932738)
    """
    if not values:
        raise ValueError("mean_std needs at least one value")
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison of a method with the baseline over the seeds both ran.

    Attributes:
        n: number of pairs (seeds present in both).
        diff: mean of ``method - baseline`` over the pairs (``None`` when ``n == 0``).
        t: the t statistic ``mean(d) / (std(d, ddof=1) / sqrt(n))`` (``None`` when undefined).
        p: two-sided p-value with ``n - 1`` degrees of freedom (``None`` when undefined).
        note: why ``p`` is undefined (``""`` when it is defined).
        ci_low, ci_high: the :data:`CONFIDENCE` (95 %) confidence interval of the mean difference,
            ``diff -/+ t_{n-1}(0.975) * std(d, ddof=1) / sqrt(n)`` (Student t, ``n - 1`` degrees of
            freedom, the same differences as ``t``); ``None`` exactly when ``p`` is. It excludes 0
            exactly when ``p < 1 - CONFIDENCE``; its width says how large a difference the pairs
            leave possible, whatever ``p`` is.
    """

    n: int
    diff: float | None
    t: float | None
    p: float | None
    note: str
    ci_low: float | None = None
    ci_high: float | None = None

    def text(self) -> str:
        """``"0.034 (n=3)"`` or ``"n/a (n=1)"``; the note says why a p-value is missing."""
        if self.p is None:
            return f"n/a (n={self.n}{'; ' + self.note if self.note and self.n >= 2 else ''})"
        return f"{self.p:.3g} (n={self.n})"


def paired_ttest(method: Sequence[float], baseline: Sequence[float]) -> PairedTest:
    """Two-sided paired t-test of ``method`` against ``baseline`` (Student, 1908), pairs in order,
    with the confidence interval of the mean difference (:attr:`PairedTest.ci_low`, ``ci_high``).

    The t statistic is computed here; the p-value and the interval need ``scipy.stats.t`` (``pip
    install 'fedaug[data]'``); without scipy, or with fewer than 2 pairs, or when every difference
    is the same up to rounding (zero variance), ``p`` and the interval are ``None`` and ``note``
    says why.

    Args:
        method, baseline: the metric of each seed, aligned (same seeds, same order).

    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(method) != len(baseline):
        raise ValueError(f"paired values differ in length: {len(method)} and {len(baseline)}")
    n = len(method)
    d = np.asarray(method, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if n == 0:
        return PairedTest(0, None, None, None, "no common seeds")
    diff = float(d.mean())
    if n < 2:
        return PairedTest(n, diff, None, None, "fewer than 2 pairs")
    sd = float(d.std(ddof=1))
    if sd <= 1e-12 * max(1.0, abs(diff)):  # equal up to rounding: t would be rounding noise
        return PairedTest(n, diff, None, None, "all differences equal")
    se = sd / math.sqrt(n)
    t = diff / se
    try:
        from scipy.stats import t as student_t
    except ImportError:
        return PairedTest(n, diff, t, None, "scipy is not installed (pip install 'fedaug[data]')")
    half = float(student_t.ppf((1 + CONFIDENCE) / 2, n - 1)) * se
    return PairedTest(n, diff, t, float(2 * student_t.sf(abs(t), n - 1)), "", diff - half, diff + half)


def interval_text(low: float | None, high: float | None, *, scale: float = 1.0, decimals: int = 2) -> str:
    """A confidence interval with signed bounds, times ``scale`` (``100``: fractions as points):
    ``"[-3.10, +8.72]"``, or ``"n/a"`` when it is undefined (:class:`PairedTest`).

    >>> interval_text(-0.031, 0.0872, scale=100)
    '[-3.10, +8.72]'
    """
    if low is None or high is None:
        return "n/a"
    return f"[{scale * low:+.{decimals}f}, {scale * high:+.{decimals}f}]"


def davies_bouldin(x: np.ndarray, labels: np.ndarray) -> float:
    """Davies-Bouldin score (Davies & Bouldin, 1979; FLea, KDD 2024, App. A): the mean over
    clusters of the largest ``(s_i + s_j) / ||c_i - c_j||``, with ``c`` the centroids and ``s`` the
    mean Euclidean distance of a cluster's points to its centroid. Lower means better separated.

    Args:
        x: ``(N, D)`` features.
        labels: ``(N,)`` cluster labels (any hashable values), at least 2 distinct.

    Returns:
        The score, >= 0 (0 when every cluster is a point or all centroids coincide, as in
        scikit-learn).

    Raises:
        ConfigError: fewer than 2 clusters, or ``x`` and ``labels`` differ in length.
    """
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    labels = np.asarray(labels)
    if len(labels) != len(x):
        raise ConfigError(f"davies_bouldin: {len(x)} points but {len(labels)} labels")
    names = np.unique(labels)
    if len(names) < 2:
        raise ConfigError(f"davies_bouldin needs at least 2 clusters, got {len(names)}")
    centroids = np.stack([x[labels == k].mean(axis=0) for k in names])
    spread = np.array([np.linalg.norm(x[labels == k] - c, axis=1).mean() for k, c in zip(names, centroids)])
    dist = np.linalg.norm(centroids[:, None] - centroids[None], axis=2)
    if np.allclose(spread, 0) or np.allclose(dist, 0):
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (spread[:, None] + spread[None]) / dist
    ratio[~np.isfinite(ratio)] = 0.0  # the diagonal and coinciding centroids
    return float(ratio.max(axis=1).mean())


def pca_2d(x: torch.Tensor) -> torch.Tensor:
    """Project ``(N, D)`` features on their first two principal components (exact SVD; each
    component's sign fixed so that its largest-magnitude loading is positive, so the result is
    deterministic).

    Returns:
        ``(N, 2)`` float32 coordinates (zero columns when ``D`` or the rank is below 2).
    """
    x = x.reshape(x.shape[0], -1).double()
    centred = x - x.mean(dim=0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    comps = vh[:2]
    signs = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))
    out = centred @ (comps * torch.where(signs == 0, 1.0, signs)).T
    if out.shape[1] < 2:
        out = torch.cat([out, out.new_zeros(out.shape[0], 2 - out.shape[1])], dim=1)
    return out.float()
