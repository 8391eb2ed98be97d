"""A plain 1-D CNN for multichannel sensor windows ``(B, C, L)`` (C sensor axes, L time steps)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


class CNN1D(StagedModel):
    """Conv1d(k=5, pad 2)-BN-ReLU-MaxPool(2) blocks, global average pooling over time, linear.

    Args:
        in_channels: sensor channels of the input ``(B, in_channels, L)``, L >= 2 ** len(widths).
        num_classes: size of the output ``(B, num_classes)`` logits.
        widths: output channels of the conv blocks ``block1``, ``block2``, ...

    >>> import torch
    >>> CNN1D(6, 6).eval()(torch.zeros(2, 6, 100)).shape
    torch.Size([2, 6])
    """

    def __init__(self, in_channels: int, num_classes: int, widths: Sequence[int] = (32, 64, 128)) -> None:
        super().__init__()
        if not widths or any(int(w) < 1 for w in widths):
            raise ConfigError(f"cnn1d.widths must list >= 1 positive widths, got {tuple(widths)}")
        cin = in_channels
        for i, w in enumerate(widths, start=1):
            self.add_module(
                f"block{i}",
                nn.Sequential(nn.Conv1d(cin, w, 5, padding=2), nn.BatchNorm1d(w), nn.ReLU(), nn.MaxPool1d(2)),
            )
            cin = w
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(cin, num_classes)
        #: after each conv block.
        self.feature_stages = tuple(f"block{i}" for i in range(1, len(widths) + 1))


@MODELS.register("cnn1d", "plain 1-D CNN (3 conv-BN-ReLU-pool blocks) for sensor windows (B, C, L)")
def cnn1d(*, in_channels: int, num_classes: int, widths: Sequence[int] = (32, 64, 128)) -> CNN1D:
    return CNN1D(in_channels, num_classes, widths=tuple(widths))
