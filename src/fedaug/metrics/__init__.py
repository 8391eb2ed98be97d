"""Metrics and task losses."""

from fedaug.metrics.classification import ClassificationMeter, classification_loss

__all__ = ["ClassificationMeter", "classification_loss"]
