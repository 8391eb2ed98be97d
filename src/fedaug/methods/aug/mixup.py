"""Local mixup of inputs (Zhang et al., ICLR 2018, arXiv:1710.09412, Eq. 1) and of hidden features
(Manifold Mixup, Verma et al., ICML 2019, arXiv:1806.05236, Sec. 2). No federation information.

Per batch: ``lam ~ Beta(alpha, alpha)``, a random permutation ``perm`` of the batch, then
``x~ = lam x + (1 - lam) x[perm]`` (at the input or at a hidden stage) and soft labels
``y~ = lam y + (1 - lam) y[perm]`` ``(B, K)``, trained with the default cross-entropy (soft targets).
Classification only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError
from fedaug.layers.mixing import mix, sample_beta, soft_labels
from fedaug.methods.options import check_range, require_classification
from fedaug.methods.component import Batch, ClientCtx, Component
from fedaug.methods.recipe import METHODS
from fedaug.models.split import forward_back, forward_front, split_stages

#: the pseudo-stage of Manifold Mixup that mixes the inputs themselves (the paper's layer 0).
INPUT = "input"


def _check_alpha(name: str, alpha: float) -> float:
    check_range(f"{name}.alpha", alpha, lo=0.0, lo_open=True)
    return float(alpha)


def mixup_pairs(ctx: ClientCtx, batch_size: int, alpha: float, purpose: str) -> tuple[Tensor, Tensor]:
    """One batch's ``perm (B,)`` int64 and ``lam`` (0-d float32) from ``ctx.rng(purpose)``."""
    g = ctx.rng(purpose)
    perm = torch.randperm(batch_size, generator=g, device=g.device)
    return perm, sample_beta(alpha, 1, g)[0]


def mix_batch_labels(ctx: ClientCtx, y: Tensor, perm: Tensor, lam: Tensor) -> Tensor:
    """Soft labels ``(B, K)``: ``lam y + (1 - lam) y[perm]`` (each row sums to 1)."""
    soft = soft_labels(y, ctx.task.num_classes)
    return mix(soft, soft[perm], lam.to(soft))


@METHODS.register("mixup", "Mixup (Zhang et al. 2018): convex combinations of input pairs and their labels")
class Mixup(Component):
    """Input mixup within the client's batch.

    Args:
        alpha: Beta concentration (0.2 for ImageNet and 1.0 for CIFAR-10 in the paper).

    >>> mixup = Mixup(alpha=0.2)
    """

    name = "mixup"

    def __init__(self, *, alpha: float = 0.2) -> None:
        self.alpha = _check_alpha(self.name, alpha)

    def transform_batch(self, ctx: ClientCtx, batch: Batch) -> Batch:
        if not ctx.training:
            return batch
        require_classification(ctx, self.name)
        perm, lam = mixup_pairs(ctx, batch.x.shape[0], self.alpha, "mix")
        return Batch(mix(batch.x, batch.x[perm], lam.to(batch.x)), mix_batch_labels(ctx, batch.y, perm, lam))


@METHODS.register("manifold_mixup", "Manifold Mixup (Verma et al. 2019): mixup of hidden features at a random stage")
class ManifoldMixup(Component):
    """Mixup at a stage drawn uniformly per batch from ``stages`` (replaces ``forward``, via the split API).

    Args:
        alpha: Beta concentration (2.0 in the paper's CIFAR experiments).
        stages: candidate stages: ``"input"`` and/or split stages of the model
            (:func:`~fedaug.models.split.split_stages`); default ``"input"`` plus the model's first
            two ``feature_stages`` (the paper mixes at the input or after the first two blocks).

    >>> mm = ManifoldMixup(alpha=2.0, stages=["input", "block1"])
    """

    name = "manifold_mixup"

    def __init__(self, *, alpha: float = 2.0, stages: Sequence[str] | None = None) -> None:
        self.alpha = _check_alpha(self.name, alpha)
        if stages is not None and (isinstance(stages, str) or not stages):
            raise ConfigError(f"manifold_mixup.stages must be a non-empty list of stage names, got {stages!r}")
        self.stages = None if stages is None else list(stages)

    def candidates(self, model: nn.Module) -> list[str]:
        """The stages to draw from, checked against ``model``."""
        names = self.stages or [INPUT, *getattr(model, "feature_stages", ())[:2]]
        allowed = split_stages(model)
        bad = [s for s in names if s != INPUT and s not in allowed]
        if bad:
            raise ConfigError(f"manifold_mixup.stages: {bad} are not stages of {type(model).__name__}; "
                              f"choose from {INPUT}, {', '.join(allowed)}")
        return names

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        self.candidates(model)

    def forward(self, ctx: ClientCtx, batch: Batch) -> tuple[Tensor, Batch]:
        require_classification(ctx, self.name)
        names = self.candidates(ctx.model)
        perm, lam = mixup_pairs(ctx, batch.x.shape[0], self.alpha, "mix")
        stage = names[int(torch.randint(len(names), (), generator=ctx.rng("stage"), device=ctx.device))]
        target = Batch(batch.x, mix_batch_labels(ctx, batch.y, perm, lam))
        if stage == INPUT:
            return ctx.model(mix(batch.x, batch.x[perm], lam.to(batch.x))), target
        h = forward_front(ctx.model, batch.x, stage)
        if not isinstance(h, Tensor):
            raise ConfigError(f"manifold_mixup: the features after '{stage}' are not a tensor "
                              f"({type(h).__name__}); choose a stage of a chain model")
        return forward_back(ctx.model, mix(h, h[perm], lam.to(h)), stage), target
