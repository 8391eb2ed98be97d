"""Scanner-like acquisition profiles: turn one MR volume into what different sites would record.

Multi-site MRI differs by more than the subject: each scanner has its own coil sensitivity (a smooth
multiplicative bias field, Sled et al., IEEE TMI 1998), sequence contrast, noise level (Rician
magnitude noise, Gudbjartsson & Patz, MRM 1995) and resolution (voxel size, slice thickness). An
:class:`AcquisitionProfile` holds one site's four parameters and :func:`acquire` applies them to a
volume in that order of the physics: contrast (gamma) -> bias field -> resolution (block average,
then trilinear back to the grid) -> noise. Every draw comes from the generator passed in; the
functions are pure and run on any ``(X, Y, Z)`` tensor, so their statistics are tested on small
synthetic volumes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedaug.core.rng import derive_seed, generator

#: parameter ranges of :func:`draw_profiles`: (low, high) for the continuous ones, the choices for resolution
RANGES: dict[str, Any] = {"bias_amplitude": (0.05, 0.4), "gamma": (0.6, 1.6), "noise_std": (0.005, 0.05),
                          "resolution": (1, 2, 3, 4)}
#: highest spatial frequency of the bias field, in cycles per field of view
BIAS_MAX_FREQ = 1
BIAS_TERMS = 6


@dataclass(frozen=True)
class AcquisitionProfile:
    """One simulated scanner.

    Attributes:
        bias_amplitude: ``a``: the bias field ``b = exp(a g)``, ``|g| <= 1``, lies in ``[e^-a, e^a]``.
        gamma: contrast: intensities in [0, 1] map to ``x ** gamma`` (< 1 brightens grey matter
            towards white matter, > 1 darkens it).
        noise_std: ``sigma`` of the Rician noise (each of the two Gaussian channels), in units of
            the [0, 1] intensity range.
        resolution: block factor ``r``: ``r x r x r`` voxels averaged, then interpolated back (1: none).
    """

    bias_amplitude: float
    gamma: float
    noise_std: float
    resolution: int

    def to_dict(self) -> dict[str, float | int]:
        """Plain values, for ``FederatedData.info`` and cache keys."""
        return asdict(self)


def draw_profiles(num_sites: int, seed: int) -> list[AcquisitionProfile]:
    """``num_sites`` profiles spread over :data:`RANGES` (a Latin hypercube: each continuous parameter's
    range is cut into ``num_sites`` equal strata, one per site in a seeded order, drawn uniformly
    inside it; gamma's strata are equal in log scale). Sites therefore differ in every continuous
    parameter; resolutions cycle through their four choices in a seeded order (4 sites: all differ).

    Args:
        num_sites: >= 1.
        seed: seeds the draw.
    """
    rng = np.random.default_rng(derive_seed(seed, "site_shift", "profiles"))

    def strata(lo: float, hi: float) -> np.ndarray:
        return lo + (hi - lo) * (rng.permutation(num_sites) + rng.random(num_sites)) / num_sites

    amp = strata(*RANGES["bias_amplitude"])
    gamma = np.exp(strata(*np.log(RANGES["gamma"])))
    noise = strata(*RANGES["noise_std"])
    choices = RANGES["resolution"]
    order = rng.permutation(len(choices))
    res = [choices[order[j % len(choices)]] for j in range(num_sites)]
    return [AcquisitionProfile(round(float(amp[j]), 4), round(float(gamma[j]), 4), round(float(noise[j]), 4),
                               int(res[j])) for j in range(num_sites)]


def bias_field(shape: tuple[int, int, int], amplitude: float, g: torch.Generator) -> Tensor:
    """A smooth multiplicative bias field ``exp(a * sum_t c_t cos(2 pi k_t . u + phi_t))``.

    ``u`` are voxel centres in [0, 1)^3 (per axis, ``(i + 1/2) / N``), ``k_t`` random integer
    frequency vectors with entries in ``[-BIAS_MAX_FREQ, BIAS_MAX_FREQ]`` (not all 0), ``c_t >= 0``
    summing to 1, ``phi_t`` uniform. Hence ``|log b| <= a`` and, along axis ``i``, the log-field
    changes by at most ``2 pi a BIAS_MAX_FREQ / N_i`` from one voxel to the next.

    Args:
        shape: ``(X, Y, Z)``.
        amplitude: ``a >= 0``.
        g: the generator of the draw.

    Returns:
        ``(X, Y, Z)`` float32, within ``[exp(-a), exp(a)]``.
    """
    k = torch.randint(-BIAS_MAX_FREQ, BIAS_MAX_FREQ + 1, (BIAS_TERMS, 3), generator=g)
    k[(k == 0).all(1), 0] = 1
    c = torch.rand(BIAS_TERMS, generator=g) + 0.1
    c = c / c.sum()
    phi = 2 * math.pi * torch.rand(BIAS_TERMS, generator=g)
    # cos(2 pi k.u + phi) = Re(e^{i phi} e^{i 2 pi k_0 u_0} e^{i 2 pi k_1 u_1} e^{i 2 pi k_2 u_2}): separable
    waves = [torch.exp(2j * math.pi * k[:, a, None] * ((torch.arange(n, dtype=torch.float64) + 0.5) / n))
             for a, n in enumerate(shape)]  # (T, N_a) complex
    log_b = torch.zeros(shape, dtype=torch.float64)
    for t in range(BIAS_TERMS):
        plane = (c[t] * torch.exp(1j * phi[t].double())) * waves[0][t, :, None] * waves[1][t, None, :]  # (X, Y)
        log_b += (plane[:, :, None] * waves[2][t, None, None, :]).real
    return torch.exp(amplitude * log_b).float()


def apply_gamma(x: Tensor, gamma: float) -> Tensor:
    """``x ** gamma`` of intensities ``x`` in [0, 1] (any shape; negatives clipped to 0): every quantile
    ``q`` of the result is the input's quantile ``q`` raised to ``gamma`` (a monotone map)."""
    return x.clamp_min(0) ** gamma


def degrade_resolution(x: Tensor, factor: int) -> Tensor:
    """Average ``factor^3`` blocks (a coarser voxel), then interpolate trilinearly back to ``x``'s grid.

    Args:
        x: ``(X, Y, Z)``; edges are padded by replication to whole blocks.
        factor: >= 1; 1 returns ``x`` itself.

    Returns:
        Same shape as ``x``, with less energy at high spatial frequencies.
    """
    if factor == 1:
        return x
    shape = x.shape
    pad = [p for n in reversed(shape) for p in (0, -n % factor)]
    v = F.pad(x[None, None], pad, mode="replicate")
    coarse = F.avg_pool3d(v, factor)
    fine = F.interpolate(coarse, size=v.shape[2:], mode="trilinear", align_corners=False)
    return fine[0, 0, : shape[0], : shape[1], : shape[2]]


def rician_noise(x: Tensor, std: float, g: torch.Generator) -> Tensor:
    """Magnitude of the signal plus complex Gaussian noise: ``sqrt((x + s n1)^2 + (s n2)^2)``.

    Where the signal is high (``x >> s``) the noise is about Gaussian with std ``s``; where it is 0 it
    is Rayleigh (mean ``s sqrt(pi / 2)``), as in the background of a magnitude image.
    """
    n = torch.randn((2, *x.shape), generator=g, dtype=x.dtype)
    return torch.sqrt((x + std * n[0]) ** 2 + (std * n[1]) ** 2)


def acquire(t1: Tensor, profile: AcquisitionProfile, seed: int) -> Tensor:
    """The volume ``t1`` ``(X, Y, Z)`` (intensities in [0, 1]) as the profile's scanner records it.

    Contrast, bias field, resolution, noise (see the module docstring); the bias field and the
    noise are drawn from generators seeded by ``seed``. The result is not rescaled (values may
    exceed 1): the caller normalises every site the same way.
    """
    x = apply_gamma(t1, profile.gamma)
    x = x * bias_field(tuple(x.shape), profile.bias_amplitude, generator(seed, "site_shift", "bias"))
    x = degrade_resolution(x, profile.resolution)
    return rician_noise(x, profile.noise_std, generator(seed, "site_shift", "noise"))
