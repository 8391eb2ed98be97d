"""MoEx (Li et al., CVPR 2021, arXiv:2002.11102): exchange the normalised moments of a feature map
between samples of the client's batch and interpolate the two labels. Local: no federation information."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError
from fedaug.layers.attach import AttachHandle, attach
from fedaug.layers.mixing import MOMENTS, Moments, MoExLayer, mix, soft_labels
from fedaug.methods.options import attach_points, check_choice, check_probability, check_range, require_classification
from fedaug.methods.component import Batch, ClientCtx, Component
from fedaug.methods.recipe import METHODS


@METHODS.register("moex", "MoEx (Li et al. 2021): exchange feature moments between samples, mix labels")
class MoEx(Component):
    """A :class:`~fedaug.layers.mixing.MoExLayer` after one module; replaces ``forward``.

    With probability ``p`` per batch: a random permutation ``perm``, the layer armed with it, and
    targets ``lam y + (1 - lam) y[perm]`` ``(B, K)`` (the paper's loss
    ``lam l(y) + (1 - lam) l(y[perm])``, equal for cross-entropy). Identity at evaluation.

    Args:
        p: probability of exchanging moments in a batch.
        lam: weight of the sample's own label (paper 0.9).
        at: module name to attach after; default the model's first ``feature_stages`` entry
            (the paper exchanges moments after an early layer).
        moments: ``"pono"`` (the paper's positional normalisation) or ``"instance"``.
        eps: added to the variance.

    >>> moex = MoEx(p=0.5, lam=0.9, at="block1")
    """

    name = "moex"

    def __init__(self, *, p: float = 0.5, lam: float = 0.9, at: str | None = None, moments: Moments = "pono",
                 eps: float = 1e-5) -> None:
        self.p = check_probability(self.name, "p", p)
        self.lam = check_probability(self.name, "lam", lam)
        if at is not None and not (isinstance(at, str) and at):
            raise ConfigError(f"moex.at must be one module name, got {at!r}")
        self.at = at
        self.moments = check_choice(self.name, "moments", moments, tuple(MOMENTS))
        check_range("moex.eps", eps, lo=0.0, lo_open=True)
        self.eps = float(eps)
        self.handle: AttachHandle | None = None

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        name = attach_points(self.name, None if self.at is None else [self.at], model, default=1)[0]
        self.layer = MoExLayer(moments=self.moments, eps=self.eps)
        self.handle = attach(model, {name: self.layer}, owner=self.name)

    def forward(self, ctx: ClientCtx, batch: Batch) -> tuple[Tensor, Batch]:
        require_classification(ctx, self.name)
        g = ctx.rng("exchange")
        b = batch.x.shape[0]
        if b < 2 or self.p == 0.0 or (self.p < 1.0 and float(torch.rand((), generator=g, device=g.device)) >= self.p):
            return ctx.model(batch.x), batch
        perm = torch.randperm(b, generator=g, device=g.device)
        self.layer.arm(perm)
        out = ctx.model(batch.x)
        soft = soft_labels(batch.y, ctx.task.num_classes)
        return out, Batch(batch.x, mix(soft, soft[perm], self.lam))
