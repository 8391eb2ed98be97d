"""FedSAM: sharpness-aware minimisation as the local step (a local objective)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import ClientCtx, Closure, Component
from fedaug.methods.recipe import METHODS


@METHODS.register("fedsam", "FedSAM (Qu et al. 2022): sharpness-aware local steps (rho)")
class FedSAM(Component):
    """FedSAM (Qu et al., ICML 2022, arXiv:2206.02618; Caldarola et al., ECCV 2022,
    arXiv:2203.11834): each local step is a SAM step (Foret et al., ICLR 2021, arXiv:2010.01412,
    Eq. 2-3).

    With g the gradient at w: ``eps = rho g / ||g||_2`` (over all trainable parameters), the
    gradient is re-evaluated at ``w + eps``, w is restored and the local optimiser steps with the
    second gradient. It replaces the ``step`` hook (the closure runs twice per step, so BatchNorm
    running statistics see each batch twice; loss terms are logged once).

    Args:
        rho: neighbourhood radius (>= 0, default 0.05; 0 is FedAvg, warned).

    >>> fedsam = FedSAM(rho=0.05)
    """

    name = "fedsam"
    role = "objective"

    def __init__(self, *, rho: float = 0.05) -> None:
        check_range("fedsam.rho", rho, lo=0.0)
        if rho == 0:
            warn_like_fedavg("fedsam.rho=0", "FedSAM")
        self.rho = rho

    def step(self, ctx: ClientCtx, optimizer: torch.optim.Optimizer, closure: Closure) -> Tensor:
        loss = closure()
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        scale = self.rho / (norm + 1e-12)
        with torch.no_grad():
            eps = [p.grad * scale for p in params]
            for p, e in zip(params, eps):
                p.add_(e)
        closure()
        with torch.no_grad():
            for p, e in zip(params, eps):
                p.sub_(e)
        optimizer.step()
        return loss
