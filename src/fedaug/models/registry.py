"""The model registry: name -> builder ``(in_channels, num_classes, **options) -> nn.Module``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from fedaug.core.registry import Registry
from fedaug.data.registry import check_options

ModelBuilder = Callable[..., nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")


def build_model(name: str, in_channels: int, num_classes: int, **options: Any) -> nn.Module:
    """Build the registered model ``name`` (options validated against its keyword parameters)."""
    builder = MODELS.get(name)
    check_options("model", name, builder, options)
    return builder(in_channels=in_channels, num_classes=num_classes, **options)
