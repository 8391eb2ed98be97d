"""FedDecorr: penalise correlated representation dimensions (against dimensional collapse)."""

from __future__ import annotations

from torch import Tensor, nn

from fedaug.methods._common import feature_tap
from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, Component
from fedaug.methods.recipe import METHODS


def decorrelation_loss(z: Tensor, eps: float = 1e-8) -> Tensor:
    """``||K||_F^2 / D^2`` with K the ``(D, D)`` correlation matrix of the batch's representations
    (Shi et al., ICLR 2023, arXiv:2210.00226, Sec. 4).

    Args:
        z: representations ``(B, D)``, B >= 2 (differentiable).
        eps: added to each dimension's (biased) batch variance before standardising.
    """
    zs = (z - z.mean(0)) / (z.var(0, unbiased=False) + eps).sqrt()
    corr = zs.T @ zs / z.shape[0]
    return corr.pow(2).sum() / z.shape[1] ** 2


@METHODS.register("feddecorr", "FedDecorr (Shi et al. 2023): decorrelation loss on the representation (beta)")
class FedDecorr(Component):
    """FedDecorr (Shi et al., ICLR 2023, arXiv:2210.00226): adds ``beta * decorrelation_loss(z)``
    (:func:`decorrelation_loss`) on z = the input of the classifier head, to the local loss of any
    server rule. A local objective: ``base=fedavg, augs=[fedprox, feddecorr]`` is FedProx + FedDecorr,
    as in the paper's experiments. Nothing is communicated.

    Args:
        beta: weight of the loss (>= 0, default 0.1; 0 does nothing, warned).

    >>> decorr = FedDecorr(beta=0.1)
    """

    name = "feddecorr"
    role = "objective"

    def __init__(self, *, beta: float = 0.1) -> None:
        check_range("feddecorr.beta", beta, lo=0.0)
        if beta == 0:
            warn_like_fedavg("feddecorr.beta=0", "FedDecorr", "leaving it out")
        self.beta = beta

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        feature_tap(model)

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        z = feature_tap(ctx.model).features
        if z.shape[0] < 2:
            return {}
        return {"decorr": self.beta * decorrelation_loss(z)}
