"""Plug-in layers and attaching them after named modules of any model (forward hooks, no wrapping)."""

from fedaug.layers.attach import AttachHandle, attach, attach_default, stage_channels

__all__ = ["AttachHandle", "attach", "attach_default", "stage_channels"]
