"""Models as ordered stages, and the split API built on them (front: input -> features at a stage;
back: features -> output), used by feature sharing (FLea, KDD 2024, Sec. 3: ``theta[:l]``/``theta[l:]``).

A :class:`StagedModel` lists its stages once (:meth:`StagedModel.stages`); its ``forward`` runs all
of them, and :func:`forward_front` / :func:`forward_back` run a prefix and the rest. The three paths
execute the same callables in the same order, so ``forward_back(m, forward_front(m, x, s), s)`` is
bit-identical to ``m(x)`` (eval mode) for every stage ``s``; they cannot drift.

What flows between stages (:data:`Features`) is a tensor for chain models. U-Nets carry their skip
connections: their features are ``(h, skips)`` with ``h`` the current tensor and ``skips`` the
encoder outputs still waiting for a decoder (see :class:`fedaug.models.unet.UNet`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fedaug.core.errors import ConfigError, suggest

#: What flows between stages: a tensor ``(B, C, *spatial)``, or a U-Net's ``(h, skips)`` pair.
Features = Any
Stage = tuple[str, Callable[[Features], Features]]


class StagedModel(nn.Module):
    """Base class of zoo models: an ordered list of named stages, run by ``forward``.

    By default the stages are the direct children in registration order (a chain, like
    :class:`torch.nn.Sequential`, but with named attributes). Models whose data flow is not a
    chain (U-Nets) override :meth:`stages`, :meth:`begin` and :meth:`end`.

    Subclasses set ``feature_stages``: the module names after which feature-level augmentations
    attach by default (the papers' placements); each is also a split point.
    """

    feature_stages: tuple[str, ...] = ()

    def stages(self) -> list[Stage]:
        """Ordered ``(name, fn)`` pairs; ``fn`` maps the features after the previous stage to these."""
        return list(self.named_children())

    def begin(self, x: Tensor) -> Features:
        """Features before the first stage (checks the input; the input itself for chains)."""
        return x

    def end(self, h: Features) -> Tensor:
        """The model output from the features after the last stage."""
        return h

    def forward(self, x: Tensor) -> Tensor:
        return self.end(_run(self.stages(), self.begin(x)))


def _run(stages: Sequence[Stage], h: Features) -> Features:
    for _, fn in stages:
        h = fn(h)
    return h


def _plan(model: nn.Module) -> tuple[Callable[[Tensor], Features], list[Stage], Callable[[Features], Tensor]]:
    if isinstance(model, StagedModel):
        return model.begin, model.stages(), model.end
    raise ConfigError(
        f"model {type(model).__name__} does not declare stages, so it cannot be split; "
        "subclass fedaug.models.split.StagedModel (children run in order, or override stages())"
    )


def split_stages(model: nn.Module) -> tuple[str, ...]:
    """The names at which ``model`` can be split, in forward order (every stage, the last included)."""
    return tuple(name for name, _ in _plan(model)[1])


def _index(stages: Sequence[Stage], model: nn.Module, stage: str) -> int:
    names = [n for n, _ in stages]
    if stage not in names:
        raise ConfigError(
            f"cannot split {type(model).__name__} at '{stage}'{suggest(stage, names)}: "
            f"not one of its stages; splittable stages are: {', '.join(names)}. Modules nested inside "
            "a stage can take attached layers but are not split points; split at their stage instead"
        )
    return names.index(stage)


def forward_front(model: nn.Module, x: Tensor, stage: str) -> Features:
    """Run ``model`` from its input up to and including ``stage``.

    Args:
        model: a :class:`StagedModel`.
        x: the model input, e.g. ``(B, C, H, W)``.
        stage: one of :func:`split_stages` (``model.feature_stages`` are all valid).

    Returns:
        The features after ``stage``: a tensor ``(B, C_l, *spatial_l)``, or ``(h, skips)`` for U-Nets.
        Layers attached after ``stage`` (or before it) have been applied.

    Raises:
        ConfigError: ``stage`` is not a stage of ``model``; the message lists the splittable ones.
    """
    begin, stages, _ = _plan(model)
    return _run(stages[: _index(stages, model, stage) + 1], begin(x))


def forward_back(model: nn.Module, features: Features, stage: str) -> Tensor:
    """Run ``model`` from the features after ``stage`` to its output.

    Args:
        model: as for :func:`forward_front`.
        features: what :func:`forward_front` returned for ``stage`` (possibly mixed or replaced,
            with the same structure and shapes).
        stage: the stage the features come after.

    Returns:
        The model output, e.g. logits ``(B, num_classes)`` or ``(B, num_classes, *spatial)``.

    Raises:
        ConfigError: ``stage`` is not a stage of ``model``.
    """
    _, stages, end = _plan(model)
    return end(_run(stages[_index(stages, model, stage) + 1 :], features))


def split_model(model: nn.Module, stage: str) -> tuple[Callable[[Tensor], Features], Callable[[Features], Tensor]]:
    """Return ``(front, back)`` callables with ``back(front(x)) == model(x)``.

    Both share ``model``'s parameters (nothing is copied); train or evaluate ``model`` as usual.

    >>> import torch
    >>> from fedaug.models import build_model
    >>> m = build_model("audionet", in_channels=2, num_classes=10).eval()
    >>> front, back = split_model(m, "block2")
    >>> x = torch.randn(2, 2, 64, 344)
    >>> front(x).shape
    torch.Size([2, 16, 16, 86])
    >>> torch.equal(back(front(x)), m(x))
    True
    """
    _index(_plan(model)[1], model, stage)
    return (lambda x: forward_front(model, x, stage)), (lambda h: forward_back(model, h, stage))


def _cat(parts: Sequence[Features]) -> Features:
    """Concatenate features of consecutive chunks along the batch: tensors, or tuples of them (U-Nets)."""
    if isinstance(parts[0], Tensor):
        return torch.cat(parts)
    return tuple(_cat(column) for column in zip(*parts))


def extract_features(model: nn.Module, x: Tensor, stage: str, chunk: int = 256) -> Features:
    """``theta[:l](x)``: :func:`forward_front` over ``x`` in chunks of ``chunk`` samples, concatenated
    (FLea, KDD 2024, Sec. 3.2: the features a client shares; the caller sets eval mode and ``no_grad``).

    Args:
        model: a :class:`StagedModel`, e.g. holding the global weights.
        x: ``(k, *in_shape)``, k >= 0.
        stage: the split stage l.
        chunk: samples per forward pass.

    Returns:
        The features at ``stage`` of all ``k`` samples: a tensor ``(k, *feature_shape)``, or for
        U-Nets ``(h, skips)`` with every tensor holding ``k`` rows.

    Raises:
        ConfigError: ``stage`` is not a stage of ``model``.

    >>> import torch
    >>> from fedaug.models import build_model
    >>> m = build_model("small_cnn", in_channels=1, num_classes=10).eval()
    >>> extract_features(m, torch.randn(5, 1, 28, 28), "block2", chunk=2).shape
    torch.Size([5, 32, 14, 14])
    """
    if x.shape[0] == 0:  # a client too small to share still answers, with no rows
        return forward_front(model, x, stage)
    return _cat([forward_front(model, x[i : i + chunk], stage) for i in range(0, x.shape[0], chunk)])
