"""Add-ons: components that act on the global model outside local training (CCVR's classifier
calibration). Importing this package registers them."""

from fedaug.methods.addon.ccvr import CCVR

__all__ = ["CCVR"]
