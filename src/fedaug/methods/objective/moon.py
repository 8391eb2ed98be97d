"""MOON: model-contrastive learning between the local, global and previous local representations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaug.core.payload import Part
from fedaug.methods._common import detached, feature_tap, frozen_forward
from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, Component, State
from fedaug.methods.recipe import METHODS


def model_contrastive_loss(z: Tensor, z_glob: Tensor, z_prev: Tensor, tau: float) -> Tensor:
    """MOON's loss (Li et al., CVPR 2021, arXiv:2103.16257, Eq. 3), averaged over the batch.

    ``-log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) )`` with
    cosine similarity ``sim``.

    Args:
        z: local representations ``(B, D)`` (differentiable).
        z_glob, z_prev: the global and previous local models' ``(B, D)`` (detached).
        tau: temperature (> 0).
    """
    pos = F.cosine_similarity(z, z_glob, dim=1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=1) / tau
    return F.cross_entropy(torch.stack([pos, neg], 1), torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


@METHODS.register("moon", "MOON (Li et al. 2021): model-contrastive loss on the representation (mu, tau)")
class MOON(Component):
    """MOON (Li, He & Song, CVPR 2021, arXiv:2103.16257, Eq. 3-4).

    Local objective: ``CE + mu * l_con`` with :func:`model_contrastive_loss` on the representation
    z = the input of the classifier head (the paper adds a projection head; fedaug uses the
    backbone's own features, so any zoo classifier works). The global model is the received one;
    the previous local model is the client's weights after its last round, kept in its per-client
    state (``"previous"``: one full ``state_dict`` per client). Both are evaluated frozen (eval mode,
    no gradient, with :func:`~torch.func.functional_call` on the worker model). In a client's first
    round there is no previous model and the term is omitted (with the global model standing in
    for it, the term would be the constant log 2).

    Args:
        mu: weight of the contrastive term (>= 0, default 1; the paper uses 1 or 5). 0 is FedAvg.
        tau: temperature (> 0, default 0.5).

    >>> moon = MOON(mu=1.0, tau=0.5)
    """

    name = "moon"
    role = "objective"
    needs_global_model = True

    def __init__(self, *, mu: float = 1.0, tau: float = 0.5) -> None:
        check_range("moon.mu", mu, lo=0.0)
        check_range("moon.tau", tau, lo=0.0, lo_open=True)
        if mu == 0:
            warn_like_fedavg("moon.mu=0", "MOON")
        self.mu, self.tau = mu, tau

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        feature_tap(model)

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._global = detached(ctx.model.state_dict())
        self._previous = state.get("previous")

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        if self._previous is None:
            return {}
        tap = feature_tap(ctx.model)
        z = tap.features
        z_glob, _ = frozen_forward(ctx.model, self._global, batch.x, tap)
        z_prev, _ = frozen_forward(ctx.model, self._previous, batch.x, tap)
        return {"con": self.mu * model_contrastive_loss(z, z_glob, z_prev, self.tau)}

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        return {}, {"previous": detached(ctx.model.state_dict())}
