"""HARNet: 4 convolutions with (k, 1) kernels on sensor windows, the UCI-HAR model of FLea (KDD 2024).

FLea (Sec. 4.1, App. C.2) gives only "4 convolutional layers" on 128x3 windows; the layer sizes
here are chosen to reproduce the two figures known about the public model: ~0.69M parameters
(690,950 here for 6 classes) and 128x20x7 features after the second layer (FLea's split point
l = 1). The (k, 1) kernels convolve along time only; the padding of 1 on both axes widens the
3 sensor axes by 2 per layer (3 -> 5 -> 7 -> ...), which is what that 128x20x7 shape implies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


class HARNet(StagedModel):
    """Four conv(k x 1, pad 1)-BN-ReLU-MaxPool(p x 1) blocks, flatten, FC-ReLU, linear.

    Args:
        in_channels: channels of the input ``(B, in_channels, L, A)``: L time steps, A sensor axes
            (``(B, 1, 128, 3)`` for UCI-HAR's accelerometer windows).
        num_classes: size of the output ``(B, num_classes)`` logits.
        window: L, the time steps per window (fixes the FC width).
        axes: A, the sensor axes.
        widths: output channels of the 4 blocks.
        kernel: k, the temporal kernel size.
        pools: temporal max-pooling factor after each block (1 = none).
        hidden: width of the hidden FC layer.

    >>> import torch
    >>> HARNet(1, 6).eval()(torch.zeros(2, 1, 128, 3)).shape
    torch.Size([2, 6])
    """

    #: after each conv block; ``block2`` is FLea's feature-sharing point (128x20x7).
    feature_stages: ClassVar[tuple[str, ...]] = ("block1", "block2", "block3", "block4")

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        window: int = 128,
        axes: int = 3,
        widths: Sequence[int] = (128, 128, 256, 64),
        kernel: int = 5,
        pools: Sequence[int] = (3, 2, 1, 2),
        hidden: int = 64,
    ) -> None:
        super().__init__()
        if len(widths) != 4 or len(pools) != 4:
            raise ConfigError(
                f"harnet.widths and harnet.pools need 4 entries each, got {tuple(widths)} and {tuple(pools)}"
            )
        length, cin = window, in_channels
        for i, (w, p) in enumerate(zip(widths, pools), start=1):
            layers: list[nn.Module] = [nn.Conv2d(cin, w, (kernel, 1), padding=1), nn.BatchNorm2d(w), nn.ReLU()]
            if p > 1:
                layers.append(nn.MaxPool2d((p, 1)))
            self.add_module(f"block{i}", nn.Sequential(*layers))
            length, cin = (length + 3 - kernel) // p, w
        if length < 1:
            raise ConfigError(
                f"harnet: window={window} is too short for kernel={kernel} and pools={tuple(pools)}; "
                "use a longer window, a smaller kernel or less pooling"
            )
        self.flatten = nn.Flatten()
        self.fc1 = nn.Sequential(nn.Linear(cin * length * (axes + 2 * len(widths)), hidden), nn.ReLU())
        self.fc2 = nn.Linear(hidden, num_classes)


@MODELS.register("harnet", "HARNet: 4 (k,1)-kernel conv blocks on (1, 128, 3) windows, 0.69M params (FLea, UCI-HAR)")
def harnet(
    *,
    in_channels: int,
    num_classes: int,
    window: int = 128,
    axes: int = 3,
    widths: Sequence[int] = (128, 128, 256, 64),
    kernel: int = 5,
    pools: Sequence[int] = (3, 2, 1, 2),
    hidden: int = 64,
) -> HARNet:
    return HARNet(in_channels, num_classes, window, axes, tuple(widths), kernel, tuple(pools), hidden)
