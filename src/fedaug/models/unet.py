"""U-Nets for 2-D and 3-D segmentation with named, separately attachable encoder pooling.

2-D: FedFA (ICLR 2023, arXiv:2301.12995), Tables 14-15 (ProstateMRI; 32 base features, 7.76M
parameters, quoted as 29.6 MB in Appendix E.6). 3-D: the 3D U-Net backbone of VFDA (Fed3DSeg),
which adds one augmentation layer after each encoder layer.

Each encoder level ``i`` is a conv block ``enc{i}`` followed by its own pooling module
``pool{i}``; the skip connection carries the output of ``enc{i}`` (pre-pool). A layer attached
after ``pool{i}`` therefore changes only the path down, never the skip (FedFA's public code);
a layer attached after ``enc{i}`` changes both (VFDA's placement).

Split points: every stage (``enc1``, ``pool1``, ..., ``bottleneck``, ``up{i}``, ``dec{i}``,
``head``) is splittable, but the features carry the pending skips: ``forward_front`` returns
``(h, skips)`` with ``h`` the current ``(B, C, *spatial)`` tensor and ``skips`` the tuple of
encoder outputs not yet consumed by a decoder (shallowest first); ``forward_back`` takes the same
pair. After ``head`` the skips are empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError
from fedaug.models.registry import MODELS
from fedaug.models.split import Features, Stage, StagedModel

_CONV = {2: nn.Conv2d, 3: nn.Conv3d}
_UPCONV = {2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_POOL = {2: nn.MaxPool2d, 3: nn.MaxPool3d}
_NORM = {
    ("batch", 2): nn.BatchNorm2d,
    ("batch", 3): nn.BatchNorm3d,
    ("instance", 2): lambda c: nn.InstanceNorm2d(c, affine=True),
    ("instance", 3): lambda c: nn.InstanceNorm3d(c, affine=True),
}
#: the normalisation layers of a U-Net (option ``norm``)
Norm = Literal["batch", "instance"]


def _block(dims: int, norm: str, cin: int, cout: int) -> nn.Sequential:
    """(conv3x3 - norm - ReLU) x 2 (FedFA Table 15), convs without bias."""
    conv, make_norm = _CONV[dims], _NORM[norm, dims]
    return nn.Sequential(
        conv(cin, cout, 3, padding=1, bias=False), make_norm(cout), nn.ReLU(),
        conv(cout, cout, 3, padding=1, bias=False), make_norm(cout), nn.ReLU(),
    )  # fmt: skip


class UNet(StagedModel):
    """Encoder-decoder with skip connections, for inputs ``(B, C, *spatial)`` with 2 or 3 spatial dims.

    Args:
        in_channels: channels of the input ``(B, in_channels, *spatial)``; every spatial size must
            be divisible by ``2 ** (len(features) - 1)``.
        num_classes: channels of the output logits ``(B, num_classes, *spatial)``.
        features: widths of the encoder levels, the last one being the bottleneck
            (``(32, 64, 128, 256, 512)`` in FedFA Table 14).
        dims: number of spatial dimensions, 2 or 3.
        norm: ``"batch"`` (FedFA Table 15) or ``"instance"`` normalisation.
        attach_after: ``"pool"`` (default attach points after each pooled encoder output and the
            bottleneck, FedFA) or ``"encoder"`` (after each encoder block and the bottleneck, VFDA).

    >>> import torch
    >>> UNet(3, 2, features=(8, 16, 32)).eval()(torch.zeros(2, 3, 16, 16)).shape
    torch.Size([2, 2, 16, 16])
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        features: Sequence[int] = (32, 64, 128, 256, 512),
        dims: int = 2,
        norm: str = "batch",
        attach_after: str = "pool",
    ) -> None:
        super().__init__()
        problems = []
        if len(features) < 2 or any(int(f) < 1 for f in features):
            problems.append(f"features must list >= 2 positive widths (encoders + bottleneck), got {tuple(features)}")
        if dims not in _CONV:
            problems.append(f"dims must be 2 or 3, got {dims}")
        if norm not in ("batch", "instance"):
            problems.append(f"norm must be 'batch' or 'instance', got '{norm}'")
        if attach_after not in ("pool", "encoder"):
            problems.append(f"attach_after must be 'pool' or 'encoder', got '{attach_after}'")
        if problems:
            raise ConfigError("unet: " + "; ".join(problems))
        self.levels = len(features) - 1
        self.dims = dims
        cin = in_channels
        for i, f in enumerate(features[:-1], start=1):
            self.add_module(f"enc{i}", _block(dims, norm, cin, f))
            self.add_module(f"pool{i}", _POOL[dims](2))
            cin = f
        self.bottleneck = _block(dims, norm, cin, features[-1])
        for i in range(self.levels, 0, -1):
            f = features[i - 1]
            self.add_module(f"up{i}", _UPCONV[dims](features[i], f, 2, stride=2))
            self.add_module(f"dec{i}", _block(dims, norm, 2 * f, f))
        self.head = _CONV[dims](features[0], num_classes, 1)
        kind = "pool" if attach_after == "pool" else "enc"
        self.feature_stages = (*(f"{kind}{i}" for i in range(1, self.levels + 1)), "bottleneck")

    def begin(self, x: Tensor) -> Features:
        """Check the input ``(B, C, *spatial)`` and start with no pending skips."""
        k = 2**self.levels
        spatial = tuple(x.shape[2:])
        if len(spatial) != self.dims or any(s % k for s in spatial):
            raise ValueError(
                f"{type(self).__name__} with {self.levels} poolings needs input (B, C) + {self.dims} spatial "
                f"sizes divisible by {k}, got shape {tuple(x.shape)}; crop or pad the input"
            )
        return x, ()

    def end(self, h: Features) -> Tensor:
        """The logits ``(B, num_classes, *spatial)`` after ``head``."""
        return h[0]

    def stages(self) -> list[Stage]:
        """enc1, pool1, ..., bottleneck, up{L}, dec{L}, ..., up1, dec1, head; features are ``(h, skips)``."""
        def encode(m: nn.Module) -> Callable[[Features], Features]:
            def fn(hs: Features) -> Features:
                h = m(hs[0])
                return h, (*hs[1], h)

            return fn

        def apply(m: nn.Module) -> Callable[[Features], Features]:
            return lambda hs: (m(hs[0]), hs[1])

        def decode(m: nn.Module) -> Callable[[Features], Features]:
            return lambda hs: (m(torch.cat([hs[0], hs[1][-1]], dim=1)), hs[1][:-1])

        out: list[Stage] = []
        for i in range(1, self.levels + 1):
            out.append((f"enc{i}", encode(self.get_submodule(f"enc{i}"))))
            out.append((f"pool{i}", apply(self.get_submodule(f"pool{i}"))))
        out.append(("bottleneck", apply(self.bottleneck)))
        for i in range(self.levels, 0, -1):
            out += [(f"up{i}", apply(self.get_submodule(f"up{i}"))), (f"dec{i}", decode(self.get_submodule(f"dec{i}")))]
        out.append(("head", apply(self.head)))
        return out


@MODELS.register("unet2d", "2-D U-Net, base width 32, BN (FedFA Tables 14-15; ProstateMRI 384x384), 7.76M params")
def unet2d(*, in_channels: int, num_classes: int, base_width: int = 32, depth: int = 4,
           norm: Norm = "batch") -> UNet:
    """A 2-D :class:`UNet` with encoder widths ``base_width * 2 ** i``, ``i = 0..depth``.

    Args:
        base_width: channels of the first encoder level (32 in FedFA Table 14).
        depth: poolings between the first level and the bottleneck (4 in FedFA Table 14).
    """
    if base_width < 1 or depth < 1:
        raise ConfigError(f"unet2d: base_width and depth must be >= 1, got base_width={base_width}, depth={depth}")
    features = tuple(base_width * 2**i for i in range(depth + 1))
    return UNet(in_channels, num_classes, features, dims=2, norm=norm, attach_after="pool")


@MODELS.register("unet3d", "3-D U-Net with configurable encoder widths; augmentation after each encoder layer (VFDA)")
def unet3d(
    *, in_channels: int, num_classes: int, features: Sequence[int] = (16, 32, 64, 128), norm: Norm = "batch"
) -> UNet:
    return UNet(in_channels, num_classes, tuple(features), dims=3, norm=norm, attach_after="encoder")
