"""Segmentation loss and foreground Dice against hand-computed values."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedaug.metrics.segmentation import SegmentationMeter, segmentation_loss, soft_dice_loss


def test_foreground_dice_golden_values():
    # 1 image 1x4, 3 classes. truth = [0, 1, 1, 2], prediction = [0, 1, 2, 2]
    y = torch.tensor([[[0, 1, 1, 2]]])
    pred = torch.tensor([[[0, 1, 2, 2]]])
    logits = F.one_hot(pred, 3).movedim(-1, 1).float() * 10
    meter = SegmentationMeter(3)
    meter.update(logits, y)
    res = meter.result()
    # class 1: tp 1, pred 1, true 2 -> 2/3 ; class 2: tp 1, pred 2, true 1 -> 2/3 ; background excluded
    assert res["dice_per_class"] == [2 / 3, 2 / 3]
    assert math.isclose(res["dice"], 2 / 3)
    assert res["n"] == 1


def test_dice_is_micro_over_batches_and_merges():
    y = torch.tensor([[[1, 1]], [[0, 0]]])
    logits = F.one_hot(torch.tensor([[[1, 0]], [[1, 0]]]), 2).movedim(-1, 1).float()
    a, b = SegmentationMeter(2), SegmentationMeter(2)
    a.update(logits[:1], y[:1])
    b.update(logits[1:], y[1:])
    a.merge(b)
    # class 1 over both: tp 1, pred 2, true 2 -> 0.5
    assert a.result()["dice"] == 0.5


def test_soft_dice_loss_golden_and_segmentation_loss_sum():
    logits = torch.tensor([[[[0.0, 0.0]], [[math.log(3.0), 0.0]]]])  # (1, 2, 1, 2): p1 = [0.75, 0.5]
    y = torch.tensor([[[1, 0]]])
    inter, card = 0.75, 0.75 + 0.5 + 1
    expected = 1 - (2 * inter + 1e-5) / (card + 1e-5)
    assert torch.isclose(soft_dice_loss(logits, y), torch.tensor(expected))
    total = F.cross_entropy(logits, y) + expected
    assert torch.isclose(segmentation_loss(logits, y), total)


def test_perfect_prediction_gives_dice_one_and_empty_classes_count_as_one():
    y = torch.tensor([[[0, 1, 1]]])
    logits = F.one_hot(y, 3).movedim(-1, 1).float()
    meter = SegmentationMeter(3)
    meter.update(logits, y)
    assert meter.result()["dice_per_class"] == [1.0, 1.0]  # class 2 absent in both: 1 by convention
