"""Data layer: federated datasets (clients with train/val/test splits) and their registry."""

from fedaug.data import digits4, fashion_mnist, synthetic  # noqa: F401  (registers)
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.registry import DATASETS, load_dataset

__all__ = ["DATASETS", "ClientData", "FederatedData", "Split", "load_dataset"]
