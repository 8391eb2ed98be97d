"""FedProx: a proximal term that keeps local weights near the global ones (a local objective)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from fedaug.core.payload import Part
from fedaug.methods._common import detached, squared_distance
from fedaug.models.walk import trainable
from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, Component, State
from fedaug.methods.recipe import METHODS


@METHODS.register("fedprox", "FedProx (Li et al. 2020): proximal term mu/2 ||w - w_global||^2 in the local objective")
class FedProx(Component):
    """FedProx (Li et al., MLSys 2020, arXiv:1812.06127, Eq. 2).

    Client k minimises ``h_k(w) = F_k(w) + mu/2 ||w - w^t||^2`` over its trainable parameters, with
    ``w^t`` the global weights it received (the squared norm of the paper; the FedFA authors' code
    uses the non-squared one). A local objective: any server rule aggregates (``base = "fedprox"``
    in a config means FedAvg + FedProx, the paper's server).

    Args:
        mu: proximal coefficient (>= 0; 0 is FedAvg, with a warning).

    >>> prox = FedProx(mu=0.01)
    """

    name = "fedprox"
    role = "objective"
    needs_global_model = True

    def __init__(self, *, mu: float = 0.01) -> None:
        check_range("fedprox.mu", mu, lo=0.0)
        if mu == 0:
            warn_like_fedavg("fedprox.mu=0", "FedProx")
        self.mu = mu

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._anchor = detached(trainable(ctx.model))

    def group_blocker(self) -> str:
        return ""

    def group_capture(self, ctx: ClientCtx) -> State:
        return {"anchor": self._anchor}

    def group_loss_terms(self, params: Mapping[str, Tensor], captured: State, batch: Batch,
                         out: Tensor) -> dict[str, Tensor]:
        """The proximal term ``mu/2 ||w - w^t||^2`` over the client's trainable ``params`` (Eq. 2)."""
        return {"prox": self.mu / 2 * squared_distance(params, captured["anchor"])}
