"""A small 4-conv CNN for 28x28 inputs: the fast default model."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


def _block(cin: int, cout: int, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class SmallCNN(StagedModel):
    """Four 3x3 conv-BN-ReLU blocks (two with 2x2 max-pooling), global average pooling, a linear head.

    Args:
        in_channels: channels of the input ``(B, in_channels, H, W)``; any H, W >= 4.
        num_classes: size of the output ``(B, num_classes)`` logits.
        width: channels of every conv block.

    >>> import torch
    >>> SmallCNN(3, 10)(torch.zeros(2, 3, 28, 28)).shape
    torch.Size([2, 10])
    """

    #: module names after which feature-level augmentations attach by default (each conv block).
    feature_stages: ClassVar[tuple[str, ...]] = ("block1", "block2", "block3", "block4")

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.block1 = _block(in_channels, width, pool=False)
        self.block2 = _block(width, width, pool=True)
        self.block3 = _block(width, width, pool=False)
        self.block4 = _block(width, width, pool=True)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, num_classes)


@MODELS.register("small_cnn", "4-conv 32-channel CNN with BatchNorm for 28x28 inputs (fast default)")
def small_cnn(*, in_channels: int, num_classes: int, width: int = 32) -> SmallCNN:
    return SmallCNN(in_channels, num_classes, width=width)
