"""Pure tensor functions of feature-statistics augmentation (FedFA, ICLR 2023, arXiv:2301.12995;
VFDA, Fed. 3D segmentation). Layouts: features ``(B, C, *spatial)`` with any spatial rank (1D
``(B, C, L)``, 2D ``(B, C, H, W)``, 3D ``(B, C, H, W, S)``); statistics ``(B, C)``; per-channel
quantities ``(C,)``. Nothing here draws random numbers: noise is an argument.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

#: maps the batch's statistics ``(mu, sigma)``, each ``(B, C)``, to new ones of the same shape.
StatsMap = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def _check_features(x: Tensor) -> None:
    if x.dim() < 3:
        raise ValueError(
            f"features must be (B, C, *spatial) with at least one spatial dim, got shape {tuple(x.shape)}; "
            "add a trailing singleton dim (x.unsqueeze(-1)) for (B, C) features"
        )


def channel_stats(x: Tensor, *, eps: float = 1e-6, unbiased: bool = False) -> tuple[Tensor, Tensor]:
    """Per-sample, per-channel mean and standard deviation over spatial positions (FedFA Eq. 2).

    Args:
        x: features ``(B, C, *spatial)``.
        eps: added to the variance before the square root (keeps ``sigma > 0``).
        unbiased: divide the spatial variance by ``N - 1`` (the public code) instead of ``N``
            (the paper); a single position (``N = 1``) always divides by 1.

    Returns:
        ``mu, sigma``, each ``(B, C)``, differentiable w.r.t. ``x``.
    """
    _check_features(x)
    dims = tuple(range(2, x.dim()))
    n = x[0, 0].numel()
    var, mu = torch.var_mean(x, dim=dims, correction=int(unbiased and n > 1))
    return mu, (var + eps).sqrt()


def batch_variance(stat: Tensor, *, unbiased: bool = False, eps: float = 0.0) -> Tensor:
    """Variance over the batch of one statistic: client-specific variance (FedFA Eq. 3).

    Args:
        stat: ``(B, C)`` per-sample statistics (``mu`` or ``sigma``).
        unbiased: divide by ``B - 1`` (public code) instead of ``B`` (paper); ``B = 1`` gives 0.
        eps: added to the result (the public code adds 1e-6).

    Returns:
        ``(C,)``, differentiable w.r.t. ``stat``.
    """
    correction = int(unbiased and stat.shape[0] > 1)
    return torch.var(stat, dim=0, correction=correction) + eps


def client_sharing_variance(stats: Tensor, *, per_channel: bool = True, unbiased: bool = False) -> Tensor:
    """Variance of the clients' running statistics (FedFA Eq. 5; VFDA Eq. 5).

    Args:
        stats: ``(M, C)``: one running statistic (``mu_bar`` or ``sigma_bar``) per client.
        per_channel: the paper's per-channel variance over clients; ``False`` reproduces the
            public code, one scalar over all ``M * C`` entries broadcast to every channel.
        unbiased: divide by ``M - 1`` (or ``M * C - 1``) instead of ``M``; ``M = 1`` gives 0.

    Returns:
        ``(C,)``, same dtype as ``stats``.
    """
    m, c = stats.shape
    if per_channel:
        return torch.var(stats, dim=0, correction=int(unbiased and m > 1))
    return torch.var(stats, correction=int(unbiased and m * c > 1)).expand(c).clone()


def t_modulation(var: Tensor, *, eps: float = 0.0) -> Tensor:
    """Student's-t (one degree of freedom) modulation of client-sharing variances (FedFA Eq. 6).

    ``gamma_j = C a_j / sum_c a_c`` with ``a_j = (1 + 1 / (var_j + eps))^-1``, computed as
    ``v / (1 + v)`` (``v = var + eps``) so that a zero variance gives ``a = 0``, not a division by
    zero. ``gamma`` sums to ``C`` and increases with the variance. When every ``a`` is zero (all
    clients agree exactly, or a single client), Eq. 6 is 0/0; its limit for equal variances,
    ``gamma = 1`` for every channel, is returned.

    Args:
        var: ``(C,)`` non-negative variances.
        eps: added to ``var`` (the public code uses 1e-6; the paper 0).

    Returns:
        ``(C,)`` gamma.
    """
    v = var + eps
    a = v / (1.0 + v)
    total = a.sum()
    if not bool(total > 0):
        return torch.ones_like(var)
    return var.shape[0] * a / total


def safe_sqrt(v: Tensor) -> Tensor:
    """``sqrt(v)`` for ``v >= 0`` whose gradient at ``v = 0`` is 0 instead of inf (no NaN)."""
    positive = v > 0
    return torch.where(positive, v.clamp_min(torch.finfo(v.dtype).tiny).sqrt(), torch.zeros_like(v))


def momentum_update(running: Tensor, stat: Tensor, momentum: float) -> Tensor:
    """``momentum * running + (1 - momentum) * mean_b(stat)`` (FedFA Eq. 4; VFDA Eq. 4 with eta).

    Args:
        running: ``(C,)`` running statistic.
        stat: ``(B, C)`` this batch's statistics (detach them first: no gradient flows here).
        momentum: weight of the old value, in ``[0, 1]``.

    Returns:
        ``(C,)`` new running statistic (a new tensor).
    """
    return momentum * running + (1.0 - momentum) * stat.mean(0)


def sample_stats(mu: Tensor, sigma: Tensor, scale_mu: Tensor, scale_sigma: Tensor,
                 noise_mu: Tensor, noise_sigma: Tensor) -> tuple[Tensor, Tensor]:
    """Re-parameterised sampling of new statistics (FedFA Eq. 9; VFDA Eq. 7).

    ``mu_hat = mu + noise_mu * scale_mu``, ``sigma_hat = sigma + noise_sigma * scale_sigma``.

    Args:
        mu, sigma: ``(B, C)`` original statistics.
        scale_mu, scale_sigma: ``(C,)`` noise scales (FedFA: the fused standard deviations
            ``sqrt(Eq. 7)``; VFDA's Eq. 7 as printed: the fused variances).
        noise_mu, noise_sigma: ``(B, C)`` standard normal draws.

    Returns:
        ``mu_hat, sigma_hat``, each ``(B, C)``, differentiable w.r.t. every input.
    """
    return mu + noise_mu * scale_mu, sigma + noise_sigma * scale_sigma


class _Restyle(torch.autograd.Function):
    """``y = sigma_hat * (x - mu) / sigma + mu_hat`` with ATen's fused batch-norm kernels.

    ``x`` is viewed as ``(1, B * C, N)``, so batch normalisation of that view is instance
    normalisation: ``native_batch_norm`` gives ``(x - mu) / sigma`` and the statistics in one
    kernel, re-styled in place; the backward pass takes both reductions (``sum g (x - mu) / sigma``,
    ``sum g``) from ``native_batch_norm_backward`` and builds ``dx`` with two fused multiply-adds,
    ``dx = g * a + x * k1 + k0``. The small ``(B, C)`` graph from ``(mu, sigma)`` to
    ``y = x * a + b`` (which couples the samples through the batch variances) is differentiated by
    autograd, so gradients are exact and nothing is detached. Double backward is not supported.
    An unbiased spatial variance (``N - 1``) is the biased one with ``eps * (N - 1) / N``, rescaled.
    """

    @staticmethod
    def forward(ctx, x: Tensor, fn: StatsMap, eps: float, unbiased: bool):  # type: ignore[override]
        b_, c_ = x.shape[:2]
        n = x[0, 0].numel()
        ratio = (n - 1) / n if unbiased and n > 1 else 1.0  # denominator / N
        flat = x.reshape(1, b_ * c_, n)
        xhat, mean, invstd = torch.native_batch_norm(flat, None, None, None, None, True, 0.0, eps * ratio)
        mu = mean.view(b_, c_)
        sigma = invstd.reciprocal().view(b_, c_) / ratio**0.5  # sqrt(var_N * N / denom + eps)
        with torch.enable_grad():
            mu_l = mu.detach().requires_grad_()
            sigma_l = sigma.detach().requires_grad_()
            mu_hat, sigma_hat = fn(mu_l, sigma_l)
            a = sigma_hat / sigma_l
            b = mu_hat - mu_l * a
        scale = (sigma_hat.detach() * ratio**0.5).reshape(1, -1, 1)
        y = torch.addcmul(mu_hat.detach().reshape(1, -1, 1), xhat, scale, out=xhat)  # in place: one pass
        ctx.save_for_backward(x, mean, invstd)
        ctx.graph = (mu_l, sigma_l, a, b)
        ctx.n, ctx.ratio, ctx.eps = n, ratio, eps
        ctx.mark_non_differentiable(mu, sigma)
        return y.view_as(x), mu, sigma

    @staticmethod
    @once_differentiable
    def backward(ctx, gy: Tensor, _gmu: Tensor, _gsigma: Tensor):  # type: ignore[override]
        x, mean, invstd = ctx.saved_tensors
        mu_l, sigma_l, a, b = ctx.graph
        shape = (*a.shape, *([1] * (x.dim() - 2)))
        flat_g, flat_x = gy.reshape(1, -1, ctx.n), x.reshape(1, -1, ctx.n)
        _, g_xhat, g_sum = torch.ops.aten.native_batch_norm_backward(
            flat_g, flat_x, None, None, None, mean, invstd, True, ctx.eps * ctx.ratio, [False, True, True])
        ga = (g_xhat / invstd + mean * g_sum).view_as(a)  # sum over positions of gy * x
        gb = g_sum.view_as(b)
        gmu, gsigma = torch.autograd.grad((a, b), (mu_l, sigma_l), (ga, gb), allow_unused=True,
                                          retain_graph=True)  # small (B, C) graph; backward may rerun
        gmu = torch.zeros_like(mu_l) if gmu is None else gmu
        gsigma = torch.zeros_like(sigma_l) if gsigma is None else gsigma
        mu, sigma = mu_l.detach(), sigma_l.detach()
        k1 = gsigma / (ctx.n * ctx.ratio * sigma)  # d sigma / d x = (x - mu) / (denom * sigma)
        k0 = gmu / ctx.n - k1 * mu  # d mu / d x = 1 / n
        gx = torch.addcmul(k0.view(shape), x, k1.view(shape))
        gx.addcmul_(gy, a.detach().view(shape))
        return gx, None, None, None


def restyle(x: Tensor, fn: StatsMap, *, eps: float = 1e-6, unbiased: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Replace each sample's channel statistics by ``fn(mu, sigma)`` (FedFA Eq. 8; VFDA Eq. 6).

    Computes ``mu, sigma`` (Eq. 2) once, calls ``fn`` on them (inside autograd, so ``fn`` may
    couple the samples, e.g. through batch variances), and returns
    ``sigma_hat * (x - mu) / sigma + mu_hat`` with exact gradients w.r.t. ``x``.

    Args:
        x: features ``(B, C, *spatial)``, not modified in place.
        fn: ``(mu, sigma) -> (mu_hat, sigma_hat)``, all ``(B, C)``; tensors it closes over get no
            gradient.
        eps: added to the spatial variance before the square root.
        unbiased: spatial variance over ``N - 1`` positions (public code) instead of ``N``.

    Returns:
        ``(y, mu, sigma)``: ``y`` like ``x``; ``mu, sigma`` ``(B, C)`` detached (for running statistics).
    """
    _check_features(x)
    return _Restyle.apply(x, fn, eps, unbiased)


def perturb_channel_stats(x: Tensor, var_mu: Tensor, var_sigma: Tensor, *, noise_mu: Tensor,
                          noise_sigma: Tensor, eps: float = 1e-6) -> Tensor:
    """Resample each instance's channel mean/std with given variances (FedFA Eq. 8-9).

    Args:
        x: ``(B, C, *spatial)``, not modified in place.
        var_mu, var_sigma: ``(C,)`` sampling variances of the mean and the std (e.g. Eq. 7).
        noise_mu, noise_sigma: ``(B, C)`` standard normal draws.
        eps: added to the spatial variance.

    Returns:
        Same shape and dtype as ``x``; differentiable w.r.t. ``x`` (re-parameterised, Eq. 9).
    """
    def fn(mu: Tensor, sigma: Tensor) -> tuple[Tensor, Tensor]:
        return sample_stats(mu, sigma, safe_sqrt(var_mu), safe_sqrt(var_sigma), noise_mu, noise_sigma)

    return restyle(x, fn, eps=eps)[0]
