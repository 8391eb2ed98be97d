"""Tasks: what the engine optimises and measures for a dataset's ``task``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from fedaug.core.errors import ConfigError
from fedaug.metrics.classification import ClassificationMeter, classification_loss
from fedaug.metrics.segmentation import SegmentationMeter, segmentation_loss


class Meter(Protocol):
    def update(self, logits: Tensor, y: Tensor) -> None: ...
    def merge(self, other: "Meter") -> None: ...
    def result(self) -> dict: ...
    def state(self) -> dict: ...
    def load_state(self, state: dict) -> None: ...


@dataclass(frozen=True)
class Task:
    """A task's loss, its meter and the name of its main metric (``acc`` or ``dice``)."""

    name: str
    metric: str
    num_classes: int

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """The training loss: cross-entropy (classification) or CE + soft Dice (segmentation)."""
        return classification_loss(logits, y) if self.name == "classification" else segmentation_loss(logits, y)

    def meter(self) -> Meter:
        return ClassificationMeter() if self.name == "classification" else SegmentationMeter(self.num_classes)


def make_task(name: str, num_classes: int) -> Task:
    """The :class:`Task` for a dataset's ``task`` field."""
    if name == "classification":
        return Task(name, "acc", num_classes)
    if name == "segmentation":
        return Task(name, "dice", num_classes)
    raise ConfigError(f"unknown task '{name}'; fedaug trains classification and segmentation")
