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
    """Accumulates summed loss, correct predictions and count over batches.

    The sums stay tensors on the logits' device while batches are added (no host read per batch: on a GPU
    each would be a synchronisation): ``loss_sum`` float64 (each batch's float32 sum widened exactly, then
    added in float64: the same bits as adding Python floats), ``correct`` int64; ``count`` comes from
    shapes. :meth:`load_state` takes them back as numbers (the server reads a reply's counts at once,
    :func:`fedaug.engine.server.evaluation.meters_of`).
    """

    def __init__(self) -> None:
        self.loss_sum: Tensor | float = 0.0
        self.correct: Tensor | int = 0
        self.count = 0

    def update(self, logits: Tensor, y: Tensor) -> None:
        """Add a batch: ``logits (B, K)``, ``y (B,)`` int64."""
        self.loss_sum = self.loss_sum + F.cross_entropy(logits, y, reduction="sum").double()
        self.correct = self.correct + (logits.argmax(1) == y).sum()
        self.count += int(y.shape[0])

    def merge(self, other: "ClassificationMeter") -> None:
        """Add another meter's counts (pooling clients)."""
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.count += other.count

    def state(self) -> dict[str, Tensor | float | int]:
        """The counts as data (tensors while on the device that computed them), to carry the meter to
        another process (:meth:`load_state`)."""
        return {"loss_sum": self.loss_sum, "correct": self.correct, "count": self.count}

    def load_state(self, state: dict[str, Tensor | float | int]) -> None:
        """Set the counts from :meth:`state`'s output (tensors or numbers)."""
        self.loss_sum, self.correct, self.count = float(state["loss_sum"]), int(state["correct"]), int(state["count"])

    def result(self) -> dict[str, float]:
        """``{"acc", "loss", "n"}``; accuracy and loss are NaN-free: empty gives 0 and n = 0."""
        if self.count == 0:
            return {"acc": 0.0, "loss": 0.0, "n": 0}
        return {"acc": int(self.correct) / self.count, "loss": float(self.loss_sum) / self.count, "n": self.count}
