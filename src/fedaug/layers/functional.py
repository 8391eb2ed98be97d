"""Pure tensor functions of feature-statistics augmentation (FedFA, ICLR 2023, arXiv:2301.12995;
VFDA, Fed. 3D segmentation). Layouts: features ``(B, C, *spatial)`` with any spatial rank (1D
``(B, C, L)``, 2D ``(B, C, H, W)``, 3D ``(B, C, H, W, S)``); statistics ``(B, C)``; per-channel
quantities ``(C,)``. Nothing here draws random numbers: noise is an argument.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.layers import kernel as compiled


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


def channel_view(t: Tensor, x: Tensor) -> Tensor:
    """``(C,)`` or ``(B, C)`` statistics viewed to broadcast against ``x (B, C, *spatial)``."""
    lead = (1, -1) if t.dim() == 1 else tuple(t.shape)
    return t.reshape(*lead, *([1] * (x.dim() - 2)))


def normalize_channels(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``(x - mean) / std`` per channel (FedRDN Eq. 3, 6 and 7).

    Args:
        x: ``(B, C, *spatial)``, not modified in place.
        mean, std: ``(C,)`` for one pair for the whole batch, or ``(B, C)`` for one pair per sample.

    Returns:
        Same shape and dtype as ``x``.
    """
    return (x - channel_view(mean, x)) / channel_view(std, x)


def restyle_channels(x: Tensor, mean: Tensor, std: Tensor, new_mean: Tensor, new_std: Tensor) -> Tensor:
    """``new_std * (x - mean) / std + new_mean`` per channel with plain autograd operations (FedFA
    Eq. 8 given its statistics; MixStyle's and MoEx's re-styling).

    Args:
        x: ``(B, C, *spatial)``, not modified in place.
        mean, std, new_mean, new_std: each ``(C,)`` or ``(B, C)``.

    Returns:
        Same shape and dtype as ``x``.
    """
    return normalize_channels(x, mean, std) * channel_view(new_std, x) + channel_view(new_mean, x)


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


def momentum_update(running: Tensor, stat: Tensor, momentum: float) -> Tensor:
    """``running <- momentum * running + (1 - momentum) * mean_b(stat)`` in place (FedFA Eq. 4;
    VFDA Eq. 4 with eta).

    Args:
        running: ``(C,)`` running statistic, updated in place.
        stat: ``(B, C)`` this batch's statistics (detach them first: no gradient flows here).
        momentum: weight of the old value, in ``[0, 1]``.

    Returns:
        ``running``.
    """
    return running.mul_(momentum).add_(stat.mean(0), alpha=1.0 - momentum)


#: vector-Jacobian product of a statistics map: ``dL/dz_hat -> dL/dz``, both ``(2, B, C)``.
StatsVJP = Callable[[Tensor], Tensor]
#: maps the batch's statistics ``z = (mu, sigma)`` stacked ``(2, B, C)`` to new ones of the same
#: shape, and returns their vector-Jacobian product: ``(z_hat, vjp)``.
StatsMap = Callable[[Tensor], tuple[Tensor, StatsVJP]]


def _identity_vjp(g: Tensor) -> Tensor:
    return g


class StatNoise:
    """Re-parameterised resampling of the statistics (FedFA Eq. 3, 7, 9; VFDA Eq. 7), a :data:`StatsMap`.

    For each statistic ``z`` in ``(mu, sigma)`` (``(B, C)``): ``z_hat = z + noise * s``, with
    ``s`` ``(C,)`` either given (``scale``: fixed scales, FedFA-R) or computed from the batch
    variance ``v = sum_b (z_b - mean_b z)^2 / (B - correction) + extra`` (Eq. 3) and a
    per-channel multiplier ``k`` (``mult``): the sampling variance is ``f = k v`` (Eq. 7 with
    ``k = gamma + 1``; products and FedFA-C use other ``k``), and ``s = sqrt(f)`` (``"std"``,
    Eq. 9) or ``s = f`` (``"variance"``, VFDA Eq. 7 as printed). The vector-Jacobian product is
    the closed form ``dL/dz = G + (2 / (B - correction)) (sum_b G_b noise_b) ds/dv (z - mean_b z)``
    (``G = dL/dz_hat``), exact and far cheaper than an autograd graph on ``(B, C)`` tensors; the
    square root's gradient at ``f = 0`` is taken as 0 (no NaN for a batch of one). Called on a ``z``
    that requires grad, ``z_hat`` is also an autograd function of ``z`` (what :func:`restyle`'s
    double backward differentiates).

    Args:
        noise: ``(2, B, C)`` standard normal draws (means, then stds).
        scale: ``(2, C)`` fixed noise scales, or ``None``.
        mult: ``(2, C)`` multipliers ``k`` of the batch variances, or ``None`` (exactly one of
            ``scale`` and ``mult``).
        noise_scale: ``"std"`` or ``"variance"`` (with ``mult``).
        correction: 1 for the unbiased batch variance (public code), 0 for the paper's ``1/B``;
            ignored for ``B = 1``.
        extra: added to the batch variances (the public code's 1e-6).

    Attributes (after a direct call ``sn(z)`` with ``mult``; the fused kernel of :func:`restyle` does
    not set them):
        variance: ``(2, C)`` the client-specific variances of Eq. 3 (``v``).
        fused: ``(2, C)`` the sampling variances ``f`` (Eq. 7).
    """

    def __init__(self, noise: Tensor, *, scale: Tensor | None = None, mult: Tensor | None = None,
                 noise_scale: str = "std", correction: int = 0, extra: float = 0.0) -> None:
        if (scale is None) == (mult is None):
            raise ValueError("StatNoise needs exactly one of scale= and mult=")
        self.noise, self.scale, self.mult = noise, scale, mult
        self.noise_scale, self.correction, self.extra = noise_scale, correction, extra

    def __call__(self, z: Tensor) -> tuple[Tensor, StatsVJP]:
        """``z`` ``(2, B, C)`` -> ``(z_hat, vjp)``."""
        if self.scale is not None:
            return torch.addcmul(z, self.noise, self.scale.unsqueeze(1)), _identity_vjp
        denom = max(z.shape[1] - self.correction, 1)
        dev = z - z.mean(1, keepdim=True)
        self.variance = torch.linalg.vecdot(dev, dev, dim=1).div_(denom)  # torch.var is slow on CPU
        if self.extra:
            self.variance.add_(self.extra)
        self.fused = self.mult * self.variance  # >= 0
        if self.noise_scale == "std":
            positive = self.fused > 0  # sqrt's gradient at 0 is taken as 0 (also under autograd)
            s = torch.where(positive, torch.where(positive, self.fused, 1.0).sqrt(), 0.0)
            coef = (self.mult / (s * denom)).nan_to_num_(0.0, 0.0, 0.0)  # 2 ds/dv / denom; 0 where s = 0
        else:
            s, coef = self.fused, self.mult * (2.0 / denom)
        noise = self.noise

        def vjp(g: Tensor) -> Tensor:
            return torch.addcmul(g, dev, torch.linalg.vecdot(g, noise, dim=1).mul_(coef).unsqueeze(1))

        return torch.addcmul(z, noise, s.unsqueeze(1)), vjp


def autograd_map(fn: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> StatsMap:
    """Turn any differentiable ``(mu, sigma) -> (mu_hat, sigma_hat)`` (all ``(B, C)``) into a
    :data:`StatsMap` whose vector-Jacobian product is taken by autograd (slower than a closed form
    such as :class:`StatNoise`; tensors ``fn`` closes over get no gradient)."""

    def stats_map(z: Tensor) -> tuple[Tensor, StatsVJP]:
        attached = z.requires_grad  # restyle's double backward: z_hat must stay a function of z
        with torch.enable_grad():
            z_l = z if attached else z.detach().requires_grad_()
            z_hat = torch.stack(fn(z_l[0], z_l[1]))

        def vjp(g: Tensor) -> Tensor:
            if not z_hat.requires_grad:
                return torch.zeros_like(z)
            (grad,) = torch.autograd.grad(z_hat, z_l, g, allow_unused=True, retain_graph=True)
            return torch.zeros_like(z) if grad is None else grad

        return (z_hat if attached else z_hat.detach()), vjp

    return stats_map


#: rows at least this long take their variance from ATen's batch-norm reduction (no temporary the
#: size of the input); shorter rows from a plain two-pass (fewer calls, and the temporary is small).
_FUSED_MOMENTS_MIN = 64


def _instance_moments(flat: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and biased variance over the last dim of ``flat`` ``(1, R, N)``, each ``(R,)``.

    The two-pass algorithm (``m = sum(x) / N``, then ``sum((x - m)^2) / N``), several times faster
    on CPU than ``torch.var_mean`` over the last dim. For long rows the second pass is
    ``native_batch_norm_backward`` with ``grad = x`` and mean ``m``, which returns
    ``sum(x * (x - m)) = sum((x - m)^2)`` (as ``sum(x - m) = 0``) without a temporary. Its weight
    is given (ones; it scales only the input gradient, not computed here): CUDA's kernel shapes the
    weight gradient after it and fails on an absent one.
    """
    n = flat.shape[-1]
    mean = flat.sum(-1).view(-1).div_(n)
    if n < _FUSED_MOMENTS_MIN:
        dev = flat.view(-1, n) - mean.unsqueeze(1)
        return mean, torch.linalg.vecdot(dev, dev).div_(n)
    ones = torch.ones_like(mean)
    _, sq, _ = torch.ops.aten.native_batch_norm_backward(
        flat, flat, ones, None, None, mean, ones, True, 0.0, [False, True, False])
    return mean, sq.div_(n).clamp_min_(0.0)


class _Restyle(torch.autograd.Function):
    """``y = sigma_hat * (x - mu) / sigma + mu_hat`` with ATen's per-channel batch-norm kernels.

    ``x`` is viewed as ``(1, B * C, N)``, so each sample's channel is one batch-norm "channel".
    Forward: the statistics (:func:`_instance_moments`), the :data:`StatsMap`, then one pass of
    evaluation-mode batch norm with mean ``mu``, variance 1, weight ``a = sigma_hat / sigma`` and
    bias ``mu_hat`` (ATen's vectorised per-channel affine kernel; a broadcasting ``addcmul``
    falls back to a scalar loop). Backward: one reduction pass (``sum g``, ``sum g (x - mu)`` from
    ``native_batch_norm_backward``), the map's vector-Jacobian product (which couples the samples
    through the batch variances; nothing is detached, gradients are exact), then
    ``dx = g * a + k1 (x - mu) + k0`` in two vectorised passes. An unbiased spatial variance
    (``N - 1``) is the biased one times ``N / (N - 1)``. Under ``create_graph`` (a second
    derivative will be taken, as FedMix's input gradient does) the backward instead recomputes ``y``
    with plain autograd operations (:func:`channel_stats`, the map on an attached ``z``, the same
    noise) and differentiates that, so the gradient is itself differentiable.
    """

    @staticmethod
    def forward(ctx, x: Tensor, fn: StatsMap, eps: float, unbiased: bool):  # type: ignore[override]
        b_, c_ = x.shape[:2]
        n = x.numel() // (b_ * c_)
        denom = n - 1 if unbiased and n > 1 else n
        flat = x.reshape(1, b_ * c_, n)
        mean, var = _instance_moments(flat)
        if denom != n:
            var.mul_(n / denom)
        z = torch.stack((mean, var.add_(eps).sqrt_())).view(2, b_, c_)  # (mu, sigma), Eq. 2
        z_hat, vjp = fn(z)
        a = z_hat[1] / z[1]
        ones = torch.ones_like(mean)
        y = torch.batch_norm(flat, a.view(-1), z_hat[0].reshape(-1), mean, ones, False, 0.0, 0.0, False)
        ctx.save_for_backward(x, mean)
        ctx.stats, ctx.vjp, ctx.n, ctx.denom = (z, a, ones), vjp, n, denom
        ctx.fn, ctx.eps, ctx.unbiased = fn, eps, unbiased
        ctx.mark_non_differentiable(z)
        return y.view_as(x), z

    @staticmethod
    def backward(ctx, gy: Tensor, _gz: Tensor):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph: the gradient must be differentiable again
            return _Restyle.differentiable_backward(ctx, gy), None, None, None
        x, mean = ctx.saved_tensors
        z, a, ones = ctx.stats
        flat_g, flat_x = gy.reshape(1, -1, ctx.n), x.reshape(1, -1, ctx.n)
        _, g_centred, g_sum = torch.ops.aten.native_batch_norm_backward(
            flat_g, flat_x, ones, None, None, mean, ones, True, 0.0, [False, True, True])
        g_hat = torch.stack((g_sum, g_centred)).view_as(z)
        g_hat[1].div_(z[1])  # dL/dmu_hat = sum g, dL/dsigma_hat = sum g (x - mu) / sigma
        g_z = ctx.vjp(g_hat).addcmul_(g_hat, a, value=-1)  # y's own dependence: -a, -a (x - mu) / sigma
        k1 = g_z[1].div_(z[1]).div_(ctx.denom)  # d sigma / d x = (x - mu) / (denom * sigma)
        gx = torch.batch_norm(flat_x, k1.view(-1), g_z[0].reshape(-1).div_(ctx.n), mean, ones,
                              False, 0.0, 0.0, False)  # d mu / d x = 1 / n
        gx.addcmul_(flat_g, a.view(1, -1, 1))
        return gx.view_as(x), None, None, None

    @staticmethod
    def differentiable_backward(ctx, gy: Tensor) -> Tensor:
        """``dL/dx`` as an autograd function of ``x`` and ``gy`` (both ``(B, C, *spatial)``): ``y``
        (Eq. 8) recomputed from :func:`channel_stats` and the map with plain operations."""
        x, _ = ctx.saved_tensors
        with torch.enable_grad():
            y, _, _ = restyle_autograd(x, ctx.fn, eps=ctx.eps, unbiased=ctx.unbiased)
            (gx,) = torch.autograd.grad(y, x, gy, create_graph=True)
        return gx


def restyle_autograd(x: Tensor, fn: StatsMap, *, eps: float = 1e-6, unbiased: bool = False
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`restyle` with plain autograd operations (:func:`channel_stats`, the map on attached
    statistics, :func:`restyle_channels`): differentiable any number of times, and traceable by
    ``torch.func`` transforms (``vmap`` over grouped clients), which :class:`_Restyle` is not. Equal to
    :func:`restyle` up to float rounding.

    Args:
        x: features ``(B, C, *spatial)``, not modified in place.
        fn: a :data:`StatsMap` (its vector-Jacobian product is not used: autograd differentiates the map).
        eps, unbiased: as :func:`restyle`.

    Returns:
        ``(y, mu, sigma)``: ``y`` like ``x``; ``mu, sigma`` ``(B, C)`` detached.
    """
    mu, sigma = channel_stats(x, eps=eps, unbiased=unbiased)
    z_hat, _ = fn(torch.stack((mu, sigma)))
    return restyle_channels(x, mu, sigma, z_hat[0], z_hat[1]), mu.detach(), sigma.detach()


#: dtypes the fused kernels (:mod:`fedaug.layers.kernel`) handle; others take :class:`_Restyle`.
_KERNEL_DTYPES = (torch.float32, torch.float64)


def check_kernel(value: str, owner: str = "kernel") -> str:
    """``value`` if it is one of :data:`fedaug.layers.kernel.MODES`, else a :class:`ConfigError` naming ``owner``."""
    if value not in compiled.MODES:
        raise ConfigError(f"{owner} must be one of {', '.join(compiled.MODES)}, got {value!r}: \"off\" is the "
                          "pure-PyTorch path (the same numbers on every machine), \"on\" the fused kernel "
                          "(compiled C++ on the CPU, Triton on CUDA), \"triton\" the Triton kernel on any device "
                          "(CUDA, or a CPU under TRITON_INTERPRET=1)")
    return value


def restyle(x: Tensor, fn: StatsMap, *, eps: float = 1e-6, unbiased: bool = False,
            kernel: str = "off") -> tuple[Tensor, Tensor, Tensor]:
    """Replace each sample's channel statistics by ``fn(mu, sigma)`` (FedFA Eq. 8; VFDA Eq. 6).

    Computes ``mu, sigma`` (Eq. 2) once, calls ``fn`` on them (stacked), and returns
    ``sigma_hat * (x - mu) / sigma + mu_hat`` with exact gradients w.r.t. ``x`` (through ``fn``'s
    vector-Jacobian product, so ``fn`` may couple the samples, e.g. through batch variances).
    With ``kernel="on"``, a :class:`StatNoise` map on a float32/float64 tensor runs the device's
    fused kernel (:mod:`fedaug.layers.kernel`; same function, one autograd node): on the CPU the
    compiled C++ kernel, on CUDA the Triton kernel (:func:`fedaug.layers.triton_op.ffa_restyle`);
    with ``kernel="triton"``, the Triton kernel on any device (a CPU needs Triton's interpreter);
    anything else (``kernel="off"``, other maps, devices or dtypes, tracing by ``torch.compile``) runs
    :class:`_Restyle`. They agree to float rounding; in float32 that rounding differs, so a
    long training run on one path does not reproduce a run on another. The pure-PyTorch path
    supports double backward (FedMix combined with FedFA or VFDA); the fused kernels do not.

    Args:
        x: features ``(B, C, *spatial)``, not modified in place.
        fn: a :data:`StatsMap` on ``(mu, sigma)`` stacked ``(2, B, C)``: :class:`StatNoise`, or
            any differentiable map wrapped by :func:`autograd_map`.
        eps: added to the spatial variance before the square root.
        unbiased: spatial variance over ``N - 1`` positions (public code) instead of ``N``.
        kernel: ``"off"`` (the pure-PyTorch path), ``"on"`` (the device's fused kernel where it
            applies) or ``"triton"`` (the Triton kernel where it applies).

    Returns:
        ``(y, mu, sigma)``: ``y`` like ``x``; ``mu, sigma`` ``(B, C)`` detached (for running statistics).

    Raises:
        ConfigError: ``kernel`` is not one of :data:`fedaug.layers.kernel.MODES`, or ``"triton"`` where
            the Triton kernel cannot run (:func:`fedaug.layers.kernel.check_triton_device`).
        fedaug.layers.kernel.KernelBuildError: the kernel cannot be built (CPU) or triton cannot be
            imported.
    """
    _check_features(x)
    check_kernel(kernel)
    fusable = (kernel != "off" and type(fn) is StatNoise and x.dtype in _KERNEL_DTYPES
               and not torch.compiler.is_compiling())
    if kernel == "triton" and fusable:
        compiled.check_triton_device(x.device, "kernel")
        op = compiled.triton_op()
    elif fusable and x.device.type in compiled.FUSED_DEVICES:
        op = compiled.fused_op(x.device.type)
    else:
        op = None
    if op is None:
        y, z = _Restyle.apply(x, fn, eps, unbiased)
    else:
        fixed = fn.scale is not None
        param = fn.scale if fixed else fn.mult
        y, z = op(x, fn.noise.to(x.dtype), param.to(x.dtype), fixed, fn.noise_scale == "std", fn.correction,
                  fn.extra, eps, unbiased)
    return y, z[0], z[1]


def perturb_channel_stats(x: Tensor, var_mu: Tensor, var_sigma: Tensor, *, noise_mu: Tensor,
                          noise_sigma: Tensor, eps: float = 1e-6, kernel: str = "off") -> Tensor:
    """Resample each instance's channel mean/std with given variances (FedFA Eq. 8-9).

    Args:
        x: ``(B, C, *spatial)``, not modified in place.
        var_mu, var_sigma: ``(C,)`` sampling variances of the mean and the std (e.g. Eq. 7).
        noise_mu, noise_sigma: ``(B, C)`` standard normal draws.
        eps: added to the spatial variance.
        kernel: ``"off"`` (pure PyTorch), ``"on"`` (the fused kernel) or ``"triton"``, as in :func:`restyle`.

    Returns:
        Same shape and dtype as ``x``; differentiable w.r.t. ``x`` (re-parameterised, Eq. 9).
    """
    scale = torch.stack((var_mu, var_sigma)).clamp_min(0.0).sqrt()
    return restyle(x, StatNoise(torch.stack((noise_mu, noise_sigma)), scale=scale), eps=eps, kernel=kernel)[0]
