"""Classification loss and accuracy."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def classification_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy.

    Args:
        logits: ``(B, K)``.
        y: class indices ``(B,)`` int64, or soft labels ``(B, K)`` float summing to 1 per row.
    """
    return F.cross_entropy(logits, y)


class ClassificationMeter:
    """Accumulates summed loss, correct predictions and count over batches."""

    def __init__(self) -> None:
        self.loss_sum = 0.0
        self.correct = 0
        self.count = 0

    def update(self, logits: Tensor, y: Tensor) -> None:
        """Add a batch: ``logits (B, K)``, ``y (B,)`` int64."""
        self.loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        self.correct += int((logits.argmax(1) == y).sum())
        self.count += int(y.shape[0])

    def merge(self, other: "ClassificationMeter") -> None:
        """Add another meter's counts (pooling clients)."""
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.count += other.count

    def state(self) -> dict[str, float | int]:
        """The counts as plain data, to carry the meter to another process (:meth:`load_state`)."""
        return {"loss_sum": self.loss_sum, "correct": self.correct, "count": self.count}

    def load_state(self, state: dict[str, float | int]) -> None:
        """Set the counts from :meth:`state`'s output."""
        self.loss_sum, self.correct, self.count = float(state["loss_sum"]), int(state["correct"]), int(state["count"])

    def result(self) -> dict[str, float]:
        """``{"acc", "loss", "n"}``; accuracy and loss are NaN-free: empty gives 0 and n = 0."""
        if self.count == 0:
            return {"acc": 0.0, "loss": 0.0, "n": 0}
        return {"acc": self.correct / self.count, "loss": self.loss_sum / self.count, "n": self.count}

