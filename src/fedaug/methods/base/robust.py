"""Byzantine-robust server rules: FedAvg's clients and protocol with a robust combination of the
clients' weights (coordinate-wise median and trimmed mean, Yin et al., ICML 2018,
arXiv:1803.01498; Krum and Multi-Krum, Blanchard et al., NeurIPS 2017). The maths is in
:mod:`fedaug.methods.robust`; docs/robustness.md compares them with Flower's strategies.

Each rule overrides :meth:`FedAvg.combine` only, so it keeps FedAvg's ``bn`` policy and its
update-norm clipping (``clip_norm``, ``clip_at``), and composes with every local objective and
augmentation. Floating entries are combined by the rule in float64 and cast back; integer buffers
(BatchNorm's ``num_batches_tracked``) take the maximum, as FedAvg does. DP noise
(``noise_multiplier``) is not offered: its calibration ``z C / m`` is the sensitivity of the mean,
which none of these rules has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from fedaug.core.errors import AggregationError, ConfigError
from fedaug.core.payload import Part
from fedaug.methods.base.fedavg import BnPolicy, ClipSite, FedAvg, Weighting, weighted_average
from fedaug.methods.options import check_range, range_problem
from fedaug.methods.recipe import METHODS
from fedaug.methods.robust import coordinate_median, krum_select, stack_clients, trimmed_mean


def _integer_entry(parts: Sequence[Part], key: str) -> torch.Tensor:
    """An integer entry as FedAvg aggregates it (the maximum over clients)."""
    return weighted_average([p[key] for p in parts], [1.0] * len(parts))


@METHODS.register("median", "Coordinate-wise median of the clients' weights (Yin et al. 2018)")
class Median(FedAvg):
    """Coordinate-wise median of the clients' weights (Yin et al. 2018, Def. 1; Flower's
    ``FedMedian``). Unweighted: every client counts once, whatever its number of samples.

    Args:
        bn, clip_norm, clip_at: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    >>> median = Median(clip_norm=10.0)
    """

    name = "median"

    def __init__(self, *, bn: BnPolicy = "average", clip_norm: float = 0.0, clip_at: ClipSite = "server") -> None:
        super().__init__(weighting="uniform", bn=bn, clip_norm=clip_norm, clip_at=clip_at)

    def combine(self, parts: Sequence[Part], weights: Sequence[float], keys: Sequence[str]) -> Part:
        return {k: coordinate_median([p[k] for p in parts]).to(parts[0][k].dtype)
                if parts[0][k].is_floating_point() else _integer_entry(parts, k) for k in keys}


@METHODS.register("trimmed_mean", "Coordinate-wise beta-trimmed mean of the clients' weights (Yin et al. 2018)")
class TrimmedMean(FedAvg):
    """Coordinate-wise beta-trimmed mean of the clients' weights (Yin et al. 2018, Def. 2; Flower's
    ``FedTrimmedAvg`` with ``beta = proportiontocut``): per coordinate the ``floor(beta M)`` largest
    and smallest values are dropped, the rest averaged without weights.

    Args:
        beta: fraction trimmed at each end, in [0, 0.5) (default 0.1; Flower's default 0.2). With
            ``floor(beta M) = 0`` (e.g. ``M < 10`` at 0.1) nothing is trimmed: the plain mean.
        bn, clip_norm, clip_at: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    >>> trimmed = TrimmedMean(beta=0.2)
    """

    name = "trimmed_mean"
    pack_free: ClassVar[frozenset[str]] = FedAvg.pack_free | {"beta"}  # the server's rule

    def __init__(self, *, beta: float = 0.1, bn: BnPolicy = "average", clip_norm: float = 0.0,
                 clip_at: ClipSite = "server") -> None:
        super().__init__(weighting="uniform", bn=bn, clip_norm=clip_norm, clip_at=clip_at)
        check_range(f"{self.name}.beta", beta, lo=0.0, hi=0.5, hi_open=True)
        self.beta = float(beta)

    def combine(self, parts: Sequence[Part], weights: Sequence[float], keys: Sequence[str]) -> Part:
        return {k: trimmed_mean([p[k] for p in parts], self.beta).to(parts[0][k].dtype)
                if parts[0][k].is_floating_point() else _integer_entry(parts, k) for k in keys}


@METHODS.register("krum", "Krum / Multi-Krum (Blanchard et al. 2017): the updates closest to their neighbours")
class Krum(FedAvg):
    """Krum (m = 1) and Multi-Krum (m > 1), Blanchard et al. 2017, Sec. 4-5; Flower's ``Krum``.

    Each client's score is the sum of squared L2 distances, over all floating shared entries
    together, to its ``M - f - 2`` nearest other clients; the ``m`` lowest-scoring clients' weights
    are averaged (m = 1: the single best client's weights). The rule needs ``M > 2f + 2`` accepted
    updates in every round: with fewer (e.g. after attackers' replies were rejected) it raises an
    :class:`~fedaug.core.errors.AggregationError`, and the server keeps the previous global model
    for that round and records why (docs/robustness.md).

    Args:
        f: the number of Byzantine clients assumed (>= 0; Flower's ``num_malicious_clients``,
            default 0 there too).
        m: the number of clients selected and averaged, 1 <= m <= M - f (Flower's
            ``num_clients_to_keep``, with 0 there meaning Krum).
        weighting: how the m selected are averaged: ``"uniform"`` (the paper) or ``"samples"``
            (by training-set size, as Flower's Multi-Krum).
        bn, clip_norm, clip_at: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    >>> multi_krum = Krum(f=1, m=3)
    """

    name = "krum"
    pack_free: ClassVar[frozenset[str]] = FedAvg.pack_free | {"f", "m"}  # the server's rule

    def __init__(self, *, f: int = 0, m: int = 1, weighting: Weighting = "uniform", bn: BnPolicy = "average",
                 clip_norm: float = 0.0, clip_at: ClipSite = "server") -> None:
        super().__init__(weighting=weighting, bn=bn, clip_norm=clip_norm, clip_at=clip_at)
        problems = [p for p in (range_problem(f"{self.name}.f", f, lo=0, integer=True),
                                range_problem(f"{self.name}.m", m, lo=1, integer=True)) if p]
        if problems:
            raise ConfigError("; ".join(problems))
        self.f, self.m = int(f), int(m)

    def combine(self, parts: Sequence[Part], weights: Sequence[float], keys: Sequence[str]) -> Part:
        num = len(parts)
        if num <= 2 * self.f + 2 or self.m > num - self.f:
            raise AggregationError(
                f"krum.f={self.f}, krum.m={self.m} need at least {max(2 * self.f + 3, self.m + self.f)} accepted "
                f"updates per round (M > 2f + 2 and m <= M - f, Blanchard et al. 2017), got {num}: lower krum.f "
                f"or krum.m, or sample more clients and set train.min_clients to at least that")
        floating = [k for k in keys if parts[0][k].is_floating_point()]
        flat = stack_clients([torch.cat([p[k].reshape(-1).double() for k in floating]) for p in parts])
        chosen = krum_select(flat, self.f, self.m)
        return {k: weighted_average([parts[i][k] for i in chosen], [weights[i] for i in chosen])
                if k in floating else _integer_entry(parts, k) for k in keys}

