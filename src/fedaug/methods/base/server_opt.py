"""Server optimisers: FedAvgM, FedAdam and FedYogi treat the averaged client update as a
pseudo-gradient and step the global weights with momentum or an adaptive rule.

All three keep FedAvg's clients and average (``weighting``, ``bn``); their optimiser acts on the
trainable parameters, while buffers (BatchNorm running statistics) take the plain average, since an
Adam step on a running variance could make it negative.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from fedaug.models.walk import trainable
from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import Phase, State, Uplink
from fedaug.methods.base.fedavg import BnPolicy, FedAvg, Weighting
from fedaug.methods.recipe import METHODS


class _ServerOptimizer(FedAvg, abc.ABC):
    """FedAvg whose server applies ``update`` to Delta = avg_k(w_k) - w (per trainable parameter)."""

    #: names of the per-parameter server buffers, each initialised by :meth:`initial_buffer`.
    buffers: tuple[str, ...] = ()

    def initial_buffer(self, buffer: str, param: Tensor) -> Tensor:
        return torch.zeros_like(param)

    def init_server(self, model: nn.Module, num_clients: int) -> State:
        server = super().init_server(model, num_clients)
        params = trainable(model)
        for b in self.buffers:
            server[b] = {k: self.initial_buffer(b, p.detach()) for k, p in params.items()}
        return server

    @abc.abstractmethod
    def update(self, server: State, key: str, delta: Tensor) -> Tensor:
        """Update this parameter's buffers in ``server`` in place; return the step added to w."""

    def aggregate(self, server: State, uplinks: Sequence[Uplink], phase: Phase = "train") -> State:
        new = dict(server)
        for b in self.buffers:
            new[b] = dict(server[b])
        avg = super().aggregate(server, uplinks)["weights"]
        weights = dict(avg)
        for key in server[self.buffers[0]]:
            w = server["weights"][key]
            weights[key] = w + self.update(new, key, avg[key] - w)
        new["weights"] = weights
        return new


@METHODS.register("fedavgm", "FedAvgM (Hsu et al. 2019): FedAvg with server momentum (0.9)")
class FedAvgM(_ServerOptimizer):
    """FedAvg with server momentum (Hsu et al. 2019, arXiv:1909.06335, Sec. 3).

    With Delta = sum_k p_k w_k - w (minus the paper's pseudo-gradient):
    ``v <- momentum * v + Delta``, ``w <- w + server_lr * v``.

    Args:
        momentum: server momentum beta in [0, 1) (paper default 0.9; the FedFA authors' code uses
            0.01). 0 with ``server_lr=1`` is FedAvg (warned).
        server_lr: server learning rate (> 0, default 1).
        weighting, bn: as :class:`~fedaug.methods.base.fedavg.FedAvg`.

    >>> fedavgm = FedAvgM(momentum=0.9)
    """

    name = "fedavgm"
    pack_free: ClassVar[frozenset[str]] = FedAvg.pack_free | {"momentum", "server_lr"}  # the server's step
    buffers = ("momentum",)

    def __init__(self, *, momentum: float = 0.9, server_lr: float = 1.0, weighting: Weighting = "samples",
                 bn: BnPolicy = "average") -> None:
        super().__init__(weighting=weighting, bn=bn)
        check_range("fedavgm.momentum", momentum, lo=0.0, hi=1.0, hi_open=True)
        check_range("fedavgm.server_lr", server_lr, lo=0.0, lo_open=True)
        if momentum == 0 and server_lr == 1:
            warn_like_fedavg("fedavgm.momentum=0 with server_lr=1", "FedAvgM")
        self.momentum, self.server_lr = momentum, server_lr

    def update(self, server: State, key: str, delta: Tensor) -> Tensor:
        v = self.momentum * server["momentum"][key] + delta
        server["momentum"][key] = v
        return self.server_lr * v


class _Adaptive(_ServerOptimizer):
    """Reddi et al. (ICLR 2021, arXiv:2003.00295), Algorithm 2, shared by FedAdam and FedYogi.

    ``m <- beta1 m + (1 - beta1) Delta``; ``v`` by :meth:`second_moment`;
    ``w <- w + server_lr * m / (sqrt(v) + tau)``; ``v`` starts at ``tau^2`` (the paper's
    ``v_{-1} >= tau^2``), no bias correction (as the paper).

    Args:
        server_lr: eta (default 0.01; the paper tunes it per task).
        beta1: the first moment's decay (default 0.9, the paper's).
        beta2: the second moment's decay (default 0.99, the paper's).
        tau: the adaptivity, added to ``sqrt(v)`` in the step and ``v``'s start ``tau^2`` (default
            1e-3, the paper's).
        weighting, bn: as :class:`~fedaug.methods.base.fedavg.FedAvg`.
    """

    buffers = ("m", "v")

    def __init__(self, *, server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, weighting: Weighting = "samples", bn: BnPolicy = "average") -> None:
        super().__init__(weighting=weighting, bn=bn)
        check_range(f"{self.name}.server_lr", server_lr, lo=0.0, lo_open=True)
        check_range(f"{self.name}.beta1", beta1, lo=0.0, hi=1.0, hi_open=True)
        check_range(f"{self.name}.beta2", beta2, lo=0.0, hi=1.0, hi_open=True)
        check_range(f"{self.name}.tau", tau, lo=0.0, lo_open=True)
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau

    def initial_buffer(self, buffer: str, param: Tensor) -> Tensor:
        return torch.full_like(param, self.tau**2) if buffer == "v" else torch.zeros_like(param)

    @abc.abstractmethod
    def second_moment(self, v: Tensor, delta2: Tensor) -> Tensor:
        """The new second-moment estimate from the old ``v`` and the squared pseudo-gradient."""

    def update(self, server: State, key: str, delta: Tensor) -> Tensor:
        m = self.beta1 * server["m"][key] + (1 - self.beta1) * delta
        v = self.second_moment(server["v"][key], delta * delta)
        server["m"][key], server["v"][key] = m, v
        return self.server_lr * m / (v.sqrt() + self.tau)


@METHODS.register("fedadam", "FedAdam (Reddi et al. 2021): Adam on the server's pseudo-gradient")
class FedAdam(_Adaptive):
    """FedAdam (Reddi et al., ICLR 2021, arXiv:2003.00295, Alg. 2): ``v <- beta2 v + (1 - beta2) Delta^2``.

    Its options are :class:`_Adaptive`'s: ``server_lr``, ``beta1``, ``beta2``, ``tau``, ``weighting``, ``bn``.

    >>> fedadam = FedAdam(server_lr=0.01)
    """

    name = "fedadam"
    pack_free: ClassVar[frozenset[str]] = FedAvg.pack_free | {"server_lr", "beta1", "beta2", "tau"}  # the server's

    def second_moment(self, v: Tensor, delta2: Tensor) -> Tensor:
        return self.beta2 * v + (1 - self.beta2) * delta2


@METHODS.register("fedyogi", "FedYogi (Reddi et al. 2021): Yogi on the server's pseudo-gradient")
class FedYogi(_Adaptive):
    """FedYogi (Reddi et al., ICLR 2021, arXiv:2003.00295, Alg. 2):
    ``v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)``.

    Its options are :class:`_Adaptive`'s: ``server_lr``, ``beta1``, ``beta2``, ``tau``, ``weighting``, ``bn``.

    >>> fedyogi = FedYogi()
    """

    name = "fedyogi"
    pack_free: ClassVar[frozenset[str]] = FedAvg.pack_free | {"server_lr", "beta1", "beta2", "tau"}  # the server's

    def second_moment(self, v: Tensor, delta2: Tensor) -> Tensor:
        return v - (1 - self.beta2) * delta2 * torch.sign(v - delta2)
