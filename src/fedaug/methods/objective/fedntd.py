"""FedNTD: distil the global model's knowledge of the not-true classes into the local model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.payload import Part
from fedaug.methods._common import detached, frozen_forward, hard_labels
from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, Component, State
from fedaug.methods.recipe import METHODS


def not_true_distillation(logits: Tensor, teacher: Tensor, y: Tensor, tau: float) -> Tensor:
    """``tau^2 KL(q~_g || q~_l)`` over the not-true classes (Lee et al., NeurIPS 2022,
    arXiv:2106.03097, Sec. 4), averaged over the batch.

    ``q~`` is the softmax at temperature tau of the logits with the true class removed.

    Args:
        logits: local logits ``(B, K)`` (differentiable), K >= 2.
        teacher: global model logits ``(B, K)`` (detached).
        y: true classes ``(B,)`` int64.
        tau: temperature (> 0).
    """
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y[:, None], False)
    b, k = logits.shape
    local = F.log_softmax(logits[keep].view(b, k - 1) / tau, dim=1)
    glob = F.log_softmax(teacher[keep].view(b, k - 1) / tau, dim=1)
    return tau**2 * F.kl_div(local, glob, log_target=True, reduction="batchmean")


@METHODS.register("fedntd", "FedNTD (Lee et al. 2022): not-true distillation from the global model (beta, tau)")
class FedNTD(Component):
    """FedNTD (Lee et al., NeurIPS 2022, arXiv:2106.03097, Sec. 4).

    Local objective: ``CE + beta * L_NTD`` with :func:`not_true_distillation` against the received
    global model, evaluated frozen (eval mode, no gradient, no model copy). Soft targets (mixing
    augmentations) use their argmax as the true class.

    Args:
        beta: weight of the distillation term (>= 0, default 1; 0 is FedAvg, warned).
        tau: temperature (> 0, default 1).

    >>> fedntd = FedNTD(beta=1.0, tau=1.0)
    """

    name = "fedntd"
    role = "objective"
    needs_global_model = True

    def __init__(self, *, beta: float = 1.0, tau: float = 1.0) -> None:
        check_range("fedntd.beta", beta, lo=0.0)
        check_range("fedntd.tau", tau, lo=0.0, lo_open=True)
        if beta == 0:
            warn_like_fedavg("fedntd.beta=0", "FedNTD")
        self.beta, self.tau = beta, tau

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._global = detached(ctx.model.state_dict())

    def loss_terms(self, ctx: ClientCtx, batch: Batch, out: Tensor) -> dict[str, Tensor]:
        _, teacher = frozen_forward(ctx.model, self._global, batch.x)
        return {"ntd": self.beta * not_true_distillation(out, teacher, hard_labels(batch.y), self.tau)}
