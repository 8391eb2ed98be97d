"""Conventional input normalisation with fixed statistics (FedRDN paper, Eq. 3: the "+ norm" baseline)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.layers.functional import normalize_channels
from fedaug.methods.component import Batch, ClientCtx, Component
from fedaug.methods.recipe import METHODS


def _channels(values: Sequence[float] | float, name: str) -> Tensor:
    t = torch.tensor(values if isinstance(values, Sequence) else [values], dtype=torch.float32).flatten()
    if t.numel() == 0 or not bool(torch.isfinite(t).all()):
        raise ConfigError(f"norm.{name} must be a non-empty list of finite numbers, got {values!r}")
    return t


@METHODS.register("norm", "conventional input normalisation (x - mean) / std with fixed statistics")
class Normalize(Component):
    """``(x - mean) / std`` per channel, the same fixed statistics in training and evaluation (Eq. 3).

    Args:
        mean: one value per input channel, or one value for every channel.
        std: likewise; every value > 0.

    Raises:
        ConfigError: a non-positive std, or a number of values that matches neither 1 nor the
            inputs' channels (the latter when the first batch arrives).

    >>> norm = Normalize(mean=[0.5], std=[0.5])
    """

    name = "norm"

    def __init__(self, *, mean: Sequence[float] | float = 0.5, std: Sequence[float] | float = 0.5) -> None:
        self.mean, self.std = _channels(mean, "mean"), _channels(std, "std")
        if not bool((self.std > 0).all()):
            raise ConfigError(f"norm.std must be > 0 in every channel, got {std!r}")
        if self.mean.numel() != self.std.numel() and 1 not in (self.mean.numel(), self.std.numel()):
            raise ConfigError(f"norm.mean has {self.mean.numel()} values and norm.std {self.std.numel()}; "
                              "give one value per channel for both, or a single value")

    def transform_batch(self, ctx: ClientCtx, batch: Batch) -> Batch:
        c = batch.x.shape[1]
        if {self.mean.numel(), self.std.numel()} - {1, c}:
            raise ConfigError(f"norm.mean/std have {self.mean.numel()}/{self.std.numel()} values but the inputs "
                              f"have {c} channels; give {c} values or a single one")
        mean, std = self.mean.to(batch.x.device).expand(c), self.std.to(batch.x.device).expand(c)
        return Batch(normalize_channels(batch.x, mean, std), batch.y)
