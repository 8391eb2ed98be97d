"""Local objectives: loss terms, task losses and optimiser steps that change what a client minimises,
composable with any server rule (``method.augs = ["fedprox", ...]``). Importing this package registers them."""

from fedaug.methods.objective.feddecorr import FedDecorr
from fedaug.methods.objective.fedntd import FedNTD
from fedaug.methods.objective.fedprox import FedProx
from fedaug.methods.objective.fedsam import FedSAM
from fedaug.methods.objective.label_skew import FedLC, FedRS
from fedaug.methods.objective.moon import MOON

__all__ = ["MOON", "FedDecorr", "FedLC", "FedNTD", "FedProx", "FedRS", "FedSAM"]
