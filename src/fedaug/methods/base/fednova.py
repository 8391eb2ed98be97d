"""FedNova: average local updates normalised by each client's amount of local work."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.methods._common import client_weights, normalizing_norm, sgd_momentum
from fedaug.models.walk import trainable
from fedaug.methods.component import ClientCtx, Phase, State, Uplink
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import METHODS


@METHODS.register("fednova", "FedNova (Wang et al. 2020): updates normalised by the number of local steps")
class FedNova(FedAvg):
    """FedNova (Wang et al., NeurIPS 2020, arXiv:2007.07481, Sec. 4).

    Client i uploads its weights y_i and ``a_i = ||a_i||_1`` (:func:`normalizing_norm` of its
    number of optimiser steps tau_i and the SGD momentum). The server normalises each update,
    ``d_i = (y_i - x) / a_i``, and steps ``x <- x + tau_eff sum_i p_i d_i`` with
    ``tau_eff = sum_i p_i a_i``. With equal ``a_i`` (same number of steps everywhere, e.g.
    ``train.local_steps``) this is FedAvg. Buffers take FedAvg's average.

    Args:
        weighting: the p_i of the normalised average: ``"samples"`` (default, ``p_i = n_i / n``)
            or ``"uniform"``.
        bn: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    Raises:
        ConfigError: (in training) the local optimiser is not SGD.

    >>> fednova = FedNova()
    """

    name = "fednova"

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        super().receive(ctx, part, state)
        if ctx.training:
            self._momentum = sgd_momentum(ctx, "fednova normalises SGD updates")

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        part, state = super().reply(ctx)
        if not ctx.training:
            return part, state
        part["a_norm"] = torch.tensor(normalizing_norm(ctx.num_steps, self._momentum), device=ctx.device)
        return part, state

    def init_server(self, model: nn.Module, num_clients: int) -> State:
        return {**super().init_server(model, num_clients), "params": list(trainable(model))}

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        spec = super().uplink_spec(server, phase)
        return {**spec, "a_norm": TensorSpec((), torch.float32, kind="control")} if phase == "train" else spec

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        weights = dict(super().aggregate(server, uplinks)["weights"])  # buffers: FedAvg's average
        p = client_weights(uplinks, self.weighting)
        a = [float(u.part["a_norm"]) for u in uplinks]
        tau_eff = sum(pi * ai for pi, ai in zip(p, a))
        for k in server["params"]:
            x = server["weights"][k]
            weights[k] = x + tau_eff * sum(pi * (u.part[k] - x) / ai for pi, ai, u in zip(p, a, uplinks))
        return {**server, "weights": weights}
