"""Plug-in layers and attaching them after named modules of any model (forward hooks, no wrapping)."""

from fedaug.layers.attach import AttachHandle, attach, attach_default, stage_channels
from fedaug.layers.ffa import FFALayer

__all__ = ["AttachHandle", "FFALayer", "attach", "attach_default", "stage_channels"]
