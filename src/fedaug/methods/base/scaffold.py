"""SCAFFOLD: control variates correct each client's drift towards its own optimum."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError, FedaugError
from fedaug.core.payload import Part, Spec, TensorSpec
from fedaug.methods._common import client_weights, detached, normalizing_norm, sgd_momentum
from fedaug.models.walk import trainable
from fedaug.methods.options import check_range
from fedaug.methods.component import ClientCtx, Phase, State, Uplink
from fedaug.methods.base.fedavg import BnPolicy, FedAvg, Weighting
from fedaug.methods.recipe import METHODS

CONTROL = "c/"  #: downlink key prefix of the server control variate c
DELTA = "dc/"  #: uplink key prefix of the client's control-variate change Delta c_i


@METHODS.register("scaffold", "SCAFFOLD (Karimireddy et al. 2020): drift correction with control variates")
class SCAFFOLD(FedAvg):
    """SCAFFOLD (Karimireddy et al., ICML 2020, arXiv:1910.06378, Algorithm 1, option II).

    Client i, with server variate ``c`` and its own ``c_i`` (per-client state, 0 at first):
    every local step uses the gradient ``g(y) - c_i + c`` (line 10); after K steps of learning
    rate eta_l, ``c_i+ = c_i - c + (x - y) / (K eta_l)`` (line 12, option II) and it uploads its
    weights y and ``Delta c_i = c_i+ - c_i``. Server (lines 16-17):
    ``x <- x + server_lr * sum_i p_i (y_i - x)`` and ``c <- c + (1/N) sum_{i in S} Delta c_i``
    with N the number of clients. Control variates exist for trainable parameters; buffers take
    FedAvg's average. K is the round's number of optimiser steps.

    Option II reads ``(x - y) / (K eta_l)`` as the round's average gradient, which holds for plain
    SGD. With SGD momentum rho the K steps move the weights about ``a = sum_k (1 - rho^k) / (1 - rho)``
    learning-rate-sized steps (up to ``K / (1 - rho)``, 10 K at rho = 0.9), so fedaug divides by
    ``a eta_l`` (:func:`~fedaug.methods._common.normalizing_norm`, FedNova's ``||a_i||_1``;
    ``a = K`` without momentum, the paper's update). Dividing by ``K eta_l`` under momentum inflates
    every variate by up to ``1 / (1 - rho)`` and the corrected steps diverge (seen on Digits-4 at
    rho = 0.9: NaN BatchNorm statistics by round 14). ``momentum_aware=False`` divides by ``K eta_l``
    whatever the momentum, the paper's formula as written, for comparison with code that does.

    Args:
        server_lr: global step size eta_g (> 0, default 1).
        momentum_aware: divide by ``a eta_l`` (default) or by ``K eta_l``.
        weighting: the p_i of the server's step: ``"samples"`` (default, by training-set size) or
            ``"uniform"`` (the paper).
        bn: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    Raises:
        ConfigError: (in training) the local optimiser is not SGD (option II assumes SGD steps).

    >>> scaffold = SCAFFOLD()
    """

    name = "scaffold"
    pack_free: ClassVar[frozenset[str]] = FedAvg.pack_free | {"server_lr", "momentum_aware"}  # server, reply

    def __init__(self, *, server_lr: float = 1.0, momentum_aware: bool = True, weighting: Weighting = "samples",
                 bn: BnPolicy = "average") -> None:
        super().__init__(weighting=weighting, bn=bn)
        check_range("scaffold.server_lr", server_lr, lo=0.0, lo_open=True)
        self.server_lr = server_lr
        if not isinstance(momentum_aware, bool):
            raise ConfigError(f"scaffold.momentum_aware must be true or false, got {momentum_aware!r}")
        self.momentum_aware = momentum_aware

    # --- client side -----------------------------------------------------------------------
    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        super().receive(ctx, part, state)
        if not ctx.training:
            return
        params = trainable(ctx.model)
        self._x = detached(params)
        self._c = {k: part[CONTROL + k] for k in params}
        self._ci = state.get("control") or {k: torch.zeros_like(p) for k, p in self._x.items()}
        self._correction = {k: self._c[k] - self._ci[k] for k in params}
        self._momentum = sgd_momentum(ctx, "scaffold's option-II control variates assume SGD steps")

    def group_capture(self, ctx: ClientCtx) -> State:
        """This client's global weights x, variates c and c_i, and its gradient correction ``c - c_i``."""
        return {**super().group_capture(ctx), "x": self._x, "c": self._c, "ci": self._ci,
                "correction": self._correction}

    def group_before_step(self, grads: Mapping[str, Tensor], captured: State,
                          optimizer: torch.optim.Optimizer) -> None:
        """Line 10: the gradient plus ``c - c_i`` (each client's, on a group's stacked gradients)."""
        for k, corr in captured["correction"].items():
            if k in grads:
                grads[k].add_(corr)

    def group_restore(self, ctx: ClientCtx, captured: State) -> None:
        super().group_restore(ctx, captured)
        self._x, self._c, self._ci = captured["x"], captured["c"], captured["ci"]

    def reply(self, ctx: ClientCtx) -> tuple[Part, State]:
        part, state = super().reply(ctx)
        if not ctx.training:
            return part, state
        y = trainable(ctx.model)
        momentum = self._momentum if self.momentum_aware else 0.0
        scale = 1.0 / (normalizing_norm(ctx.num_steps, momentum) * ctx.lr)
        ci_new = {k: self._ci[k] - self._c[k] + scale * (self._x[k] - y[k].detach()) for k in self._x}
        part.update({DELTA + k: ci_new[k] - self._ci[k] for k in self._x})
        return part, {**state, "control": ci_new}

    # --- server side -----------------------------------------------------------------------
    def init_server(self, model: nn.Module, num_clients: int) -> State:
        if num_clients < 1:
            raise FedaugError(f"scaffold needs the number of clients (>= 1), got {num_clients}")
        server = super().init_server(model, num_clients)
        return {**server, "num_clients": num_clients,
                "control": {k: torch.zeros_like(p.detach()) for k, p in trainable(model).items()}}

    def downlink(self, server: State, client_id: int, phase: Phase = "train") -> Part:
        part = super().downlink(server, client_id, phase)
        return {**part, **{CONTROL + k: v for k, v in server["control"].items()}} if phase == "train" else part

    def downlink_spec(self, model: nn.Module, phase: Phase = "train") -> Spec:
        spec = super().downlink_spec(model, phase)
        return {**spec, **{CONTROL + k: TensorSpec.like(p) for k, p in trainable(model).items()}} if phase == "train" else spec

    def uplink_spec(self, server: State, phase: Phase = "train") -> Spec:
        spec = super().uplink_spec(server, phase)
        return {**spec, **{DELTA + k: TensorSpec.like(v, kind="control") for k, v in server["control"].items()}} if phase == "train" else spec

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        weights = dict(super().aggregate(server, uplinks)["weights"])  # buffers: FedAvg's average
        p = client_weights(uplinks, self.weighting)
        control = {}
        for k, c in server["control"].items():
            x = server["weights"][k]
            weights[k] = x + self.server_lr * sum(pi * (u.part[k] - x) for pi, u in zip(p, uplinks))
            control[k] = c + sum(u.part[DELTA + k] for u in uplinks) / server["num_clients"]
        return {**server, "weights": weights, "control": control}
