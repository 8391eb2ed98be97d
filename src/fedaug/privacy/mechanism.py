"""The Gaussian mechanism on what a client shares, once its sensitivity is bounded by clipping
(issue 20; docs/privacy.md, "Differential privacy").

A release ``M(D) = f(D) + N(0, sigma^2 I)`` with ``sigma = z * Delta`` is (eps, delta)-DP for every
pair of neighbouring datasets whose ``f`` differ by at most ``Delta`` in L2 norm (Dwork and Roth
2014, Thm. A.1; exactly, the analytic Gaussian mechanism of Balle and Wang 2018, Thm. 8); the
accountant (:mod:`fedaug.privacy.accountant`) turns ``z`` and the release schedule into (eps, delta).

Neighbouring relation, everywhere in fedaug: **add/remove one unit**, a sample or a whole client,
read as "zero-out" (its clipped contribution replaced by zero; sizes that divide, the client's
``n`` or FedMix's ``M``, are public, as the aggregation weights already are). The components clip
first, so the bound is real:

=========================  ======  ===================================================  ================
artefact                   unit    what is clipped to C                                 Delta
=========================  ======  ===================================================  ================
FedFA/VFDA statistics      client  the uploaded vector (every layer's running stats)    C
FedRDN statistics          sample  each image's (channel mean, channel std) vector      C / n (mean of n)
FLea features              sample  each shared feature row (one sample's release)       C
FedMix mean images         sample  each image, before the mean over its M-batch         C / M
FedMix mean labels         sample  each one-hot label (norm 1)                          1 / M
DP-FedAvg model update     client  the client's update (``methods/base/fedavg.py``)     C
=========================  ======  ===================================================  ================
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from fedaug.privacy.noise import add_gaussian_noise


def gaussian_mechanism(tensors: Mapping[str, Tensor], sensitivity: float, noise_multiplier: float,
                       generator: torch.Generator) -> dict[str, Tensor]:
    """``f(D) + N(0, (z * Delta)^2 I)``: every floating tensor of ``tensors`` (one release, taken as
    one vector) gets i.i.d. Gaussian noise of std ``noise_multiplier * sensitivity``.

    The caller guarantees the sensitivity (by clipping, :mod:`fedaug.privacy.clip`); this function
    only adds the calibrated noise, drawn from the caller's seeded stream (``ctx.rng("dp")``).

    Args:
        tensors: ``{name: tensor}``, any shapes; integer tensors are returned unchanged.
        sensitivity: Delta > 0, the L2 sensitivity of the whole release.
        noise_multiplier: z >= 0 (0 returns the tensors as they are: no privacy).
        generator: a CPU generator; draws ``numel`` normals per floating tensor, in ``tensors``' order.

    Returns:
        The noised tensors: same names, shapes, dtypes and devices; the inputs are not modified.

    Raises:
        ValueError: ``sensitivity`` is not a finite number > 0 or ``noise_multiplier`` < 0.

    >>> g = torch.Generator().manual_seed(0)
    >>> out = gaussian_mechanism({"s": torch.zeros(100_000)}, 0.5, 2.0, g)
    >>> round(float(out["s"].std()), 1)
    1.0
    """
    if not (0 < sensitivity < float("inf")) or not (0 <= noise_multiplier < float("inf")):
        raise ValueError(f"gaussian_mechanism needs a finite sensitivity > 0 and a finite noise_multiplier >= 0, "
                         f"got {sensitivity!r} and {noise_multiplier!r}")
    std = noise_multiplier * sensitivity
    return {k: add_gaussian_noise(t, std, generator) if t.is_floating_point() else t for k, t in tensors.items()}
