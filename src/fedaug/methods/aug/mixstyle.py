"""MixStyle (Zhou et al., ICLR 2021, arXiv:2104.02008): mix feature statistics between samples of the
client's batch, after named modules (default: the model's first two ``feature_stages``, as the paper's
placement after the first two residual blocks). Local: no federation information."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.core.payload import Part
from fedaug.layers.attach import AttachHandle, attach
from fedaug.layers.mixing import MixStyleLayer
from fedaug.methods.aug.featstats import check_probability
from fedaug.methods.component import ClientCtx, Component, State
from fedaug.methods.recipe import METHODS


def attach_points(name: str, at: Sequence[str] | None, model: nn.Module, default: int) -> list[str]:
    """``at``, or the first ``default`` of ``model.feature_stages``; a :class:`ConfigError` if none."""
    names = list(at) if at is not None else list(getattr(model, "feature_stages", ()))[:default]
    if not names:
        raise ConfigError(f"{name}: {type(model).__name__} declares no feature_stages; set "
                          f"method.options.{name}.at to module names")
    return names


def check_at(name: str, at: Sequence[str] | None) -> list[str] | None:
    """``at`` as a list, or a :class:`ConfigError` if it is not a non-empty list of strings."""
    if at is not None and (isinstance(at, str) or not at or not all(isinstance(n, str) for n in at)):
        raise ConfigError(f"{name}.at must be a non-empty list of module names, got {at!r}")
    return None if at is None else list(at)


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
        if alpha <= 0:
            raise ConfigError(f"mixstyle.alpha must be > 0, got {alpha}")
        self.alpha, self.eps, self.at = float(alpha), float(eps), check_at(self.name, at)
        self.handle: AttachHandle | None = None

    def setup(self, model: nn.Module) -> None:
        names = attach_points(self.name, self.at, model, default=2)
        layers = {n: MixStyleLayer(p=self.p, alpha=self.alpha, eps=self.eps) for n in names}
        self.handle = attach(model, layers)

    def round_start(self, ctx: ClientCtx, part: Part, state: State) -> None:
        g = ctx.rng("mix")
        for layer in self.handle.layers.values():
            layer.generator = g
