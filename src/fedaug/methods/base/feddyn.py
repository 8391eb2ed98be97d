"""FedDyn: a dynamic regulariser aligns each client's stationary point with the global one."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedaug.core.errors import FedaugError
from fedaug.core.payload import Part
from fedaug.methods._common import detached, squared_distance
from fedaug.models.walk import trainable
from fedaug.methods.options import check_range
from fedaug.methods.component import Batch, ClientCtx, Phase, State, Uplink
from fedaug.methods.base.fedavg import BnPolicy, FedAvg, Weighting
from fedaug.methods.recipe import METHODS


@METHODS.register("feddyn", "FedDyn (Acar et al. 2021): dynamic linear + quadratic regulariser (alpha)")
class FedDyn(FedAvg):
    """FedDyn (Acar et al., ICLR 2021, arXiv:2111.04263, Algorithm 1).

    Client k, with the global weights theta^{t-1} and its state g_k (the gradient of its last
    local objective, 0 at first), minimises
    ``L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2`` (the loss term ``dyn``), then
    ``g_k <- g_k - alpha (theta_k^t - theta^{t-1})`` (per-client state, the size of the model's
    trainable parameters). Server: ``h <- h - alpha/N sum_{k in P} (theta_k^t - theta^{t-1})`` with N
    the number of clients, ``theta^t = avg_{k in P} theta_k^t - h / alpha``. Buffers take
    FedAvg's average.

    Args:
        alpha: regularisation strength (> 0, default 0.01).
        weighting: ``"samples"`` (FedAvg's default: by training-set size) or ``"uniform"``
            (the paper's average).
        bn: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    >>> feddyn = FedDyn(alpha=0.01)
    """

    name = "feddyn"

    def __init__(self, *, alpha: float = 0.01, weighting: Weighting = "samples", bn: BnPolicy = "average") -> None:
        super().__init__(weighting=weighting, bn=bn)
        check_range("feddyn.alpha", alpha, lo=0.0, lo_open=True)
        self.alpha = alpha

    # --- client side -----------------------------------------------------------------------
    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        super().receive(ctx, part, state)
        if not ctx.training:
            return
        self._anchor = detached(trainable(ctx.model))
        self._grad = state.get("grad") or {k: torch.zeros_like(v) for k, v in self._anchor.items()}

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        params = trainable(ctx.model)
        linear = sum((self._grad[k] * params[k]).sum() for k in self._anchor)
        return {"dyn": self.alpha / 2 * squared_distance(params, self._anchor) - linear}

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        part, state = super().reply(ctx)
        if not ctx.training:
            return part, state
        params = trainable(ctx.model)
        grad = {k: self._grad[k] - self.alpha * (params[k].detach() - self._anchor[k]) for k in self._anchor}
        return part, {**state, "grad": grad}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        if num_clients < 1:
            raise FedaugError(f"feddyn needs the number of clients (>= 1), got {num_clients}")
        server = super().init_server(model, num_clients)
        return {**server, "num_clients": num_clients,
                "h": {k: torch.zeros_like(p.detach()) for k, p in trainable(model).items()}}

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        weights = dict(super().aggregate(server, uplinks)["weights"])
        h = {}
        for k, hk in server["h"].items():
            x = server["weights"][k]
            h[k] = hk - self.alpha / server["num_clients"] * sum(u.part[k] - x for u in uplinks)
            weights[k] = weights[k] - h[k] / self.alpha
        return {**server, "weights": weights, "h": h}
