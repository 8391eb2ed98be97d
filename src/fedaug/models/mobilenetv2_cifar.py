"""MobileNetV2, CIFAR variant: the CIFAR-10 model of FLea (KDD 2024), Appendix C.2; 2.30M parameters.

Reference: Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks", CVPR 2018,
arXiv:1801.04381, Table 2, with the usual CIFAR changes: stride 1 in the stem and in the second
stage (32x32 inputs keep 32x32 through ``stage2``) and a 1x1 conv-BN projection on the residual
path of stride-1 blocks whose width changes. FLea shares the 16x32x32 output of ``stage1`` (l = 0).
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel

#: (expansion t, output channels c, blocks n, first stride s) per stage (Table 2; s = 1 for stage2).
_CONFIG: tuple[tuple[int, int, int, int], ...] = (
    (1, 16, 1, 1),
    (6, 24, 2, 1),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    """1x1 expand-BN-ReLU6, 3x3 depthwise-BN-ReLU6, 1x1 linear projection-BN, residual if stride 1.

    Args:
        in_channels: channels of the input ``(B, in_channels, H, W)``.
        out_channels: channels of the output ``(B, out_channels, H / stride, W / stride)``.
        expansion: width multiplier of the hidden layer.
        stride: stride of the depthwise conv.
    """

    def __init__(self, in_channels: int, out_channels: int, expansion: int, stride: int) -> None:
        super().__init__()
        hidden = in_channels * expansion
        self.stride = stride
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.shortcut = nn.Sequential()
        if stride == 1 and in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv(x)
        return out + self.shortcut(x) if self.stride == 1 else out


class MobileNetV2CIFAR(StagedModel):
    """Stem conv3x3(32), seven stages of inverted residuals (17 blocks), conv1x1(1280), GAP, linear.

    Args:
        in_channels: channels of the input ``(B, in_channels, H, W)`` (32x32 for CIFAR; H, W >= 8).
        num_classes: size of the output ``(B, num_classes)`` logits.

    >>> import torch
    >>> MobileNetV2CIFAR(3, 10).eval()(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    #: after each stage of the configuration table; ``stage1`` is FLea's feature-sharing point.
    feature_stages: ClassVar[tuple[str, ...]] = tuple(f"stage{i}" for i in range(1, 8))

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6())
        cin = 32
        for i, (t, c, n, s) in enumerate(_CONFIG, start=1):
            blocks = [InvertedResidual(cin if j == 0 else c, c, t, s if j == 0 else 1) for j in range(n)]
            self.add_module(f"stage{i}", nn.Sequential(*blocks))
            cin = c
        self.head = nn.Sequential(nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(1280, num_classes)


@MODELS.register("mobilenetv2_cifar", "MobileNetV2, CIFAR variant (stride-1 stem), 2.30M params (FLea's CIFAR-10)")
def mobilenetv2_cifar(*, in_channels: int, num_classes: int) -> MobileNetV2CIFAR:
    return MobileNetV2CIFAR(in_channels, num_classes)
