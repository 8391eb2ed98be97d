"""AudioNet: 4 conv blocks on log-mel spectrograms, the UrbanSound8K model of FLea (KDD 2024), App. C.2.

Each block is conv - ReLU - BatchNorm (in that order, as FLea describes it); every conv halves both
spatial sizes, so a 2x64x344 spectrogram gives 16x16x86 features after ``block2`` (FLea's split
point l = 1). 25.6k parameters for 2 input channels and 10 classes (FLea: ~26k).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from fedaug.models.registry import MODELS
from fedaug.models.split import StagedModel


def _block(cin: int, cout: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, 2, kernel // 2), nn.ReLU(), nn.BatchNorm2d(cout))


class AudioNet(StagedModel):
    """Conv5x5/2(8), conv3x3/2(16), conv3x3/2(32), conv3x3/2(64), each ReLU-BN; GAP; linear.

    Args:
        in_channels: channels of the spectrogram ``(B, in_channels, mels, frames)`` (2 = stereo).
        num_classes: size of the output ``(B, num_classes)`` logits.

    >>> import torch
    >>> AudioNet(2, 10).eval()(torch.zeros(2, 2, 64, 344)).shape
    torch.Size([2, 10])
    """

    #: after each conv block; ``block2`` is FLea's feature-sharing point.
    feature_stages: ClassVar[tuple[str, ...]] = ("block1", "block2", "block3", "block4")

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.block1 = _block(in_channels, 8, 5)
        self.block2 = _block(8, 16, 3)
        self.block3 = _block(16, 32, 3)
        self.block4 = _block(32, 64, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, num_classes)


@MODELS.register("audionet", "AudioNet: 4 conv-ReLU-BN blocks on log-mel spectrograms, 25.6k params (FLea)")
def audionet(*, in_channels: int, num_classes: int) -> AudioNet:
    return AudioNet(in_channels, num_classes)
