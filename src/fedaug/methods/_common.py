"""Helpers shared by the baseline algorithms: option checks, parameter snapshots, the classifier
head and a feature tap on its input, frozen forwards, label counts and aggregation weights."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedaug.core.errors import ConfigError, FedaugError
from fedaug.methods.component import ClientCtx, Uplink
from fedaug.models.split import StagedModel, split_stages
from fedaug.models.walk import walk


def normalizing_norm(num_steps: int, momentum: float) -> float:
    """``||a_i||_1`` of FedNova (Wang et al. 2020, Sec. 4 and Appendix C) for local SGD: how many
    learning-rate-sized steps ``num_steps`` optimiser steps add up to, i.e. ``y - x = -lr * a * g``
    for a constant gradient g (FedNova's normaliser, SCAFFOLD's option-II divisor).

    Plain SGD: ``tau``. SGD with momentum rho (PyTorch's heavy ball):
    ``[tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho)``.
    """
    if momentum == 0:
        return float(num_steps)
    rho = momentum
    return (num_steps - rho * (1 - rho**num_steps) / (1 - rho)) / (1 - rho)


def sgd_momentum(ctx: ClientCtx, why: str) -> float:
    """The SGD momentum of the client's local steps (0 for plain SGD), known when it receives its training
    message (``ctx.train``), for methods whose maths assumes SGD steps.

    Raises:
        ConfigError: ``"<why>; got train.optimizer='adam', set train.optimizer='sgd'"``.
        FedaugError: a training context without the local training options (the engine sets them).
    """
    if ctx.train is None:
        raise FedaugError(f"{why}: the client context has no local training options (ctx.train); train through "
                          "fedaug.engine.client.training.train_client, which sets them")
    if ctx.train.optimizer != "sgd":
        raise ConfigError(f"{why}; got train.optimizer={ctx.train.optimizer!r}, set train.optimizer='sgd'")
    return float(ctx.train.momentum)


def plain_entries(model: nn.Module) -> dict[str, Tensor] | None:
    """``model.state_dict(keep_vars=True)`` without walking the model each time (a small client pays the
    walk twice: loading the global weights and replying with its own; :func:`fedaug.models.walk.walk`
    keeps it), or ``None`` where ``state_dict`` or ``load_state_dict`` would do anything else: a module
    with a state-dict hook, its own saving or extra state, or its own loading (BatchNorm's aside). The
    same entries in the same order: each module's parameters, then its persistent buffers, then its
    children's, shared modules under every name."""
    return walk(model).state_entries()


def load_entries(model: nn.Module, entries: Mapping[str, Tensor]) -> None:
    """``model.load_state_dict(entries, strict=False)``, with one walk of the model instead of one call
    per module (a quarter of a small client's fixed cost, issue 38): each entry that names a parameter
    or buffer of ``model`` (:func:`plain_entries`) is copied into it, the others are ignored (as
    ``strict=False`` does).

    Where ``load_state_dict`` would do anything else, it is called: a module with a state-dict hook or
    its own loading (``_load_from_state_dict`` overridden, BatchNorm's aside) or saving, an entry whose
    shape differs (its error, or its 1-element-to-scalar conversion) or an uninitialised (lazy) parameter.

    Args:
        model: the model, changed in place.
        entries: ``{state_dict key: tensor}``.
    """
    own = plain_entries(model)
    pairs = [(own[k], v) for k, v in entries.items() if k in own] if own is not None else []
    if own is None or any(t.shape != v.shape or nn.parameter.is_lazy(t) for t, v in pairs):
        model.load_state_dict(entries, strict=False)
        return
    with torch.no_grad():
        torch._foreach_copy_([t for t, _ in pairs], [v for _, v in pairs])


def detached(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Detached copies ``{name: tensor}`` (snapshots that later training does not change), from one
    multi-tensor operation: ``t * 1`` (``torch._foreach_mul``), which is ``t`` bit for bit (signed zeros,
    infinities, NaN; integer tensors stay integers) in its layout, one dispatch for the whole dict instead of
    a ``detach`` and a ``clone`` per tensor (on a GPU, a few launches instead of one per tensor). Boolean
    tensors, which the product would widen, are cloned."""
    if not tensors or any(v.dtype == torch.bool for v in tensors.values()):
        return {k: v.detach().clone() for k, v in tensors.items()}
    with torch.no_grad():
        return dict(zip(tensors, torch._foreach_mul(list(tensors.values()), 1)))


def squared_distance(params: dict[str, Tensor], anchor: dict[str, Tensor]) -> Tensor:
    """``sum_k ||params_k - anchor_k||^2`` (a scalar, differentiable w.r.t. ``params``)."""
    return sum((params[k] - anchor[k]).pow(2).sum() for k in anchor)


def client_weights(uplinks: Sequence[Uplink], weighting: str) -> list[float]:
    """FedAvg's aggregation weights p_k = n_k / n (``"samples"``) or 1 / |S| (``"uniform"``)."""
    w = [float(u.num_samples) if weighting == "samples" else 1.0 for u in uplinks]
    total = sum(w)
    return [x / total for x in w]


def classifier_head(model: nn.Module) -> tuple[str, nn.Linear]:
    """The linear classifier at the end of ``model``: the last stage of a zoo model, else the last
    ``nn.Linear`` module.

    Raises:
        ConfigError: the model ends in no ``nn.Linear`` (e.g. a segmentation U-Net).
    """
    modules = dict(model.named_modules())
    if isinstance(model, StagedModel):
        name = split_stages(model)[-1]
        candidates = [(name, modules.get(name))]
    else:
        candidates = [(n, m) for n, m in modules.items() if isinstance(m, nn.Linear)][-1:]
    if not candidates or not isinstance(candidates[0][1], nn.Linear):
        raise ConfigError(
            f"{type(model).__name__} does not end in an nn.Linear classifier head, which this method "
            "needs (features before the head, or the head itself); use a classification model"
        )
    return candidates[0]


class FeatureTap:
    """Records the input of the classifier head: the representation ``(B, D)`` before the head.

    A forward pre-hook (no wrapper, so ``state_dict`` keys never change). Training forwards (with
    gradients enabled) update :attr:`features`; :meth:`features_of` captures the features of one
    explicit call without touching :attr:`features`, so frozen-model forwards of one component do not
    overwrite what another reads.
    """

    def __init__(self, model: nn.Module) -> None:
        self.head_name, self.head = classifier_head(model)
        self.features: Tensor | None = None
        self._forced: list[Tensor] | None = None
        self.handle = self.head.register_forward_pre_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self._forced is not None:
            self._forced.append(args[0])
        elif torch.is_grad_enabled():
            self.features = args[0]

    def features_of(self, fn: Callable[[], Tensor]) -> tuple[Tensor, Tensor]:
        """Run ``fn`` (a forward pass) and return ``(features (B, D), output (B, K))``."""
        self._forced = []
        try:
            out = fn()
            return self._forced[-1], out
        finally:
            self._forced = None


_TAPS: "weakref.WeakKeyDictionary[nn.Module, FeatureTap]" = weakref.WeakKeyDictionary()


def feature_tap(model: nn.Module) -> FeatureTap:
    """The (one, shared) :class:`FeatureTap` of ``model``, attached on first use."""
    if model not in _TAPS:
        _TAPS[model] = FeatureTap(model)
    return _TAPS[model]


@torch.no_grad()
def frozen_forward(model: nn.Module, weights: dict[str, Tensor], x: Tensor,
                   tap: FeatureTap | None = None) -> tuple[Tensor | None, Tensor]:
    """Evaluate a frozen copy of ``model`` with ``weights`` (a full ``state_dict``) on ``x``.

    Runs in eval mode (BatchNorm uses the copy's running statistics, attached augmentation layers
    are identity) without gradients and without changing ``model``; no model object is copied.

    Returns:
        ``(features (B, D) or None without a tap, output (B, K))``, both detached.
    """
    def run() -> Tensor:
        return functional_call(model, weights, (x,))

    was_training = model.training
    model.eval()
    try:
        return tap.features_of(run) if tap is not None else (None, run())
    finally:
        model.train(was_training)


def hard_labels(y: Tensor) -> Tensor:
    """Class indices ``(B,)`` from class indices or soft labels ``(B, K)`` (their argmax)."""
    return y.argmax(1) if y.dim() == 2 else y


def label_counts(ctx: ClientCtx, method: str) -> Tensor:
    """Samples per class in the client's training split, ``(K,)`` float32.

    Raises:
        ConfigError: the task is not classification.
    """
    if ctx.task is None or ctx.task.name != "classification":
        raise ConfigError(f"{method} needs a classification task, got '{getattr(ctx.task, 'name', None)}'")
    return torch.bincount(ctx.data.y, minlength=ctx.task.num_classes).float()
