"""LeNet-5 (LeCun et al., 1998) with ReLU and max-pooling, the EMNIST model of FedFA (ICLR 2023), Table 9."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


class LeNet5(StagedModel):
    """Conv5x5(6, pad 2)-ReLU-pool, Conv5x5(16)-ReLU-pool, FC 120-84-num_classes.

    Args:
        in_channels: channels of the input ``(B, in_channels, input_size, input_size)``.
        num_classes: size of the output ``(B, num_classes)`` logits.
        input_size: height = width of the input (28 for (E)MNIST: 16x5x5 features); >= 12.

    >>> import torch
    >>> LeNet5(1, 62)(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 62])
    """

    #: after each conv stage.
    feature_stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2")

    def __init__(self, in_channels: int, num_classes: int, input_size: int = 28) -> None:
        super().__init__()
        side = (input_size // 2 - 4) // 2
        if side < 1:
            raise ConfigError(f"lenet5.input_size must be >= 12, got {input_size}")
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(16 * side * side, 120), nn.ReLU())
        self.fc2 = nn.Sequential(nn.Linear(120, 84), nn.ReLU())
        self.fc3 = nn.Linear(84, num_classes)


@MODELS.register("lenet5", "LeNet-5 with ReLU and max-pooling (FedFA's EMNIST model), 28x28 inputs")
def lenet5(*, in_channels: int, num_classes: int, input_size: int = 28) -> LeNet5:
    return LeNet5(in_channels, num_classes, input_size=input_size)
