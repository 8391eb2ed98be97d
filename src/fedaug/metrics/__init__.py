"""Metrics and task losses."""

from fedaug.metrics.classification import ClassificationMeter, classification_loss
from fedaug.metrics.segmentation import SegmentationMeter, segmentation_loss, soft_dice_loss
from fedaug.metrics.tasks import Task, make_task

__all__ = ["ClassificationMeter", "SegmentationMeter", "Task", "classification_loss", "make_task",
           "segmentation_loss", "soft_dice_loss"]
