"""Helpers of the input-level augmentation tests: a client context on given data, a tiny run config."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fedaug.config.schema import RunConfig, validate
from fedaug.data.base import Split
from fedaug.methods.component import ClientCtx
from fedaug.metrics.tasks import make_task
from tests.conftest import tiny_raw


def make_ctx(x: torch.Tensor, y: torch.Tensor | None = None, *, client_id: int = 0, round: int = 1,
             phase: str = "train", num_classes: int = 4, model: nn.Module | None = None,
             component: str = "test") -> ClientCtx:
    """A :class:`ClientCtx` whose training split is ``(x, y)`` (labels 0 when not given)."""
    y = torch.zeros(x.shape[0], dtype=torch.int64) if y is None else y
    return ClientCtx(model or nn.Identity(), client_id, round, 0, Split(x, y), phase=phase,
                     task=make_task("classification", num_classes), component=component)


def tiny_cfg(augs: list[str], options: dict[str, Any] | None = None, **train: Any) -> RunConfig:
    """The shared tiny synthetic config (3 clients, 4 classes, 1x8x8 inputs) with these augmentations."""
    raw = tiny_raw(**train)
    raw["method"] = {"base": "fedavg", "augs": augs, "options": options or {}}
    return validate(raw)
