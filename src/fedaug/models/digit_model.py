"""FedBN's DigitModel: 3 conv layers (64-64-128, BN) and an FC head (2048-512), ~14.2M parameters.

Reference: Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, arXiv:2102.07623 (Digits-5 experiments).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


def _conv(cin: int, cout: int, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, 5, 1, 2), nn.BatchNorm2d(cout), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


def _fc(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(cin, cout), nn.BatchNorm1d(cout), nn.ReLU())


class DigitModel(StagedModel):
    """Conv5x5(64)-BN-ReLU-pool, Conv5x5(64)-BN-ReLU-pool, Conv5x5(128)-BN-ReLU, FC 2048-512 with BN.

    Args:
        in_channels: channels of the input ``(B, in_channels, input_size, input_size)``.
        num_classes: size of the output ``(B, num_classes)`` logits.
        input_size: height = width of the input (28 for Digits-5); fixes the first FC's width.

    >>> import torch
    >>> DigitModel(3, 10).eval()(torch.zeros(2, 3, 28, 28)).shape
    torch.Size([2, 10])
    """

    #: after each conv stage.
    feature_stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "conv3")

    def __init__(self, in_channels: int, num_classes: int, input_size: int = 28) -> None:
        super().__init__()
        if input_size < 4:
            raise ConfigError(f"digit_model.input_size must be >= 4 (two 2x2 poolings), got {input_size}")
        side = input_size // 2 // 2
        self.conv1 = _conv(in_channels, 64, pool=True)
        self.conv2 = _conv(64, 64, pool=True)
        self.conv3 = _conv(64, 128, pool=False)
        self.flatten = nn.Flatten()
        self.fc1 = _fc(128 * side * side, 2048)
        self.fc2 = _fc(2048, 512)
        self.fc3 = nn.Linear(512, num_classes)


@MODELS.register("digit_model", "FedBN DigitModel: 3 conv (64-64-128, BN) + FC 2048-512, ~14.2M params at 28x28")
def digit_model(*, in_channels: int, num_classes: int, input_size: int = 28) -> DigitModel:
    return DigitModel(in_channels, num_classes, input_size=input_size)
