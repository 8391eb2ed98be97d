"""Torch operators over the FFA layer's Triton kernels (:mod:`fedaug.layers.triton_ffa`): one launch
forward and one backward per layer and step, differentiable, batched by ``torch.func.vmap`` in one
launch for a whole group of clients, and traceable by ``torch.fx`` (CUDA graphs, and their CPU
emulation in the tests).

Two custom operators (``torch.library.custom_op``, namespace ``fedaug_triton``) make each launch
visible to the dispatcher, so that a traced step records it: ``ffa_forward`` (which changes the
layer's offset, running statistics and first-batch weight in place) and ``ffa_backward``. Eagerly (no
dispatch mode and no tracing active, :func:`~fedaug.core.runtime.untraced`) :class:`_FFA` calls the
operators' own functions directly: the same launches with the same arguments, without the operators' Python (their schema
binding cost a layer ~0.5 ms of host time per step, several times InstanceNorm's whole step). PyTorch
registers no autograd formula for an operator that changes its inputs, so :class:`_FFA` (a
``torch.autograd.Function``) pairs them, and its ``vmap`` rule flattens the ``vmap`` dimension into
the kernels' group dimension G: grouped clients cost one launch each way, like one client.

Entry points: :func:`ffa_train`, the training forward of :class:`~fedaug.layers.ffa.FFALayer` on the
Triton path (coin, noise and running statistics drawn and updated on the device, from the layer's
seed and offset tensors: no host synchronisation), and :func:`ffa_restyle`, the re-styling with given
noise behind :func:`fedaug.layers.functional.restyle` (``kernel="on"`` on CUDA, or ``"triton"``),
with the compiled CPU kernel's arguments.
"""

import functools
from typing import NamedTuple, Optional  # Optional: custom_op reads the operators' schemas from these hints

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from fedaug.core.runtime import untraced
from fedaug.layers import triton_ffa

__all__ = ["ffa_restyle", "ffa_train"]


class _Options(NamedTuple):
    """The map's options (:func:`ffa_train`); ``layer``: the layer's path (draws, running statistics);
    ``single``: one client's tensors without the group dimension (G = 1: :func:`ffa_train`'s eager call,
    which so takes no view of ``x`` that autograd would record, nor of the layer's buffers)."""

    p: float
    const: Optional[float]
    shift: float
    fixed: bool
    std_scale: bool
    correction: int
    extra: float
    eps: float
    unbiased: bool
    layer: bool
    single: bool


#: :class:`_Options`, one instance per set of values (a cache hit builds nothing)
_options = functools.lru_cache(maxsize=256)(_Options)


@torch.library.custom_op("fedaug_triton::ffa_forward", mutates_args=("offset", "ema", "running_mean", "running_std"))
def _forward_op(x: Tensor, noise: Optional[Tensor], seed: Optional[Tensor], offset: Optional[Tensor],
                ema: Optional[Tensor], running_mean: Optional[Tensor], running_std: Optional[Tensor],
                k_mu: Optional[Tensor], k_sigma: Optional[Tensor], p: float, const: Optional[float], shift: float,
                fixed: bool, std_scale: bool, correction: int, extra: float, eps: float,
                unbiased: bool) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`fedaug.layers.triton_ffa.forward` as an operator."""
    return triton_ffa.forward(x, noise, seed, offset, ema, running_mean, running_std, k_mu, k_sigma, p=p,
                              const=const, shift=shift, fixed=fixed, std_scale=std_scale, correction=correction,
                              extra=extra, eps=eps, unbiased=unbiased)


@_forward_op.register_fake
def _forward_fake(x, noise, seed, offset, ema, running_mean, running_std, k_mu, k_sigma, *args):
    g, b, c = x.shape[:3]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.empty_like(x), x.new_empty((g, 4, b, c), dtype=acc), x.new_empty((g,), dtype=acc)


@torch.library.custom_op("fedaug_triton::ffa_backward", mutates_args=())
def _backward_op(grad: Tensor, x: Tensor, saved: Tensor, use: Tensor, k_mu: Optional[Tensor],
                 k_sigma: Optional[Tensor], const: Optional[float], shift: float, fixed: bool, std_scale: bool,
                 correction: int, extra: float, unbiased: bool, layer: bool) -> Tensor:
    """:func:`fedaug.layers.triton_ffa.backward` as an operator."""
    return triton_ffa.backward(grad, x, saved, use, k_mu, k_sigma, const=const, shift=shift, fixed=fixed,
                               std_scale=std_scale, correction=correction, extra=extra, unbiased=unbiased, layer=layer)


@_backward_op.register_fake
def _backward_fake(grad, x, *args):
    return torch.empty_like(x)


#: the arguments of :class:`_FFA` that the forward changes in place
_WRITTEN = ("offset", "ema", "running_mean", "running_std")
_TENSORS = ("x", "noise", "seed", "offset", "ema", "running_mean", "running_std", "k_mu", "k_sigma")


class _FFA(torch.autograd.Function):
    """``(y, saved, use)`` of :func:`fedaug.layers.triton_ffa.forward` (all tensors grouped, ``(G, ...)``)
    with the exact gradient w.r.t. ``x``; not twice differentiable."""

    @staticmethod
    def forward(x: Tensor, noise: Tensor | None, seed: Tensor | None, offset: Tensor | None,  # type: ignore[override]
                ema: Tensor | None, running_mean: Tensor | None, running_std: Tensor | None, k_mu: Tensor | None,
                k_sigma: Tensor | None, opts: _Options) -> tuple[Tensor, Tensor, Tensor]:
        for name, t in zip(_WRITTEN, (offset, ema, running_mean, running_std)):
            if t is not None and not t.is_contiguous():
                raise ValueError(f"the FFA layer's {name} must be contiguous: the kernel updates it in place")
        x = x.contiguous()
        noise = None if noise is None else noise.contiguous()
        seed = None if seed is None else seed.contiguous()
        k_mu = None if k_mu is None else k_mu.contiguous()
        k_sigma = None if k_sigma is None else k_sigma.contiguous()
        if opts.single or untraced():  # (single: only where ffa_train found nothing traced)
            return triton_ffa.forward(x, noise, seed, offset, ema, running_mean, running_std, k_mu, k_sigma, p=opts.p,
                                      const=opts.const, shift=opts.shift, fixed=opts.fixed, std_scale=opts.std_scale,
                                      correction=opts.correction, extra=opts.extra, eps=opts.eps,
                                      unbiased=opts.unbiased, grouped=not opts.single)
        return torch.ops.fedaug_triton.ffa_forward(x, noise, seed, offset, ema, running_mean, running_std, k_mu,
                                                   k_sigma, opts.p, opts.const, opts.shift, opts.fixed, opts.std_scale,
                                                   opts.correction, opts.extra, opts.eps, opts.unbiased)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        x, *_, k_mu, k_sigma, opts = inputs
        _, saved, use = output
        ctx.save_for_backward(x, saved, use, k_mu, k_sigma)
        ctx.opts = opts
        ctx.mark_non_differentiable(saved, use)
        ctx.set_materialize_grads(False)  # no zero-filled gradients of saved and use: no launch for them

    @staticmethod
    def backward(ctx, grad: Tensor, _saved: Tensor, _use: Tensor):  # type: ignore[override]
        if grad is None:  # y unused (gradients are not materialised): a zero gradient, no launch
            return None, *([None] * 9)
        if torch.is_grad_enabled():  # create_graph: a result that fails if differentiated again
            return _backward_once(ctx, grad)
        return _backward(ctx, grad)

    @staticmethod
    def vmap(info, in_dims, *args):  # type: ignore[override]
        """The ``vmap`` dimension (size V) joined to the group dimension: ``(V, G, ...)`` -> ``(V G, ...)``,
        one launch; what the forward writes must be batched (per client) and contiguous."""
        opts, size = args[-1], info.batch_size
        flat = []
        for name, t, dim in zip(_TENSORS, args[:-1], in_dims[:-1]):
            if t is not None and dim is None:
                if name in _WRITTEN:
                    raise ValueError(f"a grouped FFA layer needs one {name} per client (stacked over the group), "
                                     "got one tensor for the whole group")
                t = t.expand(size, *t.shape)
            elif t is not None:
                t = t.movedim(dim, 0)
                if name in _WRITTEN and not t.is_contiguous():
                    raise ValueError(f"a grouped FFA layer's {name} must be stacked contiguously over the group "
                                     "(the kernel updates it in place)")
            flat.append(None if t is None else t.flatten(0, 1))
        out = _FFA.apply(*flat, opts)
        return tuple(o.unflatten(0, (size, -1)) for o in out), (0, 0, 0)


def _backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
    """:meth:`_FFA.backward` of a ``grad`` that is not ``None``: one launch of the backward kernel."""
    x, saved, use, k_mu, k_sigma = ctx.saved_tensors
    o = ctx.opts
    grad, x = grad.contiguous(), x.contiguous()
    if untraced():
        gx = triton_ffa.backward(grad, x, saved, use, k_mu, k_sigma, const=o.const, shift=o.shift, fixed=o.fixed,
                                 std_scale=o.std_scale, correction=o.correction, extra=o.extra, unbiased=o.unbiased,
                                 layer=o.layer, grouped=not o.single)
    elif o.single:  # an eager forward's backward traced: the operator's grouped tensors
        k_mu, k_sigma = (None if k is None else k.unsqueeze(0) for k in (k_mu, k_sigma))
        gx = torch.ops.fedaug_triton.ffa_backward(grad.unsqueeze(0), x.unsqueeze(0), saved, use, k_mu, k_sigma,
                                                  o.const, o.shift, o.fixed, o.std_scale, o.correction, o.extra,
                                                  o.unbiased, o.layer).squeeze(0)
    else:
        gx = torch.ops.fedaug_triton.ffa_backward(grad, x, saved, use, k_mu, k_sigma, o.const, o.shift, o.fixed,
                                                  o.std_scale, o.correction, o.extra, o.unbiased, o.layer)
    return gx, *([None] * 9)


#: :func:`_backward` where the backward itself is differentiated (``create_graph``): its result raises if
#: differentiated again (the plain backward runs with gradients off, and skips ``once_differentiable``'s
#: no-grad context: a few microseconds a call)
_backward_once = once_differentiable(_backward)
#: ``torch.autograd.Function``'s base ``apply`` (C++) bound to :class:`_FFA`
_BASE_APPLY = super(torch.autograd.Function, _FFA).apply  # type: ignore[misc]


def _apply(*args: object) -> tuple[Tensor, Tensor, Tensor]:
    """``_FFA.apply(*args)`` with every argument given positionally. Outside functorch transforms (vmap) this
    is the base class's ``apply``, which ``Function.apply`` calls after binding the arguments to ``forward``'s
    signature (``inspect``, ~80 us a call on this host, for nothing when every argument is given) and
    unwrapping dead functorch wrappers (every tensor here is a view just taken by :func:`ffa_train` or
    :func:`ffa_restyle`, and an operator on a dead wrapper already returns a plain tensor or raises);
    under a transform, ``_FFA.apply`` itself."""
    if torch._C._are_functorch_transforms_active():
        return _FFA.apply(*args)
    return _BASE_APPLY(*args)


def ffa_train(x: Tensor, seed: Tensor, offset: Tensor, ema: Tensor, running_mean: Tensor, running_std: Tensor,
              k_mu: Tensor | None, k_sigma: Tensor | None, *, p: float, const: float | None, shift: float,
              fixed: bool, std_scale: bool, correction: int, extra: float, eps: float, unbiased: bool) -> Tensor:
    """One training forward of an FFA layer on the Triton path (FedFA Alg. 2, Eq. 2-4, 7-9): the coin,
    the noise, the re-styling and the running statistics in one launch (module docstring of
    :mod:`fedaug.layers.triton_ffa`), one launch backward.

    Args:
        x: features ``(B, C, *spatial)``, float16, bfloat16, float32 or float64; not modified.
        seed: ``()`` int64, the client's stream. offset: ``()`` int64, a multiple of ``C`` (0 to start),
            advanced by ``C`` in place.
        ema: ``(2,)``: the weight of the old running statistic in the next update (Eq. 4; 0: the
            first batch's statistics are copied), then the momentum, which replaces the weight
            after a forward whose coin wins.
        running_mean, running_std: ``(C,)``, updated in place where the coin wins.
        k_mu, k_sigma: ``(C,)``: the server's quantities (Eq. 7's multipliers, plus ``shift``), or
            ``None`` with ``const`` (the same value for every channel).
        p: probability that the forward augments (Alg. 2 line 1).
        const: the fixed scale (``fixed``) or multiplier of every channel, or ``None``.
        shift: added to ``k_mu``, ``k_sigma`` (1 for FedFA's gamma + 1, 0 for VFDA's product).
        fixed: the scales are fixed (FedFA-R); else multipliers of the batch variances (Eq. 3).
        std_scale: the noise scale is ``sqrt(k v)`` (Eq. 9), else ``k v`` (VFDA Eq. 7 as printed).
        correction, extra: the batch variances divide by ``B - correction`` and get ``extra`` added.
        eps, unbiased: added to the spatial variance; spatial variance over ``N - 1`` positions.

    Returns:
        Like ``x``: the re-styled features where the coin wins, ``x``'s values where it loses;
        differentiable w.r.t. ``x`` (once). Under ``torch.func.vmap`` every tensor argument carries
        the client dimension and the group runs in one launch each way.
    """
    if 1 + x.shape[0] * x.shape[1] > triton_ffa.COUNTERS:
        raise ValueError(f"FFA layer: a batch of {x.shape[0]} x {x.shape[1]} channels needs more than "
                         f"{triton_ffa.COUNTERS} random numbers per forward; split the batch")
    if untraced() and not torch._C._are_functorch_transforms_active():  # one client, eagerly: no group dimension
        return _BASE_APPLY(x, None, seed, offset, ema, running_mean, running_std, k_mu, k_sigma,
                           _options(p, const, shift, fixed, std_scale, correction, extra, eps, unbiased, True, True))[0]
    opts = _options(p, const, shift, fixed, std_scale, correction, extra, eps, unbiased, True, False)
    y, _, _ = _apply(x.unsqueeze(0), None, seed.reshape(1), offset.reshape(1), ema.unsqueeze(0),
                     running_mean.unsqueeze(0), running_std.unsqueeze(0), None if k_mu is None else k_mu.unsqueeze(0),
                     None if k_sigma is None else k_sigma.unsqueeze(0), opts)
    return y.squeeze(0)


def ffa_restyle(x: Tensor, noise: Tensor, param: Tensor, fixed: bool, std_scale: bool, correction: int,
                extra: float, eps: float, unbiased: bool) -> tuple[Tensor, Tensor]:
    """The fused FFA re-styling with given noise on a CUDA tensor (or a CPU one under ``TRITON_INTERPRET=1``).

    The arguments of ``torch.ops.fedaug.ffa_restyle``, the compiled CPU kernel, and the same function.

    Args:
        x: features ``(B, C, *spatial)``, float32 or float64; not modified.
        noise: ``(2, B, C)`` standard normal draws (means, then stds), ``x``'s device.
        param: ``(2, C)``: the fixed noise scales (``fixed``) or the multipliers ``k`` of the batch
            variances (Eq. 7), ``x``'s device.
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
    opts = _options(1.0, None, 0.0, fixed, std_scale, correction, extra, eps, unbiased, False, False)
    y, saved, _ = _apply(x.unsqueeze(0), noise.unsqueeze(0), None, None, None, None, None, param[0:1], param[1:2],
                         opts)
    return y.squeeze(0), saved[0, :2]
