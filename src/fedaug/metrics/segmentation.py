"""Segmentation loss (cross-entropy + soft Dice) and foreground Dice."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def soft_dice_loss(logits: Tensor, y: Tensor, eps: float = 1e-5) -> Tensor:
    """``1 - mean_c Dice_c`` over the foreground classes ``c = 1..K-1`` of softmax probabilities.

    Args:
        logits: ``(B, K, *spatial)``.
        y: ``(B, *spatial)`` int64 class indices.

    Dice_c = (2 sum p_c g_c + eps) / (sum p_c + sum g_c + eps), summed over the batch and space.
    """
    probs = logits.softmax(1)
    onehot = F.one_hot(y, logits.shape[1]).movedim(-1, 1).to(probs.dtype)
    dims = [0, *range(2, logits.dim())]
    inter = (probs * onehot).sum(dims)[1:]
    card = (probs + onehot).sum(dims)[1:]
    return 1 - ((2 * inter + eps) / (card + eps)).mean()


def segmentation_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy plus soft foreground Dice loss (both means over the batch).

    Args:
        logits: ``(B, K, *spatial)``.
        y: ``(B, *spatial)`` int64.
    """
    return F.cross_entropy(logits, y) + soft_dice_loss(logits, y)


class SegmentationMeter:
    """Accumulates per-class true positives, predicted and true counts over batches.

    Dice per class is computed over all pixels/voxels of the evaluated split (micro); the reported
    ``dice`` is the mean over **foreground** classes only (the FedFA public code averaged the
    background in, which inflates scores). The counts and the loss sum stay float64 tensors on the logits'
    device while batches are added (no host read per batch: on a GPU each would be a synchronisation; the
    same bits as the host sums of Python floats); the server reads a reply's counts at once
    (:func:`fedaug.engine.server.evaluation.meters_of`).
    """

    def __init__(self, num_classes: int) -> None:
        self.k = num_classes
        self.tp = torch.zeros(num_classes, dtype=torch.float64)
        self.pred = torch.zeros(num_classes, dtype=torch.float64)
        self.true = torch.zeros(num_classes, dtype=torch.float64)
        self.loss_sum: Tensor | float = 0.0
        self.count = 0

    def update(self, logits: Tensor, y: Tensor) -> None:
        """Add a batch: ``logits (B, K, *spatial)``, ``y (B, *spatial)`` int64."""
        pred, d = logits.argmax(1), logits.device
        self.tp = self.tp.to(d) + torch.bincount(y[pred == y].flatten(), minlength=self.k).double()
        self.pred = self.pred.to(d) + torch.bincount(pred.flatten(), minlength=self.k).double()
        self.true = self.true.to(d) + torch.bincount(y.flatten(), minlength=self.k).double()
        self.loss_sum = self.loss_sum + segmentation_loss(logits, y).double() * y.shape[0]
        self.count += int(y.shape[0])

    def merge(self, other: "SegmentationMeter") -> None:
        self.tp += other.tp
        self.pred += other.pred
        self.true += other.true
        self.loss_sum += other.loss_sum
        self.count += other.count

    def state(self) -> dict[str, Tensor | float | int]:
        """The counts as data (tensors while on the device that computed them), to carry the meter to
        another process (:meth:`load_state`)."""
        return {"tp": self.tp, "pred": self.pred, "true": self.true, "loss_sum": self.loss_sum, "count": self.count}

    def load_state(self, state: dict[str, Tensor | float | int]) -> None:
        """Set the counts from :meth:`state`'s output (tensors, or numbers and lists of them)."""
        self.tp, self.pred, self.true = (torch.as_tensor(state[k], dtype=torch.float64) for k in ("tp", "pred", "true"))
        self.loss_sum, self.count = float(state["loss_sum"]), int(state["count"])

    def result(self) -> dict[str, float | list[float]]:
        """``{"dice", "dice_per_class" (foreground, class 1..K-1), "loss", "n"}``."""
        if self.count == 0:
            return {"dice": 0.0, "dice_per_class": [0.0] * (self.k - 1), "loss": 0.0, "n": 0}
        denom = self.pred + self.true
        dice = torch.where(denom > 0, 2 * self.tp / denom.clamp_min(1), torch.ones_like(denom))[1:]
        return {"dice": float(dice.mean()), "dice_per_class": dice.tolist(),
                "loss": float(self.loss_sum) / self.count, "n": self.count}
