"""Pure tensor functions and thin layers of input normalisation and mixing augmentations.

FedRDN (input normalisation with federation statistics), Mixup / Manifold Mixup (Zhang et al., ICLR
2018, arXiv:1710.09412; Verma et al., ICML 2019, arXiv:1806.05236), MixStyle (Zhou et al., ICLR
2021, arXiv:2104.02008) and MoEx (Li et al., CVPR 2021, arXiv:2002.11102). Layouts: inputs and
features ``(B, C, *spatial)`` with any spatial rank; per-sample channel statistics ``(B, C)``;
labels ``(B,)`` int64 or soft ``(B, K)`` float. Randomness is an argument (a permutation, a
weight) or comes from an explicit :class:`torch.Generator`, never from global state.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
import torch
from torch import Tensor, nn

from fedaug.layers.functional import channel_stats, restyle_channels

#: how MoEx computes the moments it exchanges (the keys of :data:`MOMENTS`).
Moments = Literal["pono", "instance"]
MOMENTS: dict[str, str] = {"pono": "over channels at each position (positional normalisation, the MoEx default)",
           "instance": "over positions for each channel (instance normalisation, as MixStyle)"}


def dataset_channel_stats(x: Tensor, *, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """A dataset's channel statistics: per-sample channel mean and std averaged over samples
    (FedRDN Eq. 4-5; Eq. 4 prints a sum, the average is what normalisation needs).

    Args:
        x: ``(N, C, *spatial)``, N >= 1, at least one spatial dim.
        chunk: samples per step (bounds memory; the result does not depend on it beyond rounding).

    Returns:
        ``mean, std``, each ``(C,)`` float32, computed in float64.
    """
    mean = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    std = torch.zeros_like(mean)
    for i in range(0, x.shape[0], chunk):
        mu, sigma = channel_stats(x[i : i + chunk].to(torch.float64), eps=0.0)
        mean += mu.sum(0)
        std += sigma.sum(0)
    return (mean / x.shape[0]).float(), (std / x.shape[0]).float()


def sample_beta(alpha: float, size: int, generator: torch.Generator) -> Tensor:
    """``size`` draws of Beta(alpha, alpha) as float32 ``(size,)``, reproducible from ``generator``.

    torch's Beta sampler takes no generator, so a NumPy generator is seeded from one draw of it;
    the draws are on the generator's device.
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    draws = torch.from_numpy(np.random.default_rng(seed).beta(alpha, alpha, size).astype(np.float32))
    return draws.to(generator.device)


def soft_labels(y: Tensor, num_classes: int) -> Tensor:
    """Class indices ``(B,)`` int64 as one-hot float32 ``(B, K)``; soft labels ``(B, K)`` pass through. By a
    comparison with the class range, not :func:`torch.nn.functional.one_hot`, which reads the labels' maximum
    on the host (a synchronisation a batched or captured step cannot take; the loaders check the labels)."""
    if y.is_floating_point():
        return y
    return (y[:, None] == torch.arange(num_classes, device=y.device)).float()


def mix(a: Tensor, b: Tensor, lam: Tensor | float) -> Tensor:
    """``lam * a + (1 - lam) * b`` with ``lam`` a scalar or ``(B,)`` (one weight per sample).

    Args:
        a, b: same shape ``(B, *rest)``.
        lam: float, 0-d tensor or ``(B,)``.
    """
    if isinstance(lam, Tensor) and lam.dim() == 1:
        lam = lam.reshape(-1, *([1] * (a.dim() - 1)))
    return lam * a + (1 - lam) * b


def mix_channel_stats(x: Tensor, perm: Tensor, lam: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Re-style each sample with a mix of its own and a partner's channel statistics (MixStyle, Eq. 3-5).

    ``mu_mix = lam mu + (1 - lam) mu[perm]`` (same for sigma); output
    ``sigma_mix * (x - mu) / sigma + mu_mix``. The statistics are detached, as in the paper's code,
    so gradients reach ``x`` only through the normalised features.

    Args:
        x: ``(B, C, *spatial)``, not modified in place.
        perm: ``(B,)`` int64, the partner of each sample.
        lam: ``(B,)`` mixing weights in [0, 1].
        eps: added to the spatial variance.

    Returns:
        Same shape and dtype as ``x``.
    """
    mu, sigma = (t.detach() for t in channel_stats(x, eps=eps))
    mu_mix, sigma_mix = mix(mu, mu[perm], lam), mix(sigma, sigma[perm], lam)
    return restyle_channels(x, mu, sigma, mu_mix, sigma_mix)


def exchange_moments(x: Tensor, perm: Tensor, *, moments: str = "pono", eps: float = 1e-5) -> Tensor:
    """Normalise each sample with its own moments and re-inject its partner's (MoEx, Eq. 2-3).

    Args:
        x: ``(B, C, *spatial)``, not modified in place.
        perm: ``(B,)`` int64, the partner of each sample.
        moments: a key of :data:`MOMENTS`.
        eps: added to the variance.

    Returns:
        Same shape and dtype as ``x``; differentiable w.r.t. ``x`` (moments included).
    """
    if moments == "pono":
        var, mean = torch.var_mean(x, dim=1, keepdim=True, correction=0)
        std = (var + eps).sqrt()
        return (x - mean) / std * std[perm] + mean[perm]
    if moments == "instance":
        mu, sigma = channel_stats(x, eps=eps)
        return restyle_channels(x, mu, sigma, mu[perm], sigma[perm])
    raise ValueError(f"moments must be one of {', '.join(MOMENTS)}, got {moments!r}")


class MixStyleLayer(nn.Module):
    """Mix feature statistics between random pairs of the batch (MixStyle, Zhou et al. 2021, Alg. 1).

    In training mode, with probability ``p`` per forward: ``lam ~ Beta(alpha, alpha)`` per sample,
    a random permutation of the batch, then :func:`mix_channel_stats`. Eval mode, ``p = 0``, a
    losing coin or a batch of one return the input itself. Draws, in order, from
    :attr:`generator`: the coin (only when ``0 < p < 1``), the permutation, the Beta seed.

    Args:
        p: probability of mixing a forward pass.
        alpha: Beta concentration (0.1 in the paper).
        eps: added to the spatial variance.
        generator: source of all draws (fedaug components set a seeded one each round).

    >>> layer = MixStyleLayer(p=1.0, generator=torch.Generator().manual_seed(0))
    >>> x = torch.randn(4, 3, 5, 5)
    >>> layer(x).shape, torch.equal(layer.eval()(x), x)
    (torch.Size([4, 3, 5, 5]), True)
    """

    def __init__(self, *, p: float = 0.5, alpha: float = 0.1, eps: float = 1e-6,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"MixStyleLayer.p must be in [0, 1], got {p}")
        if alpha <= 0:
            raise ValueError(f"MixStyleLayer.alpha must be > 0, got {alpha}")
        self.p, self.alpha, self.eps, self.generator = p, alpha, eps, generator

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0 or x.shape[0] < 2:
            return x
        g = self.generator if self.generator is not None else torch.default_generator
        if self.p < 1.0 and float(torch.rand((), generator=g, device=g.device)) >= self.p:
            return x
        perm = torch.randperm(x.shape[0], generator=g, device=g.device)
        lam = sample_beta(self.alpha, x.shape[0], g).to(x.device, x.dtype)
        return mix_channel_stats(x, perm.to(x.device), lam, eps=self.eps)


class MoExLayer(nn.Module):
    """Exchange moments between the samples of a batch (MoEx, Li et al. 2021), once per arming.

    The component that owns the layer draws the partners and mixes the labels; it calls
    :meth:`arm` before a training forward pass, and the next forward in training mode applies
    :func:`exchange_moments` and disarms. Otherwise (eval mode, not armed) it returns the input.

    Args:
        moments: a key of :data:`MOMENTS`.
        eps: added to the variance.

    >>> layer = MoExLayer()
    >>> x = torch.randn(4, 3, 5, 5)
    >>> layer.arm(torch.tensor([1, 0, 3, 2]))
    >>> layer(x).shape, torch.equal(layer(x), x)  # the second call is not armed
    (torch.Size([4, 3, 5, 5]), True)
    """

    #: a later layer at the same module would re-draw the moments MoEx exchanged, so the label mix
    #: (weight ``lam`` of the sample's own moments) would no longer describe the features.
    must_be_last: ClassVar[bool] = True

    def __init__(self, *, moments: str = "pono", eps: float = 1e-5) -> None:
        super().__init__()
        if moments not in MOMENTS:
            raise ValueError(f"MoExLayer.moments must be one of {', '.join(MOMENTS)}, got {moments!r}")
        self.moments, self.eps = moments, eps
        self._perm: Tensor | None = None

    def arm(self, perm: Tensor) -> None:
        """Exchange moments with partners ``perm`` ``(B,)`` int64 at the next training forward."""
        self._perm = perm

    def forward(self, x: Tensor) -> Tensor:
        perm, self._perm = self._perm, None
        if not self.training or perm is None:
            return x
        if perm.shape[0] != x.shape[0]:
            raise ValueError(f"MoExLayer was armed for a batch of {perm.shape[0]}, got {x.shape[0]}")
        return exchange_moments(x, perm.to(x.device), moments=self.moments, eps=self.eps)
