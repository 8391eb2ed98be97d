"""AlexNet with BatchNorm and a 1024-wide FC head, as in FedFA (ICLR 2023, arXiv:2301.12995), Table 10.

The same network as FedBN's Office-Caltech10 / DomainNet model; 12.97M parameters for 10 classes
(FedFA Appendix E.6 quotes 49.5 MB per model).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


def _conv(cin: int, cout: int, kernel: int, stride: int, padding: int, pool: bool) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, padding), nn.BatchNorm2d(cout), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(3, 2))
    return nn.Sequential(*layers)


def _fc(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(cin, cout), nn.BatchNorm1d(cout), nn.ReLU())


class AlexNetBN(StagedModel):
    """Five conv-BN-ReLU stages (64-192-384-256-256), adaptive 6x6 pooling, FC 9216-hidden-hidden.

    The adaptive pooling makes any input side >= 63 valid (three 3x3/2 max-poolings); the paper
    resizes images to 256x256 (FedFA, Appendix E.2).

    Args:
        in_channels: channels of the input ``(B, in_channels, H, W)``, H, W >= 63.
        num_classes: size of the output ``(B, num_classes)`` logits.
        hidden: width of the two hidden FC layers (1024 in Table 10).

    >>> import torch
    >>> AlexNetBN(3, 10).eval()(torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 10])
    """

    #: one FFA layer after each of the 5 conv stages (Table 10, rows 2-10).
    feature_stages: ClassVar[tuple[str, ...]] = ("conv1", "conv2", "conv3", "conv4", "conv5")

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 1024) -> None:
        super().__init__()
        if hidden < 1:
            raise ConfigError(f"alexnet_bn.hidden must be a positive width, got {hidden}")
        self.conv1 = _conv(in_channels, 64, 11, 4, 2, pool=True)
        self.conv2 = _conv(64, 192, 5, 1, 2, pool=True)
        self.conv3 = _conv(192, 384, 3, 1, 1, pool=False)
        self.conv4 = _conv(384, 256, 3, 1, 1, pool=False)
        self.conv5 = _conv(256, 256, 3, 1, 1, pool=True)
        self.pool = nn.AdaptiveAvgPool2d((6, 6))
        self.flatten = nn.Flatten()
        self.fc1 = _fc(256 * 6 * 6, hidden)
        self.fc2 = _fc(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)


@MODELS.register("alexnet_bn", "AlexNet-BN, FC 1024 (FedFA Table 10; Office-Caltech10, DomainNet, 256x256)")
def alexnet_bn(*, in_channels: int, num_classes: int, hidden: int = 1024) -> AlexNetBN:
    return AlexNetBN(in_channels, num_classes, hidden=hidden)
