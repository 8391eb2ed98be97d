"""FedDecorr: penalise correlated representation dimensions (against dimensional collapse)."""

from __future__ import annotations

from typing import Literal, get_args

from torch import Tensor, nn

from fedaug.core.errors import ConfigError
from fedaug.methods._common import feature_tap
from fedaug.methods.options import check_choice, check_range, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, Component
from fedaug.methods.recipe import METHODS

#: how :func:`decorrelation_loss` normalises the correlation matrix
Normalization = Literal["paper", "official"]
NORMALIZATIONS: tuple[str, ...] = get_args(Normalization)


def decorrelation_loss(z: Tensor, eps: float = 1e-8, normalization: str = "paper") -> Tensor:
    """The decorrelation loss of a batch's representations (Shi et al., ICLR 2023, arXiv:2210.00226,
    Sec. 4).

    ``"paper"``: ``||K||_F^2 / D^2`` with ``K`` the ``(D, D)`` correlation matrix of the batch (the
    paper's loss; the biased batch variance, ``eps`` added to it). ``"official"``: as the authors'
    public code normalises it: each dimension standardised with its unbiased batch variance (plus
    ``eps``), ``M = z_s^T z_s`` (``(D, D)``, about ``(B - 1) K``), and the loss is the mean of the
    squared *off-diagonal* entries of ``M``, divided by ``B``:
    ``sum_{i != j} M_ij^2 / (D (D - 1) B)``, about ``(B - 1)^2 / B * D / (D - 1)`` times the
    paper's loss less its constant diagonal part ``1 / D``. The gradients point the same way; the
    official one is about ``B`` times larger, so ``beta`` means ``B`` times more there.

    Args:
        z: representations ``(B, D)``, B >= 2, D >= 2 for ``"official"`` (differentiable).
        eps: added to each dimension's batch variance before standardising.
        normalization: ``"paper"`` or ``"official"``.

    Returns:
        A 0-d tensor; differentiable w.r.t. ``z``.
    """
    b, d = z.shape
    if normalization == "paper":
        zs = (z - z.mean(0)) / (z.var(0, unbiased=False) + eps).sqrt()
        return (zs.T @ zs / b).pow(2).sum() / d**2
    if normalization == "official":
        if d < 2:
            raise ConfigError(f"feddecorr.normalization='official' averages over the D(D-1) off-diagonal "
                              f"correlations and needs a representation of D >= 2 features, got D={d}; "
                              "use normalization='paper'")
        zs = (z - z.mean(0)) / (z.var(0, unbiased=True) + eps).sqrt()
        m = zs.T @ zs
        return (m.pow(2).sum() - m.diagonal().pow(2).sum()) / (d * (d - 1) * b)
    raise ValueError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {normalization!r}")


@METHODS.register("feddecorr", "FedDecorr (Shi et al. 2023): decorrelation loss on the representation (beta)")
class FedDecorr(Component):
    """FedDecorr (Shi et al., ICLR 2023, arXiv:2210.00226): adds ``beta * decorrelation_loss(z)``
    (:func:`decorrelation_loss`) on z = the input of the classifier head, to the local loss of any
    server rule. A local objective: ``base=fedavg, augs=[fedprox, feddecorr]`` is FedProx + FedDecorr,
    as in the paper's experiments. Nothing is communicated.

    Args:
        beta: weight of the loss (>= 0, default 0.1; 0 does nothing, warned).
        normalization: ``"paper"`` (default, ``||K||_F^2 / D^2``) or ``"official"`` (the authors'
            public code: off-diagonal mean of the unnormalised correlation, divided by the batch
            size once; about ``B`` times stronger for the same ``beta``, see
            :func:`decorrelation_loss`). Needs a representation of ``D >= 2`` dimensions.

    >>> decorr = FedDecorr(beta=0.1, normalization="official")
    """

    name = "feddecorr"
    role = "objective"

    def __init__(self, *, beta: float = 0.1, normalization: Normalization = "paper") -> None:
        check_range("feddecorr.beta", beta, lo=0.0)
        if beta == 0:
            warn_like_fedavg("feddecorr.beta=0", "FedDecorr", "leaving it out")
        self.beta = beta
        self.normalization = check_choice(self.name, "normalization", normalization, NORMALIZATIONS)

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        feature_tap(model)

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        z = feature_tap(ctx.model).features
        if z.shape[0] < 2:
            return {}
        return {"decorr": self.beta * decorrelation_loss(z, normalization=self.normalization)}
