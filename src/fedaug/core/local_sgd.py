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
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.optim.optimizer as _optimizer
from torch import Tensor

from fedaug.core import native
from fedaug.core.runtime import untraced

#: torch's optimiser hooks registered for every optimiser (register_optimizer_step_pre_hook and _post_hook)
_GLOBAL_PRE_HOOKS = getattr(_optimizer, "_global_optimizer_pre_hooks", {})
_GLOBAL_POST_HOOKS = getattr(_optimizer, "_global_optimizer_post_hooks", {})

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
    each without the other, and neither (torch's: :func:`_torch_step`)."""
    g = torch.Generator().manual_seed(0)
    sizes = (1, 7, 16, 33, 1000)
    for weight_decay, momentum in ((5e-4, 0.9), (0.0, 0.9), (1e-2, 0.0), (0.0, 0.0)):
        ours = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-4, 4, (n,), generator=g) for n in sizes]
        theirs = [t.clone() for t in ours]
        options = {"lr": 0.05, "momentum": momentum, "weight_decay": weight_decay}
        optimizers = LocalSGD(ours, **options), LocalSGD(theirs, **options)
        steps = (optimizers[0].step, lambda: _torch_step(optimizers[1]))  # torch's own step on the second
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


class LocalSGD(torch.optim.SGD):
    """:class:`torch.optim.SGD` (the same arguments, state and hooks) whose step, where the library is
    loaded (:func:`loaded`) and every parameter with a gradient is a dense contiguous float32 CPU tensor,
    is one compiled pass over all of them (momentum, weight decay; not Nesterov, dampening or
    ``maximize``): the same bits as torch's step. The parameters' version counters advance as torch's
    in-place step advances them. A new momentum buffer reuses the one a cleared state left, where nothing
    else holds it (the first step writes it whole).

    Torch's optimiser step hooks run where one is registered (on this optimiser or globally), and the
    step's profiler range (``Optimizer.step#LocalSGD.step``) where torch's profiler is on; otherwise
    neither costs the step anything. ``zero_grad(set_to_none=True)`` sets the gradients to ``None``
    without torch's profiler range.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._spare: dict[Tensor, Tensor] = {}  # each parameter's last momentum buffer

    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        if (self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks or _GLOBAL_PRE_HOOKS or _GLOBAL_POST_HOOKS
                or torch.autograd._profiler_enabled()):
            return _HOOKED_STEP(self, closure)
        return self._step(closure)

    step.hooked = True  # type: ignore[attr-defined]  # (torch's wrapper, _HOOKED_STEP, only where it does something)

    def _step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        fn = loaded()  # (during the probe, the function probed)
        group = self.param_groups[0]
        if (fn is None or not untraced() or len(self.param_groups) != 1 or group["nesterov"] or group["maximize"] or group["dampening"]
                or isinstance(group["lr"], Tensor) or isinstance(group["weight_decay"], Tensor)):
            _torch_step(self)
            return loss
        params = [p for p in group["params"] if p.grad is not None]
        momentum = group["momentum"]
        state, n = self.state, len(params)
        grads = [p.grad for p in params]
        bufs = [state[p].get("momentum_buffer") for p in params] if momentum else []
        held = [b for b in bufs if b is not None]
        if not (_plain(params) and _plain(grads) and _plain(held)):  # type: ignore[arg-type]
            _torch_step(self)
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

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's own ``add_param_group`` (its checks and defaults), without the wrapper that keeps a compiled
        caller from tracing it by importing ``torch._dynamo`` at a process's first optimiser: 3-5 CPU-seconds of
        the start of every run, worker process and Flower ClientApp (one per message) that trains with SGD."""
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            super().zero_grad(set_to_none)
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


def _torch_step(opt: LocalSGD) -> None:
    """``torch.optim.SGD``'s own step of ``opt``, without the hooks and profiler range that torch's wrapper
    adds to that class once an SGD optimiser exists (:meth:`LocalSGD.step` ran them where they apply): its body
    in the grad mode its wrapper sets, and under ``torch.compile`` the wrapped step itself (whose graph breaks,
    which import ``torch._dynamo``, only a compiled caller needs)."""
    if torch.compiler.is_compiling():
        step = torch.optim.SGD.step
        (step.__wrapped__ if getattr(step, "hooked", False) else step)(opt)  # type: ignore[attr-defined]
        return
    with torch.set_grad_enabled(opt.defaults["differentiable"]):
        _SGD_STEP(opt)


#: torch's ``Optimizer.add_param_group`` and ``SGD.step`` without their wrappers (hooks, profiler range, the grad
#: mode and the graph breaks for a compiled caller), which import ``torch._dynamo`` when first called
_ADD_PARAM_GROUP, _SGD_STEP = inspect.unwrap(torch.optim.Optimizer.add_param_group), inspect.unwrap(torch.optim.SGD.step)

#: torch's step wrapper (its hooks and profiler range) around :meth:`LocalSGD._step`
_HOOKED_STEP = torch.optim.Optimizer.profile_hook_step(LocalSGD._step)
