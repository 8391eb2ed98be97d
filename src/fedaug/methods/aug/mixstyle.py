"""MixStyle (Zhou et al., ICLR 2021, arXiv:2104.02008): mix feature statistics between samples of the
client's batch, after named modules (default: the model's first two ``feature_stages``, as the paper's
placement after the first two residual blocks). Local: no federation information."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedaug.core.payload import Part
from fedaug.layers.attach import AttachHandle, attach
from fedaug.layers.mixing import MixStyleLayer
from fedaug.methods.options import attach_points, check_at, check_probability, check_range
from fedaug.methods.component import ClientCtx, Component, State
from fedaug.methods.recipe import METHODS


@METHODS.register("mixstyle", "MixStyle (Zhou et al. 2021): mix per-sample feature statistics within a batch")
class MixStyle(Component):
    """A :class:`~fedaug.layers.mixing.MixStyleLayer` after each attach point; identity at evaluation.

    Args:
        p: probability of mixing at each layer per forward pass (paper 0.5).
        alpha: Beta(alpha, alpha) concentration of the mixing weights (paper 0.1).
        at: module names to attach after; default the model's first two ``feature_stages``.
        eps: added to the spatial variance.

    >>> mixstyle = MixStyle(p=0.5, alpha=0.1, at=["block1", "block2"])
    """

    name = "mixstyle"

    def __init__(self, *, p: float = 0.5, alpha: float = 0.1, at: Sequence[str] | None = None,
                 eps: float = 1e-6) -> None:
        self.p = check_probability(self.name, "p", p)
        check_range("mixstyle.alpha", alpha, lo=0.0, lo_open=True)
        check_range("mixstyle.eps", eps, lo=0.0, lo_open=True)
        self.alpha, self.eps, self.at = float(alpha), float(eps), check_at(self.name, at)
        self.handle: AttachHandle | None = None

    def setup(self, model: nn.Module, input_shape: tuple[int, ...]) -> None:
        names = attach_points(self.name, self.at, model, default=2)
        layers = {n: MixStyleLayer(p=self.p, alpha=self.alpha, eps=self.eps) for n in names}
        self.handle = attach(model, layers, owner=self.name)

    def receive(self, ctx: ClientCtx, part: Part, state: State) -> None:
        g = ctx.rng("mix")
        for layer in self.handle.layers.values():
            layer.generator = g
