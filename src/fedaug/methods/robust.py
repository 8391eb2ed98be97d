"""Robust aggregation as pure functions over the clients' tensors: coordinate-wise median and
trimmed mean (Yin et al., ICML 2018, arXiv:1803.01498, Def. 1-2), Krum and Multi-Krum (Blanchard
et al., NeurIPS 2017, Sec. 4-5), and the robust location and spread that FedFA, VFDA and FedRDN use
for their shared statistics (``stats_rule``; docs/robustness.md).

Every function takes M same-shaped client tensors, either as a sequence of M tensors of shape
``(*S)`` or as one stacked tensor ``(M, *S)`` (row k = client k), computes in float64 and returns
float64. None depends on the clients' order (DESIGN invariant 1) except through ties between equal
Krum scores, which go to the lower index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Literal, get_args

import torch
from torch import Tensor

#: the cross-client rules of shared statistics (``stats_rule``): the papers' mean, and two robust ones.
StatsRule = Literal["mean", "median", "trimmed_mean"]
STATS_RULES: tuple[str, ...] = get_args(StatsRule)
#: ``1 / Phi^-1(3/4)``: scales the median absolute deviation to the standard deviation of a normal.
MAD_TO_STD = 1.0 / NormalDist().inv_cdf(0.75)

Clients = Tensor | Sequence[Tensor]


def stack_clients(xs: Clients) -> Tensor:
    """The clients' tensors as one float64 tensor ``(M, *S)``.

    Raises:
        ValueError: no client, or tensors of different shapes.
    """
    if len(xs) == 0:
        raise ValueError("robust aggregation needs at least one client tensor, got none")
    return xs.to(torch.float64) if isinstance(xs, Tensor) else torch.stack([t.to(torch.float64) for t in xs])


def num_trimmed(num_clients: int, beta: float) -> int:
    """How many values the trimmed mean drops at each end: ``floor(beta * M)`` (Yin et al. 2018,
    Def. 2; ``scipy.stats.trim_mean``, Flower's ``aggregate_trimmed_avg``).

    ``beta < 0.5`` leaves at least one value: ``2 floor(beta M) < M``.

    Raises:
        ValueError: ``beta`` not in [0, 0.5).
    """
    if not 0.0 <= beta < 0.5:
        raise ValueError(f"the trimmed fraction beta must be in [0, 0.5), got {beta}")
    return math.floor(beta * num_clients)


def coordinate_median(xs: Clients) -> Tensor:
    """Coordinate-wise median ``med{x_k[j] : k = 1..M}`` (Yin et al. 2018, Def. 1, Option I);
    for even M the mean of the two middle values (``numpy.median``).

    Args:
        xs: M tensors ``(*S)`` or ``(M, *S)``.

    Returns:
        ``(*S)`` float64.
    """
    s = stack_clients(xs).sort(dim=0).values
    m = s.shape[0]
    return s[m // 2] if m % 2 else (s[m // 2 - 1] + s[m // 2]) / 2


def trimmed_mean(xs: Clients, beta: float) -> Tensor:
    """Coordinate-wise beta-trimmed mean (Yin et al. 2018, Def. 2, Option II): per coordinate, drop
    the ``floor(beta M)`` largest and smallest values and average the rest,
    ``1 / (M - 2b) * sum_{k in U_j} x_k[j]``, ``b = floor(beta M)``.

    Args:
        xs: M tensors ``(*S)`` or ``(M, *S)``.
        beta: the fraction trimmed at each end, in [0, 0.5).

    Returns:
        ``(*S)`` float64.

    Raises:
        ValueError: as :func:`num_trimmed`.
    """
    x = stack_clients(xs)
    cut = num_trimmed(x.shape[0], beta)
    return x.sort(dim=0).values[cut : x.shape[0] - cut].mean(0)


def krum_scores(xs: Clients, f: int) -> Tensor:
    """Krum's score of each client: ``s(k) = sum_{j in N_k} ||x_k - x_j||^2`` over the ``M - f - 2``
    clients closest to k (Blanchard et al. 2017, Sec. 4, the definition of Krum).

    Args:
        xs: M tensors (any same shape; flattened) or ``(M, *S)``.
        f: the number of Byzantine clients assumed, ``M > 2f + 2``.

    Returns:
        ``(M,)`` float64.

    Raises:
        ValueError: ``f < 0`` or ``M <= 2f + 2`` (Krum's resilience condition ``2f + 2 < M``).
    """
    x = stack_clients(xs)
    x = x.reshape(x.shape[0], -1)
    m = x.shape[0]
    if f < 0 or m <= 2 * f + 2:
        raise ValueError(f"Krum with f={f} Byzantine clients needs M > 2f + 2 = {2 * f + 2} updates "
                         f"(Blanchard et al. 2017), got M={m}")
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
    d.fill_diagonal_(float("inf"))  # a client is not its own neighbour
    return d.sort(dim=1).values[:, : m - f - 2].sum(1)


def krum_select(xs: Clients, f: int, m: int) -> list[int]:
    """The ``m`` clients of lowest Krum score, best first (m = 1: Krum; m > 1: Multi-Krum's
    selection, Blanchard et al. 2017, Sec. 5); equal scores go to the lower index.

    Args:
        xs: as :func:`krum_scores`.
        f: Byzantine clients assumed.
        m: clients selected, ``1 <= m <= M - f``.

    Raises:
        ValueError: as :func:`krum_scores`, or ``m`` out of range.
    """
    scores = krum_scores(xs, f)
    if not 1 <= m <= scores.shape[0] - f:
        raise ValueError(f"Multi-Krum selects 1 <= m <= M - f = {scores.shape[0] - f} updates, got m={m}")
    return scores.argsort(stable=True)[:m].tolist()


def robust_centre(x: Tensor, rule: str, beta: float = 0.1) -> Tensor:
    """The clients' per-channel centre under ``rule``: mean, :func:`coordinate_median` or
    :func:`trimmed_mean`.

    Args:
        x: ``(M, C)``, one statistic per client and channel.
        rule: one of :data:`STATS_RULES`.
        beta: the trimmed fraction (``"trimmed_mean"`` only).

    Returns:
        ``(C,)`` float64.
    """
    if rule == "mean":
        return stack_clients(x).mean(0)
    if rule == "median":
        return coordinate_median(x)
    if rule == "trimmed_mean":
        return trimmed_mean(x, beta)
    raise ValueError(f"rule must be one of {', '.join(STATS_RULES)}, got {rule!r}")


def robust_variance(x: Tensor, rule: str, beta: float = 0.1) -> Tensor:
    """The clients' per-channel spread under ``rule``, as a variance comparable to the mean rule's.

    * ``"mean"``: ``1/M sum_k (x_k - mean)^2`` (FedFA Eq. 5, VFDA Eq. 5).
    * ``"median"``: ``(1.4826 * MAD)^2``, ``MAD = med_k |x_k - med(x)|``; the constant
      ``1 / Phi^-1(3/4)`` makes it the variance for normal data (Hampel 1974; Rousseeuw & Croux 1993).
    * ``"trimmed_mean"``: the variance of the values the trimmed mean keeps (``M - 2b`` per
      channel, about the trimmed mean), divided by ``1 - 2 z phi(z) / (1 - 2a)``, the variance of a
      standard normal truncated to its central ``1 - 2a`` (``a = b / M``, ``z = Phi^-1(1 - a)``), so
      that it is the variance for normal data as well; with ``b = 0`` it is the mean rule's.

    Args:
        x: ``(M, C)``.
        rule: one of :data:`STATS_RULES`.
        beta: the trimmed fraction (``"trimmed_mean"`` only).

    Returns:
        ``(C,)`` float64, >= 0.
    """
    x = stack_clients(x)
    if rule == "mean":
        return x.var(0, correction=0)
    if rule == "median":
        return (MAD_TO_STD * coordinate_median((x - coordinate_median(x)).abs())).pow(2)
    if rule == "trimmed_mean":
        m = x.shape[0]
        cut = num_trimmed(m, beta)
        kept = x.sort(dim=0).values[cut : m - cut]
        var = kept.var(0, correction=0)
        if cut == 0:
            return var
        a = cut / m
        z = NormalDist().inv_cdf(1 - a)
        return var / (1 - 2 * z * NormalDist().pdf(z) / (1 - 2 * a))
    raise ValueError(f"rule must be one of {', '.join(STATS_RULES)}, got {rule!r}")


def clamp_to_robust_range(x: Tensor, rule: str, beta: float = 0.1, spreads: float = 3.0) -> Tensor:
    """Each client's values clamped per channel to ``centre +- spreads * sqrt(variance)`` of
    :func:`robust_centre` and :func:`robust_variance` (a Huber-type winsorisation; 3 spreads is the
    usual outlier cut-off, Leys et al. 2013). ``"mean"`` returns ``x`` unchanged.

    Args:
        x: ``(M, C)``; not modified.
        rule: one of :data:`STATS_RULES`.
        beta: the trimmed fraction (``"trimmed_mean"`` only).
        spreads: the half-width of the kept range, in robust standard deviations.

    Returns:
        ``(M, C)``, same dtype as ``x``.
    """
    if rule == "mean":
        return x
    centre, half = robust_centre(x, rule, beta), spreads * robust_variance(x, rule, beta).sqrt()
    return torch.clamp(x.to(torch.float64), centre - half, centre + half).to(x.dtype)
