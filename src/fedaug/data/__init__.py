"""Data layer: federated datasets (clients with train/val/test splits) and their registry."""

from fedaug.data import (  # noqa: F401  (registers)
    brain_mri,
    digits4,
    fashion_mnist,
    image_folder,
    imu,
    local_images,
    local_signals,
    spoken_digits,
    synthetic,
)
from fedaug.data.base import ClientData, FederatedData, Split
from fedaug.data.registry import DATASETS, load_dataset

__all__ = ["DATASETS", "ClientData", "FederatedData", "Split", "load_dataset"]
