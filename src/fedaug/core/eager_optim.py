"""torch's optimisers without the import of ``torch._dynamo`` that their wrappers make.

``torch.optim.Optimizer`` imports ``torch._dynamo`` when a process builds its first optimiser
(``add_param_group``'s ``torch._disable_dynamo`` wrapper), zeroes its first gradients (``zero_grad``'s) and
takes its first step (``step``'s grad-mode wrapper, for its graph breaks): a guard that only a caller compiled by
``torch.compile`` needs, and 4-5 CPU-seconds of a process's start on a 2-core Xeon, three times torch's own import.
:class:`EagerOptimizer` gives a torch optimiser class the same methods calling torch's own bodies, so a process
that trains on the CPU starts without it: every ``fedaug run``, worker process and Flower ClientApp (one process
per message in a deployment). The arithmetic is torch's: the step is its body, run in the grad mode its wrapper
sets, and under ``torch.compile`` the wrapped step itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.optimizer as _optimizer
from torch import Tensor

#: torch's optimiser hooks registered for every optimiser (register_optimizer_step_pre_hook and _post_hook)
_GLOBAL_PRE_HOOKS = getattr(_optimizer, "_global_optimizer_pre_hooks", {})
_GLOBAL_POST_HOOKS = getattr(_optimizer, "_global_optimizer_post_hooks", {})

#: torch's ``Optimizer.add_param_group`` and ``zero_grad`` without their ``torch._disable_dynamo`` wrappers
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)


class EagerOptimizer(torch.optim.Optimizer):
    """A base to put before a torch optimiser class (``class LocalAdam(EagerOptimizer, torch.optim.Adam)``): the
    same arguments, state, hooks and arithmetic, without the ``torch._dynamo`` import (module docstring).

    Torch's optimiser step hooks run where one is registered (on this optimiser or globally), and the step's
    profiler range (``Optimizer.step#<class>.step``) where torch's profiler is on; otherwise neither costs the
    step anything. ``zero_grad(set_to_none=True)`` sets the gradients to ``None`` without torch's profiler range.
    A subclass replaces :meth:`_step` (by default torch's own step, :func:`torch_step`).
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's own ``add_param_group`` (its checks and defaults)."""
        _ADD_PARAM_GROUP(self, param_group)

    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        if (self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks or _GLOBAL_PRE_HOOKS or _GLOBAL_POST_HOOKS
                or torch.autograd._profiler_enabled()):
            return _HOOKED_STEP(self, closure)
        return self._step(closure)

    step.hooked = True  # type: ignore[attr-defined]  # (torch's wrapper, _HOOKED_STEP, only where it does something)

    def _step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        return torch_step(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            _ZERO_GRAD(self, False)
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


def torch_step(opt: torch.optim.Optimizer, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
    """The step of ``opt``'s torch optimiser class (the first in its class's method order that torch defines),
    without the hooks and profiler range of torch's wrapper (:meth:`EagerOptimizer.step` ran them where they
    apply): its body, in the grad mode its wrapper sets; under ``torch.compile`` the wrapped step itself (whose
    graph breaks a compiled caller needs)."""
    base = _torch_class(type(opt))
    if torch.compiler.is_compiling():
        step = base.step
        return (step.__wrapped__ if getattr(step, "hooked", False) else step)(opt, closure)  # type: ignore[attr-defined]
    with torch.set_grad_enabled(opt.defaults["differentiable"]):
        return _body(base)(opt, closure)


@functools.cache
def _torch_class(cls: type) -> type:
    return next(c for c in cls.__mro__ if c.__module__.startswith("torch.optim.") and c is not torch.optim.Optimizer)


@functools.cache
def _body(cls: type) -> Callable[..., Tensor | None]:
    return inspect.unwrap(cls.step)


#: torch's step wrapper (its hooks and profiler range) around :meth:`EagerOptimizer._step`
_HOOKED_STEP = torch.optim.Optimizer.profile_hook_step(lambda self, closure=None: self._step(closure))


class LocalAdam(EagerOptimizer, torch.optim.Adam):
    """:class:`torch.optim.Adam` without the ``torch._dynamo`` import (:class:`EagerOptimizer`): the same
    arguments, state, hooks and arithmetic."""
