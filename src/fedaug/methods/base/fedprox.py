"""FedProx: FedAvg with a proximal term that keeps local weights near the global ones."""

from __future__ import annotations

from torch import Tensor

from fedaug.core.payload import Part
from fedaug.methods.base._common import check_range, detached, squared_distance, trainable, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, State
from fedaug.methods.fedavg import FedAvg
from fedaug.methods.recipe import METHODS


@METHODS.register("fedprox", "FedProx (Li et al. 2020): FedAvg + proximal term mu/2 ||w - w_global||^2")
class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020, arXiv:1812.06127, Eq. 2).

    Client k minimises ``h_k(w) = F_k(w) + mu/2 ||w - w^t||^2`` over its trainable parameters, with
    ``w^t`` the global weights it received (the squared norm of the paper; the FedFA authors' code
    uses the non-squared one). The server is FedAvg's.

    Args:
        mu: proximal coefficient (>= 0; 0 is FedAvg, with a warning).
        weighting, bn: as :class:`~fedaug.methods.fedavg.FedAvg`.

    >>> prox = FedProx(mu=0.01)
    """

    name = "fedprox"

    def __init__(self, *, mu: float = 0.01, weighting: str = "samples", bn: str = "average") -> None:
        super().__init__(weighting=weighting, bn=bn)
        check_range("fedprox.mu", mu, lo=0.0)
        if mu == 0:
            warn_like_fedavg("fedprox.mu=0", "FedProx")
        self.mu = mu

    def round_start(self, ctx: ClientCtx, part: Part, state: State) -> None:
        super().round_start(ctx, part, state)
        self._anchor = detached(trainable(ctx.model))

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        return {"prox": self.mu / 2 * squared_distance(trainable(ctx.model), self._anchor)}
