"""Gaussian noise on shared statistics and features, for any component that uploads them.

A generic helper, not a differential-privacy accountant: it perturbs what leaves a client with
``N(0, std^2)`` noise, ``std`` absolute or relative to the tensor's own standard deviation, drawn
from the caller's seeded generator (``ctx.rng("noise")``), so runs stay reproducible. FLea applies
it to the features it shares, FedFA and VFDA to the running statistics they upload, FedRDN to its
dataset statistics and FedMix to its mean images: option ``share_noise`` (the std) and
``share_noise_scale`` of each (``docs/privacy.md``).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor


#: what ``std`` is relative to (option ``share_noise_scale``): nothing, or the tensor's own standard deviation.
NoiseScale = Literal["absolute", "relative"]
SCALES: tuple[str, ...] = get_args(NoiseScale)


def add_gaussian_noise(t: Tensor, std: float, generator: torch.Generator, *, scale: str = "absolute") -> Tensor:
    """``t + N(0, sigma^2)`` elementwise, with ``sigma = std`` or ``std * t.std()``; a single value has
    no spread, so there the relative scale is its magnitude: ``sigma = std * |t|`` (FedRDN's
    statistics of a one-channel dataset are ``(1,)`` tensors, issue 41).

    Args:
        t: any floating tensor, e.g. features ``(N, C, *spatial)`` or channel statistics ``(C,)``;
            not modified in place.
        std: the noise scale; 0 returns ``t`` itself.
        generator: a CPU generator (the caller's seeded stream); draws ``t.numel()`` normals.
        scale: ``"absolute"`` or ``"relative"`` (to the standard deviation of all of ``t``'s values,
            or to ``|t|`` for a one-element ``t``).

    Returns:
        Same shape, dtype and device as ``t``.

    Raises:
        ConfigError: ``std < 0`` or an unknown ``scale``.

    >>> g = torch.Generator().manual_seed(0)
    >>> t = torch.zeros(3)
    >>> add_gaussian_noise(t, 0.0, g) is t
    True
    """
    if not std >= 0 or scale not in SCALES:
        raise ValueError(f"add_gaussian_noise needs std >= 0 and scale in {SCALES}, got {std!r}, {scale!r}")
    if std == 0:
        return t
    spread = t.detach().float().std() if t.numel() > 1 else t.detach().float().abs().sum()
    sigma = std * (float(spread) if scale == "relative" else 1.0)
    noise = torch.randn(t.shape, generator=generator, dtype=torch.float32, device=generator.device)
    return t + (sigma * noise).to(dtype=t.dtype, device=t.device)
