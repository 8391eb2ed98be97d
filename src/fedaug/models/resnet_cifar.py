"""ResNet-18, CIFAR variant (3x3 stem, no max-pooling): the CIFAR-10 model of FedFA (ICLR 2023), Table 9.

Reference: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, arXiv:1512.03385.
11.17M parameters for 10 classes.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN) shortcut, then ReLU.

    Args:
        in_channels: channels of the input ``(B, in_channels, H, W)``.
        channels: channels of the output ``(B, channels, H / stride, W / stride)``.
        stride: stride of the first conv and of the shortcut.
    """

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def _layer(in_channels: int, channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1))


class ResNet18CIFAR(StagedModel):
    """3x3 conv(64)-BN-ReLU stem, four stages of two basic blocks (64-128-256-512), GAP, linear.

    Args:
        in_channels: channels of the input ``(B, in_channels, H, W)`` (32x32 for CIFAR).
        num_classes: size of the output ``(B, num_classes)`` logits.

    >>> import torch
    >>> ResNet18CIFAR(3, 10).eval()(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    #: after each residual stage.
    feature_stages: ClassVar[tuple[str, ...]] = ("layer1", "layer2", "layer3", "layer4")

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.layer1 = _layer(64, 64, 1)
        self.layer2 = _layer(64, 128, 2)
        self.layer3 = _layer(128, 256, 2)
        self.layer4 = _layer(256, 512, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512, num_classes)


@MODELS.register("resnet18_cifar", "ResNet-18, CIFAR variant (3x3 stem, no max-pool), 11.2M params (FedFA's CIFAR-10)")
def resnet18_cifar(*, in_channels: int, num_classes: int) -> ResNet18CIFAR:
    return ResNet18CIFAR(in_channels, num_classes)
