"""The FFA layer's Triton kernels (FedFA Eq. 2-4, 7-9; VFDA Eq. 4, 6-7): one launch forward, one backward.

:mod:`fedaug.layers.triton_op` wraps them as torch operators (autograd, ``vmap``, tracing); this
module holds the kernels and their launches. Features come grouped: ``x`` ``(G, B, C, *spatial)``, G
clients trained at once (G = 1 for one layer), each client's ``B * C`` rows of ``N`` positions. One
program per client and channel, grid ``(C, G)``: it holds that channel's ``B`` rows, so the batch
statistics of Eq. 3 (over the B samples of one channel) need no second launch. Per launch:

* forward (:func:`_ffa_forward`): the rows' statistics (Eq. 2, two passes), the coin of Alg. 2 line
  1 and the noise of Eq. 9 (Philox, below), the channel's map (Eq. 3, 7, 9), the re-styling (Eq. 8)
  where the coin wins and ``x`` itself where it loses, and the running statistics (Eq. 4);
* backward (:func:`_ffa_backward`): the rows' gradient sums, the map's closed-form vector-Jacobian
  product (documented on :class:`~fedaug.layers.functional.StatNoise`), ``dx``.

Randomness (the layer's path, ``LAYER``): a client's ``seed`` and ``offset`` are int64 device tensors.
Every program adds 1 to ``offset`` with an atomic (the launch's only write to it) and reads the old
value, ``arrival``; forward ``f = arrival // C`` (the same for the C programs of a launch: the offset
starts at 0 and grows by C per forward) draws from Philox counters ``(f << 32) + j``: ``j = 0`` the
coin (``tl.rand < p``, one for the whole batch), ``j = 1 + b C + c`` the standard normal noise of
sample ``b``, channel ``c``: the Box-Muller pair of the counter's first two outputs (as ``tl.randn``
makes one), for the mean, then the std. So the same seed and offset (a multiple of C) give the same
draws, no host reads a value, and a replayed CUDA graph draws anew, since its offset advanced. The
last arrival (``arrival % C == C - 1``: every program of the client has read the client's state)
replaces the first-batch weight by the momentum (below). The noise drawn is saved for the backward,
which reads no state the forward changed.

Running statistics (Eq. 4, ``LAYER``): where the coin wins, ``running = w running + (1 - w) mean_b z``
per channel, written by the channel's own program; ``ema`` ``(2,)`` holds ``w`` (0 for a client whose
first batch sets them, VFDA; else the momentum) and the momentum, which replaces ``w`` after the
first winning forward.

Reductions accumulate in float32 (float16, bfloat16 and float32 inputs) or float64 in
``BLOCK_B x BLOCK_N`` tiles, then a tree sum: float64 agrees with the PyTorch path to its rounding,
float32 in the last bits (tests/layers/test_triton_ffa.py states the tolerances).

Imported only with the Triton path (:func:`fedaug.layers.kernel.triton_module`) or by its tests: fedaug
needs ``triton`` (the ``gpu`` extra; torch's CUDA wheels ship it) for nothing else. The tests run
these kernels on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

#: most elements of one ``BLOCK_B x BLOCK_N`` tile (longer rows loop over tiles).
TILE = 4096
#: narrowest tile row (tiny maps: lanes past the row are masked).
MIN_BLOCK = 16
#: Philox counters one forward may use (the low word of ``(f << 32) + j``): ``1 + B C`` of them.
COUNTERS = 2**32


@triton.jit
def _row_stats(x_ptr, rows, bmask, N, denom_n, EPS: tl.constexpr, ACC: tl.constexpr, BLOCK_B: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Each row's ``mu = sum x / N`` and ``sigma = sqrt(sum (x - mu)^2 / denom_n + EPS)`` (Eq. 2, two
    passes), ``(BLOCK_B,)`` each; rows at ``rows`` (element offsets), those past ``B`` masked."""
    lanes = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        m = bmask[:, None] & (offs < N)[None, :]
        acc += tl.load(x_ptr + rows[:, None] + offs[None, :], mask=m, other=0.0).to(ACC)
    mu = tl.sum(acc, axis=1) / N
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        m = bmask[:, None] & (offs < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] + offs[None, :], mask=m, other=0.0).to(ACC)
        d = tl.where(m, x - mu[:, None], 0.0)
        acc += d * d
    return mu, tl.sqrt(tl.sum(acc, axis=1) / denom_n + EPS)


@triton.jit
def _param(k_ptr, at, SHIFT: tl.constexpr, CONST: tl.constexpr, CONST_PARAM: tl.constexpr, ACC: tl.constexpr):
    """The channel's fixed scale or multiplier ``k`` (Eq. 7): ``CONST``, or ``k_ptr[at] + SHIFT``."""
    if CONST_PARAM:
        k = tl.full((), CONST, ACC)
    else:
        k = tl.load(k_ptr + at).to(ACC) + SHIFT
    return k


@triton.jit
def _noise_scale(z, bmask, B, denom_b, k, EXTRA: tl.constexpr, FIXED: tl.constexpr, STD: tl.constexpr):
    """For one channel's statistic ``z`` ``(BLOCK_B,)``: ``(s, coef, dev)``: the noise scale ``s``
    (Eq. 7, 9), ``coef = 2 ds/dv / denom_b`` and ``dev = z - mean_b z`` (0 past ``B``); fixed scales
    (``s = k``) have coefficient 0 (their vector-Jacobian product is the identity)."""
    mean = tl.sum(tl.where(bmask, z, 0.0), axis=0) / B
    dev = tl.where(bmask, z - mean, 0.0)
    if FIXED:
        s = k
        coef = 0.0 * k
    else:
        f = k * (tl.sum(dev * dev, axis=0) / denom_b + EXTRA)  # Eq. 3 then Eq. 7
        if STD:  # Eq. 9: s = sqrt(f), with sqrt's gradient at 0 taken as 0
            s = tl.where(f > 0, tl.sqrt(tl.where(f > 0, f, 1.0)), 0.0)
            coef = tl.where(s > 0, k / tl.where(s > 0, s * denom_b, 1.0), 0.0)
            coef = tl.where(coef - coef == 0, coef, 0.0)  # an infinite coefficient (x - x is NaN) is 0
        else:  # VFDA Eq. 7 as printed: s = f
            s = f
            coef = k * 2.0 / denom_b
    return s, coef, dev


@triton.jit
def _ffa_forward(x_ptr, y_ptr, saved_ptr, use_ptr, noise_ptr, seed_ptr, offset_ptr, ema_ptr, mean_ptr, std_ptr,
                 kmu_ptr, ksigma_ptr, B, C, N, p, denom_n, denom_b, EPS: tl.constexpr, EXTRA: tl.constexpr,
                 SHIFT: tl.constexpr, CONST: tl.constexpr, CONST_PARAM: tl.constexpr, FIXED: tl.constexpr,
                 STD: tl.constexpr, LAYER: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr):
    """Channel ``c`` of client ``g``: ``y`` (Eq. 8, or ``x`` where the coin loses), ``saved[g, :, :, c]``
    ``= (mu, sigma, noise_mu, noise_sigma)``; with ``LAYER`` the draws, ``use[g]`` and Eq. 4 (module
    docstring), else the noise is read from ``noise[g]`` and the coin always wins."""
    c = tl.program_id(0)
    g = tl.program_id(1)
    ACC: tl.constexpr = saved_ptr.dtype.element_ty
    ob = tl.arange(0, BLOCK_B)
    bmask = ob < B
    rows = ((g * B + ob).to(tl.int64) * C + c) * N
    mu, sigma = _row_stats(x_ptr, rows, bmask, N, denom_n, EPS, ACC, BLOCK_B, BLOCK_N)
    bc = B * C
    if LAYER:
        seed = tl.load(seed_ptr + g)
        weight = tl.load(ema_ptr + 2 * g).to(ACC)
        momentum = tl.load(ema_ptr + 2 * g + 1)
        arrival = tl.atomic_add(offset_ptr + g, 1)  # after every read of what the last arrival writes
        base = (arrival // C) << 32
        use = tl.rand(seed, base) < p  # Alg. 2 line 1
        r1, r2, _, _ = tl.randint4x(seed, base + 1 + ob * C + c)
        noise_mu, noise_sigma = tl.pair_uniform_to_normal(tl.uint_to_uniform_float(r1), tl.uint_to_uniform_float(r2))
        noise_mu = tl.where(bmask, noise_mu.to(ACC), 0.0)
        noise_sigma = tl.where(bmask, noise_sigma.to(ACC), 0.0)
    else:
        use = tl.full((), 1, tl.int1)
        at = g * 2 * bc + ob * C + c
        noise_mu = tl.load(noise_ptr + at, mask=bmask, other=0.0).to(ACC)
        noise_sigma = tl.load(noise_ptr + at + bc, mask=bmask, other=0.0).to(ACC)
    k_mu = _param(kmu_ptr, g * C + c, SHIFT, CONST, CONST_PARAM, ACC)
    k_sigma = _param(ksigma_ptr, g * C + c, SHIFT, CONST, CONST_PARAM, ACC)
    s_mu, _, _ = _noise_scale(mu, bmask, B, denom_b, k_mu, EXTRA, FIXED, STD)
    s_sigma, _, _ = _noise_scale(sigma, bmask, B, denom_b, k_sigma, EXTRA, FIXED, STD)
    mu_hat = mu + noise_mu * s_mu  # Eq. 9
    a = (sigma + noise_sigma * s_sigma) / sigma
    saved = g * 4 * bc + ob * C + c
    tl.store(saved_ptr + saved, mu, mask=bmask)
    tl.store(saved_ptr + saved + bc, sigma, mask=bmask)
    tl.store(saved_ptr + saved + 2 * bc, noise_mu, mask=bmask)
    tl.store(saved_ptr + saved + 3 * bc, noise_sigma, mask=bmask)
    if LAYER:
        tl.store(use_ptr + g, use.to(ACC), mask=c == 0)
        mean_mu = tl.sum(tl.where(bmask, mu, 0.0), axis=0) / B
        mean_sigma = tl.sum(tl.where(bmask, sigma, 0.0), axis=0) / B
        old_mu = tl.load(mean_ptr + g * C + c).to(ACC)
        old_sigma = tl.load(std_ptr + g * C + c).to(ACC)
        tl.store(mean_ptr + g * C + c, (weight * old_mu + (1.0 - weight) * mean_mu).to(mean_ptr.dtype.element_ty),
                 mask=use)  # Eq. 4
        tl.store(std_ptr + g * C + c, (weight * old_sigma + (1.0 - weight) * mean_sigma).to(std_ptr.dtype.element_ty),
                 mask=use)
        tl.store(ema_ptr + 2 * g, momentum, mask=use & (arrival % C == C - 1))
    lanes = tl.arange(0, BLOCK_N)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        m = bmask[:, None] & (offs < N)[None, :]
        ptrs = rows[:, None] + offs[None, :]
        x = tl.load(x_ptr + ptrs, mask=m, other=0.0)
        y = ((x.to(ACC) - mu[:, None]) * a[:, None] + mu_hat[:, None]).to(y_ptr.dtype.element_ty)  # Eq. 8
        tl.store(y_ptr + ptrs, tl.where(use, y, x), mask=m)


@triton.jit
def _ffa_backward(g_ptr, x_ptr, saved_ptr, use_ptr, kmu_ptr, ksigma_ptr, gx_ptr, B, C, N, denom_n, denom_b,
                  EXTRA: tl.constexpr, SHIFT: tl.constexpr, CONST: tl.constexpr, CONST_PARAM: tl.constexpr,
                  FIXED: tl.constexpr, STD: tl.constexpr, LAYER: tl.constexpr, BLOCK_B: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """Channel ``c`` of client ``g``: ``dx = g a + k1 (x - mu) + k0`` from ``g_z = vjp(g_hat) - a g_hat``,
    ``g_hat = (sum g, sum g (x - mu) / sigma)`` per row, ``k1 = g_z[sigma] / (sigma denom_n)``,
    ``k0 = g_z[mu] / N``; ``dx = g`` where the forward's coin lost (``LAYER``)."""
    c = tl.program_id(0)
    grp = tl.program_id(1)
    ACC: tl.constexpr = saved_ptr.dtype.element_ty
    ob = tl.arange(0, BLOCK_B)
    bmask = ob < B
    rows = ((grp * B + ob).to(tl.int64) * C + c) * N
    bc = B * C
    saved = grp * 4 * bc + ob * C + c
    mu = tl.load(saved_ptr + saved, mask=bmask, other=0.0)
    sigma = tl.load(saved_ptr + saved + bc, mask=bmask, other=1.0)
    noise_mu = tl.load(saved_ptr + saved + 2 * bc, mask=bmask, other=0.0)
    noise_sigma = tl.load(saved_ptr + saved + 3 * bc, mask=bmask, other=0.0)
    k_mu = _param(kmu_ptr, grp * C + c, SHIFT, CONST, CONST_PARAM, ACC)
    k_sigma = _param(ksigma_ptr, grp * C + c, SHIFT, CONST, CONST_PARAM, ACC)
    _, coef_mu, dev_mu = _noise_scale(mu, bmask, B, denom_b, k_mu, EXTRA, FIXED, STD)
    s_sigma, coef_sigma, dev_sigma = _noise_scale(sigma, bmask, B, denom_b, k_sigma, EXTRA, FIXED, STD)
    a = (sigma + noise_sigma * s_sigma) / sigma
    lanes = tl.arange(0, BLOCK_N)
    acc0 = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    acc1 = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        m = bmask[:, None] & (offs < N)[None, :]
        ptrs = rows[:, None] + offs[None, :]
        gy = tl.load(g_ptr + ptrs, mask=m, other=0.0).to(ACC)
        x = tl.load(x_ptr + ptrs, mask=m, other=0.0).to(ACC)
        acc0 += gy
        acc1 += gy * tl.where(m, x - mu[:, None], 0.0)
    gh_mu = tl.sum(acc0, axis=1)  # dL/dmu_hat
    gh_sigma = tl.sum(acc1, axis=1) / sigma  # dL/dsigma_hat
    gz_mu = gh_mu
    gz_sigma = gh_sigma
    if not FIXED:  # the map's vector-Jacobian product: + (sum_b g_hat_b noise_b) coef dev, per statistic
        gz_mu += dev_mu * (tl.sum(gh_mu * noise_mu, axis=0) * coef_mu)
        gz_sigma += dev_sigma * (tl.sum(gh_sigma * noise_sigma, axis=0) * coef_sigma)
    gz_mu -= gh_mu * a  # y's own dependence on mu and sigma
    gz_sigma -= gh_sigma * a
    k1 = gz_sigma / sigma / denom_n
    k0 = gz_mu / N
    if LAYER:
        use = tl.load(use_ptr + grp) != 0
    else:
        use = tl.full((), 1, tl.int1)
    for start in range(0, N, BLOCK_N):
        offs = start + lanes
        m = bmask[:, None] & (offs < N)[None, :]
        ptrs = rows[:, None] + offs[None, :]
        gy = tl.load(g_ptr + ptrs, mask=m, other=0.0)
        x = tl.load(x_ptr + ptrs, mask=m, other=0.0).to(ACC)
        gx = gy.to(ACC) * a[:, None] + k1[:, None] * (x - mu[:, None]) + k0[:, None]
        tl.store(gx_ptr + ptrs, tl.where(use, gx.to(gx_ptr.dtype.element_ty), gy.to(gx_ptr.dtype.element_ty)), mask=m)


#: whether these kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` when triton was imported):
#: CPU tensors then, CUDA tensors otherwise.
INTERPRETED = isinstance(_ffa_forward, InterpretedFunction)


@triton.jit
def _count_to(out_ptr, n):
    """``out[0] = n``, counted by a loop whose bound is a kernel argument (as :func:`_row_stats`' loops)."""
    total = 0
    for _ in range(0, n, 1):
        total += 1
    tl.store(out_ptr, total)


@functools.cache
def interpreter_runs() -> bool:
    """Whether Triton's interpreter runs these kernels here. Its releases before 3.7 (torch 2.11 ships
    3.6) turn a loop bound that is a kernel argument into an index with ``int`` of a one-element array,
    which numpy 2.4 refuses (``TypeError: only 0-dimensional arrays ...``); compiled kernels (CUDA) are
    unaffected. Launches :func:`_count_to` once (milliseconds); call only where :data:`INTERPRETED`."""
    out = torch.zeros(1, dtype=torch.int32)
    try:
        _count_to[(1,)](out, 2)
    except Exception as error:  # the interpreter wraps the TypeError in its own error class
        if "0-dimensional" not in repr(error):
            raise
        return False
    return int(out) == 2


class Plan(NamedTuple):
    """What a launch's arguments owe to the shape and the map alone, computed once per layer shape
    (:func:`plan`), so that a launch builds no dictionary and calls no helper: the grid, the kernel's
    integer arguments and its keyword arguments (compile-time constants and launch options)."""

    grid: tuple[int, int]
    b: int
    c: int
    n: int
    denom_n: int
    denom_b: int
    saved: tuple[int, int, int, int]
    constants: dict[str, float | int | bool]


@functools.lru_cache(maxsize=1024)
def plan(shape: tuple[int, ...], const: float | None, shift: float, fixed: bool, std_scale: bool, correction: int,
         extra: float, unbiased: bool, eps: float | None, layer: bool) -> Plan:
    """The launch plan of features of ``shape`` ``(G, B, C, *spatial)`` and a map (:func:`forward`'s
    arguments; ``eps`` ``None`` for the backward's, which has no ``EPS``). Blocks: a ``BLOCK_B x BLOCK_N``
    tile of at most :data:`TILE` elements (at least :data:`MIN_BLOCK` lanes a row), warps by tile size, and
    fused multiply-adds (as ATen's CUDA kernels; Triton's default for them is changing, so it is fixed
    here). The divisors of Eq. 2's and Eq. 3's variances: ``denom_n``, ``denom_b``."""
    g, b, c = shape[:3]
    n = math.prod(shape[3:])
    block_b = triton.next_power_of_2(b)
    block_n = max(MIN_BLOCK, min(triton.next_power_of_2(n), TILE // block_b))
    constants: dict[str, float | int | bool] = {} if eps is None else {"EPS": eps}
    constants.update(LAYER=layer, EXTRA=0.0 if fixed else extra, SHIFT=shift, CONST=0.0 if const is None else const,
                     CONST_PARAM=const is not None, FIXED=fixed, STD=std_scale, BLOCK_B=block_b, BLOCK_N=block_n,
                     num_warps=max(1, min(8, block_b * block_n // 512)), enable_fp_fusion=True)
    return Plan((c, g), b, c, n, n - 1 if unbiased and n > 1 else n, max(b - correction, 1), (g, 4, b, c), constants)


def _launch(kernel: JITFunction | InterpretedFunction, grid: tuple[int, int], x: Tensor, args: tuple, constants: dict) -> None:
    """``kernel[grid](*args, **constants)`` on ``x``'s device: Triton launches on the current CUDA device,
    which becomes ``x``'s for the launch (the interpreter's CPU tensors need none)."""
    if not x.is_cuda:
        kernel[grid](*args, **constants)
        return
    previous = torch.cuda._exchange_device(x.get_device())
    try:
        kernel[grid](*args, **constants)
    finally:
        torch.cuda._maybe_exchange_device(previous)


def forward(x: Tensor, noise: Tensor | None, seed: Tensor | None, offset: Tensor | None, ema: Tensor | None,
            running_mean: Tensor | None, running_std: Tensor | None, k_mu: Tensor | None, k_sigma: Tensor | None, *,
            p: float, const: float | None, shift: float, fixed: bool, std_scale: bool, correction: int,
            extra: float, eps: float, unbiased: bool, grouped: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Launch :func:`_ffa_forward` once for a group of clients.

    Args:
        x: ``(G, B, C, *spatial)`` contiguous, floating point; not modified.
        noise: ``(G, 2, B, C)`` standard normal draws, or ``None``: the layer's path, which draws them
            (with ``seed``, ``offset``, ``ema``, ``running_mean``, ``running_std``, all given).
        seed: ``(G,)`` int64. offset: ``(G,)`` int64, each advanced by ``C`` in place.
        ema: ``(G, 2)``: the weight of the old running statistic in the next update, and the momentum;
            the weight becomes the momentum in place after a winning forward.
        running_mean, running_std: ``(G, C)``, updated in place where the coin wins (Eq. 4).
        k_mu, k_sigma: ``(G, C)`` per-channel scales (``fixed``) or multipliers (Eq. 7), to which
            ``shift`` is added; ``None`` with ``const``: that value for every channel.
        p: the coin's probability (the layer's path). const, shift, fixed, std_scale, correction,
            extra, eps, unbiased: the map (:func:`fedaug.layers.triton_op.ffa_restyle`).
        grouped: ``False``: one client (G = 1) and no tensor has the group dimension (``x`` ``(B, C,
            *spatial)``, ``seed`` ``()``, ``ema`` ``(2,)``, ...: the same memory), nor has ``y``.

    Returns:
        ``(y, saved, use)``: ``y`` like ``x``; ``saved`` ``(G, 4, B, C)`` (mu, sigma, noise_mu,
        noise_sigma), float64 for float64 ``x``, else float32; ``use`` ``(G,)`` in that dtype, 1 where
        the coin won (ones without the layer's path).
    """
    layer = noise is None
    at = plan(x.shape if grouped else (1, *x.shape), const, shift, fixed, std_scale, correction, extra, unbiased, eps,
              layer)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = torch.empty_like(x)
    saved = x.new_empty(at.saved, dtype=acc)
    use = x.new_empty(at.grid[1:], dtype=acc) if layer else x.new_ones(at.grid[1:], dtype=acc)
    _launch(_ffa_forward, at.grid, x, (
        x, y, saved, use, x if layer else noise, x if seed is None else seed, x if offset is None else offset,
        x if ema is None else ema, x if running_mean is None else running_mean,
        x if running_std is None else running_std, x if k_mu is None else k_mu, x if k_sigma is None else k_sigma,
        at.b, at.c, at.n, float(p), at.denom_n, at.denom_b), at.constants)
    return y, saved, use


def backward(grad: Tensor, x: Tensor, saved: Tensor, use: Tensor, k_mu: Tensor | None, k_sigma: Tensor | None, *,
             const: float | None, shift: float, fixed: bool, std_scale: bool, correction: int, extra: float,
             unbiased: bool, layer: bool, grouped: bool = True) -> Tensor:
    """Launch :func:`_ffa_backward` once: ``dL/dx`` like ``x`` from ``grad`` ``(G, B, C, *spatial)``
    (contiguous) and what :func:`forward` returned; arguments as there."""
    at = plan(x.shape if grouped else (1, *x.shape), const, shift, fixed, std_scale, correction, extra, unbiased, None,
              layer)
    gx = torch.empty_like(x)
    _launch(_ffa_backward, at.grid, x, (grad, x, saved, use, x if k_mu is None else k_mu,
                                        x if k_sigma is None else k_sigma, gx, at.b, at.c, at.n, at.denom_n,
                                        at.denom_b), at.constants)
    return gx
