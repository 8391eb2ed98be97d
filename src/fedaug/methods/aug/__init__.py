"""Augmentations: components that change what a client trains on (inputs or features)."""

from fedaug.methods.aug import fedfa, vfda  # noqa: F401  (registers)
from fedaug.methods.aug import feddata, fedmix, fedrdn, mixstyle, mixup, moex, norm  # noqa: F401  (registers)
from fedaug.methods.aug import flea  # noqa: F401  (registers)
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.aug.vfda import VFDA

__all__ = ["VFDA", "FedFA"]
