"""The clients' SGD step in one pass over their parameters, from a compiled library (``csrc/local_sgd.c``),
used where it is built and gives torch's bits.

On the CPU, :class:`torch.optim.SGD` steps a model tensor by tensor: three or four ATen operations each
(the weight decay's sum, the momentum's product and sum, the update), each a pass over the tensor, behind
the optimiser's Python. On many small clients that is a quarter of a step (W2's MLP: ~0.3 of ~1.2 ms on a
2-core AMD EPYC, docs/benchmarks.md). :class:`LocalSGD` is torch's SGD whose step makes one call of the
compiled library for all the parameters, reading each parameter, gradient and momentum buffer once, with
torch's roundings in torch's order (the source says which): the same bits, so runs, replay records and
checkpoints do not change with it.

It is used only where ``fedaug kernel`` built the library for this CPU (it compiles in well under a
second: plain C, no torch headers) *and* a probe at load gives :class:`torch.optim.SGD`'s bits, first
and later steps, with and without weight decay and momentum, on tensors with and without a vector
tail (:func:`loaded`); everywhere else, for what the library does not take (other dtypes or devices,
strided tensors, Nesterov, dampening, ``maximize``), and wherever a dispatch mode or a trace would not see
a call outside torch (:func:`~fedaug.core.runtime.untraced`: ``make_fx`` capturing a step), torch's own
step runs.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from fedaug.core import native
from fedaug.core.eager_optim import EagerOptimizer, torch_step
from fedaug.core.runtime import untraced

#: no fused multiply-add beyond the source's explicit ones: the momentum's product and sum rounded apart
LIBRARY = native.Library(Path(__file__).with_name("csrc") / "local_sgd.c", ("-ffp-contract=off",),
                         "(clients then step with torch.optim.SGD, which gives the same results)")
SOURCE, FLAGS, build = LIBRARY.source, LIBRARY.flags, LIBRARY.build

#: the loaded step function, looked up (and probed) once per process (None: not built, or not torch's bits)
_STATE: dict[str, object] = {}


def loaded() -> Callable[..., None] | None:
    """The library's step function if it is built for this CPU and gives torch's bits on the probe
    (:func:`agrees`; looked up on the first call), else ``None``; never compiles."""
    if "step" not in _STATE:
        step = None
        try:
            lib = LIBRARY.cached()
            if lib is not None:
                step = ctypes.CDLL(str(lib)).fedaug_sgd_step
                step.restype = None
                step.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_int32]
                _STATE["step"] = step  # what the probe's LocalSGD steps with
                step = step if agrees() else None
        except (native.KernelBuildError, OSError, AttributeError):
            step = None
        _STATE["step"] = step
    return _STATE["step"]  # type: ignore[return-value]


def agrees() -> bool:
    """Whether :class:`LocalSGD`'s compiled step gives :class:`torch.optim.SGD`'s bits here: three steps
    (the first writes the momentum buffers) of seeded parameters and gradients over many magnitudes, in
    tensors of 1, 7, 16, 33 and 1,000 values (whole vectors and tails), with weight decay and momentum,
    each without the other, and neither (torch's: :func:`~fedaug.core.eager_optim.torch_step`)."""
    g = torch.Generator().manual_seed(0)
    sizes = (1, 7, 16, 33, 1000)
    for weight_decay, momentum in ((5e-4, 0.9), (0.0, 0.9), (1e-2, 0.0), (0.0, 0.0)):
        ours = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-4, 4, (n,), generator=g) for n in sizes]
        theirs = [t.clone() for t in ours]
        options = {"lr": 0.05, "momentum": momentum, "weight_decay": weight_decay}
        optimizers = LocalSGD(ours, **options), LocalSGD(theirs, **options)
        steps = (optimizers[0].step, lambda: torch_step(optimizers[1]))  # torch's own step on the second
        for _ in range(3):
            grads = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-4, 4, (n,), generator=g) for n in sizes]
            for params, step in zip((ours, theirs), steps):
                for p, grad in zip(params, grads):
                    p.grad = grad.clone()
                step()
        if not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ours, theirs)):
            return False
    return True


def _plain(tensors: list[Tensor]) -> bool:
    """Whether every tensor is dense, contiguous, float32 and on the CPU (what the compiled step takes)."""
    f32, strided = torch.float32, torch.strided
    for t in tensors:
        if t.dtype is not f32 or not t.is_cpu or t.layout is not strided or not t.is_contiguous():
            return False
    return True


class LocalSGD(EagerOptimizer, torch.optim.SGD):
    """:class:`torch.optim.SGD` (the same arguments, state and hooks) whose step, where the library is
    loaded (:func:`loaded`) and every parameter with a gradient is a dense contiguous float32 CPU tensor,
    is one compiled pass over all of them (momentum, weight decay; not Nesterov, dampening or
    ``maximize``): the same bits as torch's step. The parameters' version counters advance as torch's
    in-place step advances them. A new momentum buffer reuses the one a cleared state left, where nothing
    else holds it (the first step writes it whole). Hooks, the profiler's range and ``zero_grad`` as
    :class:`~fedaug.core.eager_optim.EagerOptimizer`'s, which builds and steps without importing ``torch._dynamo``.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._spare: dict[Tensor, Tensor] = {}  # each parameter's last momentum buffer

    def _step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        fn = loaded()  # (during the probe, the function probed)
        group = self.param_groups[0]
        if (fn is None or not untraced() or len(self.param_groups) != 1 or group["nesterov"] or group["maximize"] or group["dampening"]
                or isinstance(group["lr"], Tensor) or isinstance(group["weight_decay"], Tensor)):
            torch_step(self)
            return loss
        params = [p for p in group["params"] if p.grad is not None]
        momentum = group["momentum"]
        state, n = self.state, len(params)
        grads = [p.grad for p in params]
        bufs = [state[p].get("momentum_buffer") for p in params] if momentum else []
        held = [b for b in bufs if b is not None]
        if not (_plain(params) and _plain(grads) and _plain(held)):  # type: ignore[arg-type]
            torch_step(self)
            return loss
        first = [0] * n
        if len(held) < len(bufs):
            for i, (p, b) in enumerate(zip(params, bufs)):
                if b is None:  # torch.clone(grad): the first step writes the whole buffer
                    b = self._spare.get(p)
                    if b is None or b.shape != p.shape or sys.getrefcount(b) > 3:  # (the dict's, b, the call's)
                        b = self._spare[p] = torch.empty_like(p, memory_format=torch.contiguous_format)
                    bufs[i] = state[p]["momentum_buffer"] = b
                    first[i] = 1
        pointers, data = ctypes.c_void_p * n, Tensor.data_ptr
        fn(n, pointers(*map(data, params)), pointers(*map(data, grads)),
           pointers(*map(data, bufs)) if momentum else pointers(), (ctypes.c_int64 * n)(*map(Tensor.numel, params)),
           (ctypes.c_int32 * n)(*first), group["lr"], group["weight_decay"], momentum, torch.get_num_threads())
        written = params + bufs  # type: ignore[operator]
        torch._C._autograd._unsafe_set_version_counter(written, [t._version + 1 for t in written])
        return loss

