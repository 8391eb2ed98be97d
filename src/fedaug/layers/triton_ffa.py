"""The FFA layer's fused CUDA kernel, written in Triton (FedFA Eq. 2, 3, 7-9; VFDA Eq. 6-7).

:func:`fedaug.layers.functional.restyle` with ``kernel="on"``, a
:class:`~fedaug.layers.functional.StatNoise` map and a CUDA float32/float64 tensor runs
:func:`ffa_restyle`: the same function as the compiled CPU kernel (``csrc/ffa_restyle.cpp``, same
arguments) and as the pure-PyTorch path, in four kernel launches per layer and training step (two
forward, two backward) instead of ~45 small ATen kernels. The noise is an argument, drawn outside the
kernel from the layer's generator, so the draws are the PyTorch path's.

``x`` ``(B, C, *spatial)`` is viewed as ``R = B * C`` rows of ``N`` positions; one program per row:

* forward 1 (:func:`_row_moments`): ``mu = sum x / N``, ``sigma = sqrt(sum (x - mu)^2 / denom_n + eps)``
  (Eq. 2; two passes over the row);
* forward 2 (:func:`_restyle_forward`): the row's channel map (Eq. 3, 7, 9: :func:`_stat_scale`
  reads the channel's ``B`` statistics, a few values, so no separate launch is needed), then
  ``y = (x - mu) a + mu_hat`` with ``a = sigma_hat / sigma`` (Eq. 8);
* backward 1 (:func:`_row_grad_sums`): ``(sum g, sum g (x - mu) / sigma)``, the gradients of
  ``mu_hat`` and ``sigma_hat``;
* backward 2 (:func:`_restyle_backward`): the map's closed-form vector-Jacobian product (documented
  on :class:`~fedaug.layers.functional.StatNoise`), then ``dx = g a + k1 (x - mu) + k0``.

Nothing but ``y`` and the statistics ``z = (mu, sigma)`` ``(2, B, C)`` is written forward; the backward
recomputes the channel map from ``z``, the noise and the multipliers. Reductions accumulate in the
input's dtype in ``BLOCK_N`` lanes, then a tree sum: float64 agrees with the other paths to its
rounding, float32 in the last bits (tests/layers/test_triton_ffa.py states the tolerances).

Imported only when a CUDA layer runs with ``kernel="on"`` (:func:`fedaug.layers.kernel.triton_op`)
or by its tests: fedaug needs ``triton`` (the ``gpu`` extra; torch's CUDA wheels ship it) for
nothing else. The tests run these kernels on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

#: widest block of a row read at once; longer rows loop (a few warps per row).
MAX_BLOCK = 2048
#: narrowest block (tiny maps and batches: lanes past the row are masked).
MIN_BLOCK = 16


@triton.jit
def _stat_scale(z_ptr, param_ptr, k, row, R, B, C, denom_b, EXTRA: tl.constexpr, FIXED: tl.constexpr,
                STD: tl.constexpr, BLOCK_B: tl.constexpr):
    """For statistic ``k`` (0: mu, 1: sigma) of row ``row = b * C + c``: ``(s, coef, dev)``: the noise
    scale ``s`` of channel ``c`` (Eq. 7, 9), ``coef = 2 ds/dv / denom_b`` and ``dev = z_row - mean_b z``
    (0 and 0 for fixed scales, whose vector-Jacobian product is the identity)."""
    c = row % C
    z = tl.load(z_ptr + k * R + row)
    mult = tl.load(param_ptr + k * C + c)
    if FIXED:
        s = mult
        coef = 0.0 * mult
        dev = 0.0 * z
    else:
        ob = tl.arange(0, BLOCK_B)
        zs = tl.load(z_ptr + k * R + ob * C + c, mask=ob < B, other=0.0)
        mean = tl.sum(zs, axis=0) / B
        d = tl.where(ob < B, zs - mean, 0.0)
        f = mult * (tl.sum(d * d, axis=0) / denom_b + EXTRA)  # Eq. 3 then Eq. 7
        if STD:  # Eq. 9: s = sqrt(f), with sqrt's gradient at 0 taken as 0
            s = tl.where(f > 0, tl.sqrt(tl.where(f > 0, f, 1.0)), 0.0)
            coef = tl.where(s > 0, mult / tl.where(s > 0, s * denom_b, 1.0), 0.0)
            coef = tl.where(coef - coef == 0, coef, 0.0)  # an infinite coefficient (x - x is NaN) is 0
        else:  # VFDA Eq. 7 as printed: s = f
            s = f
            coef = mult * 2.0 / denom_b
        dev = z - mean
    return s, coef, dev


@triton.jit
def _resampled(z_ptr, noise_ptr, param_ptr, row, R, B, C, denom_b, EXTRA: tl.constexpr, FIXED: tl.constexpr,
               STD: tl.constexpr, BLOCK_B: tl.constexpr):
    """Row ``row``'s ``mu, sigma``, ``mu_hat = mu + noise_mu s_mu``, ``a = sigma_hat / sigma`` (Eq. 8-9),
    and :func:`_stat_scale`'s ``coef, dev`` of mu, then of sigma (for the backward)."""
    s_mu, coef_mu, dev_mu = _stat_scale(z_ptr, param_ptr, 0, row, R, B, C, denom_b, EXTRA, FIXED, STD, BLOCK_B)
    s_sigma, coef_sigma, dev_sigma = _stat_scale(z_ptr, param_ptr, 1, row, R, B, C, denom_b, EXTRA, FIXED, STD,
                                                 BLOCK_B)
    mu = tl.load(z_ptr + row)
    sigma = tl.load(z_ptr + R + row)
    mu_hat = mu + tl.load(noise_ptr + row) * s_mu
    sigma_hat = sigma + tl.load(noise_ptr + R + row) * s_sigma
    return mu, sigma, mu_hat, sigma_hat / sigma, coef_mu, dev_mu, coef_sigma, dev_sigma


@triton.jit
def _row_moments(x_ptr, z_ptr, R, N, denom_n, EPS: tl.constexpr, BLOCK_N: tl.constexpr):
    """``z[0, row] = mu``, ``z[1, row] = sigma`` of one row of ``x`` (Eq. 2), in two passes."""
    row = tl.program_id(0)
    base = row.to(tl.int64) * N
    lanes = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=z_ptr.dtype.element_ty)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        acc += tl.load(x_ptr + base + offs, mask=offs < N, other=0.0)
    mu = tl.sum(acc, axis=0) / N
    acc = tl.zeros([BLOCK_N], dtype=z_ptr.dtype.element_ty)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        d = tl.where(offs < N, tl.load(x_ptr + base + offs, mask=offs < N, other=0.0) - mu, 0.0)
        acc += d * d
    tl.store(z_ptr + row, mu)
    tl.store(z_ptr + R + row, tl.sqrt(tl.sum(acc, axis=0) / denom_n + EPS))


@triton.jit
def _restyle_forward(x_ptr, y_ptr, z_ptr, noise_ptr, param_ptr, R, N, B, C, denom_b, EXTRA: tl.constexpr,
                     FIXED: tl.constexpr, STD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """``y = (x - mu) a + mu_hat`` on one row (Eq. 8)."""
    row = tl.program_id(0)
    mu, _, mu_hat, a, _, _, _, _ = _resampled(z_ptr, noise_ptr, param_ptr, row, R, B, C, denom_b, EXTRA, FIXED,
                                              STD, BLOCK_B)
    base = row.to(tl.int64) * N
    lanes = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        x = tl.load(x_ptr + base + offs, mask=offs < N, other=0.0)
        tl.store(y_ptr + base + offs, (x - mu) * a + mu_hat, mask=offs < N)


@triton.jit
def _row_grad_sums(g_ptr, x_ptr, z_ptr, gh_ptr, R, N, BLOCK_N: tl.constexpr):
    """``gh[0, row] = sum g`` (dL/dmu_hat), ``gh[1, row] = sum g (x - mu) / sigma`` (dL/dsigma_hat)."""
    row = tl.program_id(0)
    mu = tl.load(z_ptr + row)
    base = row.to(tl.int64) * N
    lanes = tl.arange(0, BLOCK_N)
    acc0 = tl.zeros([BLOCK_N], dtype=z_ptr.dtype.element_ty)
    acc1 = tl.zeros([BLOCK_N], dtype=z_ptr.dtype.element_ty)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        g = tl.load(g_ptr + base + offs, mask=offs < N, other=0.0)
        x = tl.load(x_ptr + base + offs, mask=offs < N, other=0.0)
        acc0 += g
        acc1 += g * (x - mu)
    tl.store(gh_ptr + row, tl.sum(acc0, axis=0))
    tl.store(gh_ptr + R + row, tl.sum(acc1, axis=0) / tl.load(z_ptr + R + row))


@triton.jit
def _restyle_backward(g_ptr, x_ptr, z_ptr, noise_ptr, param_ptr, gh_ptr, gx_ptr, R, N, B, C, denom_b, denom_n,
                      EXTRA: tl.constexpr, FIXED: tl.constexpr, STD: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_B: tl.constexpr):
    """``dx = g a + k1 (x - mu) + k0`` on one row, from ``g_z = vjp(g_hat) - a g_hat``:
    ``k1 = g_z[sigma] / (sigma denom_n)``, ``k0 = g_z[mu] / N``."""
    row = tl.program_id(0)
    c = row % C
    mu, sigma, _, a, coef_mu, dev_mu, coef_sigma, dev_sigma = _resampled(
        z_ptr, noise_ptr, param_ptr, row, R, B, C, denom_b, EXTRA, FIXED, STD, BLOCK_B)
    gh_mu = tl.load(gh_ptr + row)
    gh_sigma = tl.load(gh_ptr + R + row)
    gz_mu = gh_mu
    gz_sigma = gh_sigma
    if not FIXED:  # the map's vector-Jacobian product: + (sum_b g_hat_b noise_b) coef dev, per statistic
        ob = tl.arange(0, BLOCK_B)
        at = ob * C + c
        g_mu = tl.load(gh_ptr + at, mask=ob < B, other=0.0)
        g_sigma = tl.load(gh_ptr + R + at, mask=ob < B, other=0.0)
        n_mu = tl.load(noise_ptr + at, mask=ob < B, other=0.0)
        n_sigma = tl.load(noise_ptr + R + at, mask=ob < B, other=0.0)
        gz_mu += dev_mu * (tl.sum(g_mu * n_mu, axis=0) * coef_mu)
        gz_sigma += dev_sigma * (tl.sum(g_sigma * n_sigma, axis=0) * coef_sigma)
    gz_mu -= gh_mu * a  # y's own dependence on mu and sigma
    gz_sigma -= gh_sigma * a
    k1 = gz_sigma / sigma / denom_n
    k0 = gz_mu / N
    base = row.to(tl.int64) * N
    lanes = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        g = tl.load(g_ptr + base + offs, mask=offs < N, other=0.0)
        x = tl.load(x_ptr + base + offs, mask=offs < N, other=0.0)
        tl.store(gx_ptr + base + offs, g * a + k1 * (x - mu) + k0, mask=offs < N)


def _block(n: int) -> int:
    return max(MIN_BLOCK, min(triton.next_power_of_2(n), MAX_BLOCK))


def _on_device(x: Tensor) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it ``x``'s (the interpreter's CPU tensors need none)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


class _TritonRestyle(torch.autograd.Function):
    """``(y, z)`` of :func:`ffa_restyle` with the exact gradient w.r.t. ``x``; not twice differentiable."""

    @staticmethod
    def forward(ctx, x: Tensor, noise: Tensor, param: Tensor, fixed: bool, std_scale: bool,  # type: ignore[override]
                correction: int, extra: float, eps: float, unbiased: bool) -> tuple[Tensor, Tensor]:
        x, noise, param = x.contiguous(), noise.contiguous(), param.contiguous()
        b, c = x.shape[:2]
        r, n = b * c, x.numel() // (b * c)
        denom_n = n - 1 if unbiased and n > 1 else n
        # every launch: a few warps per row (one for short rows); fused multiply-adds (as ATen's CUDA
        # kernels; Triton's default for them is changing, so it is fixed here)
        rows = {"BLOCK_N": _block(n), "num_warps": max(1, min(_block(n) // 256, 8)), "enable_fp_fusion": True}
        maps = {"denom_b": max(b - correction, 1), "EXTRA": 0.0 if fixed else extra, "FIXED": fixed,
                "STD": std_scale, "BLOCK_B": _block(b), **rows}
        z = x.new_empty((2, b, c))
        y = torch.empty_like(x)
        with _on_device(x):
            _row_moments[(r,)](x, z, r, n, denom_n, EPS=eps, **rows)
            _restyle_forward[(r,)](x, y, z, noise, param, r, n, b, c, **maps)
        ctx.save_for_backward(x, z, noise, param)
        ctx.rows, ctx.maps, ctx.denom_n = rows, maps, denom_n
        ctx.mark_non_differentiable(z)
        return y, z

    @staticmethod
    @once_differentiable
    def backward(ctx, gy: Tensor, _gz: Tensor):  # type: ignore[override]
        x, z, noise, param = ctx.saved_tensors
        gy = gy.contiguous()
        b, c = x.shape[:2]
        r, n = b * c, x.numel() // (b * c)
        gh = torch.empty_like(z)
        gx = torch.empty_like(x)
        with _on_device(x):
            _row_grad_sums[(r,)](gy, x, z, gh, r, n, **ctx.rows)
            _restyle_backward[(r,)](gy, x, z, noise, param, gh, gx, r, n, b, c, denom_n=ctx.denom_n, **ctx.maps)
        return gx, None, None, None, None, None, None, None, None


def ffa_restyle(x: Tensor, noise: Tensor, param: Tensor, fixed: bool, std_scale: bool, correction: int,
                extra: float, eps: float, unbiased: bool) -> tuple[Tensor, Tensor]:
    """The fused FFA re-styling on a CUDA tensor (or a CPU one under ``TRITON_INTERPRET=1``).

    The arguments of ``torch.ops.fedaug.ffa_restyle``, the compiled CPU kernel, and the same function.

    Args:
        x: features ``(B, C, *spatial)``, float32 or float64; not modified.
        noise: ``(2, B, C)`` standard normal draws (means, then stds), ``x``'s dtype and device.
        param: ``(2, C)``: the fixed noise scales (``fixed``) or the multipliers ``k`` of the batch
            variances (Eq. 7), ``x``'s dtype and device.
        fixed: ``param`` holds fixed scales (FedFA-R).
        std_scale: the noise scale is ``sqrt(k v)`` (FedFA Eq. 9), else ``k v`` (VFDA Eq. 7 as printed).
        correction: 1 for the unbiased batch variance, 0 for ``1/B`` (ignored for ``B = 1``).
        extra: added to the batch variances.
        eps: added to the spatial variance before the square root.
        unbiased: spatial variance over ``N - 1`` positions instead of ``N``.

    Returns:
        ``(y, z)``: ``y`` like ``x``, differentiable w.r.t. ``x`` (once); ``z`` ``(2, B, C)`` the
        statistics ``(mu, sigma)`` (Eq. 2), not differentiable.
    """
    return _TritonRestyle.apply(x, noise, param, fixed, std_scale, correction, extra, eps, unbiased)
