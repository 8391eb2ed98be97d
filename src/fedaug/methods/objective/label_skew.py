"""Label-skew losses: FedLC (logit calibration) and FedRS (restricted softmax) replace the task loss
with one that knows the client's label counts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.core.payload import Part
from fedaug.methods._common import label_counts
from fedaug.methods.options import check_range, warn_like_fedavg
from fedaug.methods.component import Batch, ClientCtx, Component, State
from fedaug.methods.recipe import METHODS


def calibrated_logits(logits: Tensor, counts: Tensor, tau: float) -> Tensor:
    """FedLC's calibration (Zhang et al., ICML 2022, arXiv:2209.00189, Sec. 4, calibrated cross-entropy):
    ``logits_j - tau * n_j^(-1/4)``.

    Args:
        logits: ``(B, K)``.
        counts: the client's samples per class n_j ``(K,)``; a class with n_j = 0 gets -inf
            (the formula's limit: it leaves the softmax).
        tau: calibration strength (>= 0).
    """
    shift = torch.where(counts > 0, tau * counts.clamp_min(1).pow(-0.25), torch.full_like(counts, float("inf")))
    return logits - shift


def restricted_logits(logits: Tensor, counts: Tensor, alpha: float) -> Tensor:
    """FedRS's restricted softmax (Li & Zhan, KDD 2021, Sec. 4): the logits of classes the
    client has no samples of are scaled by alpha.

    Args:
        logits: ``(B, K)``.
        counts: the client's samples per class ``(K,)``.
        alpha: scale of the missing classes' logits, in [0, 1].
    """
    return logits * torch.where(counts > 0, 1.0, alpha)


class _LabelAware(Component):
    """A local objective whose task loss depends on the client's training label counts."""

    role = "objective"

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        self._counts = label_counts(ctx, self.name)


@METHODS.register("fedlc", "FedLC (Zhang et al. 2022): logit calibration by local label counts (tau)")
class FedLC(_LabelAware):
    """FedLC (Zhang et al., ICML 2022, arXiv:2209.00189, Sec. 4).

    Replaces the task loss by cross-entropy of :func:`calibrated_logits`, with n_j the client's
    training label counts; classes the client lacks leave its softmax. Evaluation uses the raw
    logits. Classification only.

    Args:
        tau: calibration strength (>= 0, default 1; 0 is FedAvg, warned).

    Raises:
        ConfigError: (in training) a soft target puts mass on a class the client has no samples of
            (its calibrated logit is -inf).

    >>> fedlc = FedLC(tau=1.0)
    """

    name = "fedlc"

    def __init__(self, *, tau: float = 1.0) -> None:
        check_range("fedlc.tau", tau, lo=0.0)
        if tau == 0:
            warn_like_fedavg("fedlc.tau=0", "FedLC")
        self.tau = tau

    def task_loss(self, ctx: ClientCtx, out: Tensor, batch: Batch) -> Tensor:
        logp = F.log_softmax(calibrated_logits(out, self._counts, self.tau), dim=1)
        if batch.y.dim() == 1:
            return F.nll_loss(logp, batch.y)
        absent = self._counts == 0
        if bool((batch.y[:, absent] > 0).any()):
            raise ConfigError(
                f"fedlc: a soft target puts mass on a class client {ctx.client_id} has no samples of, whose "
                "calibrated logit is -inf; use an augmentation that keeps targets within the client's classes"
            )
        return -(batch.y * logp.masked_fill(absent, 0.0)).sum(1).mean()


@METHODS.register("fedrs", "FedRS (Li & Zhan 2021): restricted softmax, missing classes' logits x alpha")
class FedRS(_LabelAware):
    """FedRS (Li & Zhan, KDD 2021, doi:10.1145/3447548.3467254, Sec. 4).

    Replaces the task loss by the task's cross-entropy of :func:`restricted_logits`: the logits of
    classes absent from the client's training split are scaled by alpha (the bias too; the paper's
    classifier has none). Evaluation uses the raw logits. Classification only.

    Args:
        alpha: scale of missing classes' logits in [0, 1] (default 0.5; 1 is FedAvg, warned).

    >>> fedrs = FedRS(alpha=0.5)
    """

    name = "fedrs"

    def __init__(self, *, alpha: float = 0.5) -> None:
        check_range("fedrs.alpha", alpha, lo=0.0, hi=1.0)
        if alpha == 1:
            warn_like_fedavg("fedrs.alpha=1", "FedRS")
        self.alpha = alpha

    def task_loss(self, ctx: ClientCtx, out: Tensor, batch: Batch) -> Tensor:
        return ctx.task.loss(restricted_logits(out, self._counts, self.alpha), batch.y)
