"""Baseline algorithms, each a :class:`~fedaug.methods.component.Component` that composes with any
augmentation (see ``docs/baselines.md``). Importing this package registers them."""

from fedaug.methods.base.ccvr import CCVR
from fedaug.methods.base.feddecorr import FedDecorr
from fedaug.methods.base.feddyn import FedDyn
from fedaug.methods.base.fedbn import FedBN
from fedaug.methods.base.fednova import FedNova
from fedaug.methods.base.fedntd import FedNTD
from fedaug.methods.base.fedproto import FedProto
from fedaug.methods.base.fedprox import FedProx
from fedaug.methods.base.fedsam import FedSAM
from fedaug.methods.base.label_skew import FedLC, FedRS
from fedaug.methods.base.moon import MOON
from fedaug.methods.base.scaffold import SCAFFOLD
from fedaug.methods.base.server_opt import FedAdam, FedAvgM, FedYogi

__all__ = ["CCVR", "MOON", "SCAFFOLD", "FedAdam", "FedAvgM", "FedBN", "FedDecorr", "FedDyn", "FedLC",
           "FedNTD", "FedNova", "FedProto", "FedProx", "FedRS", "FedSAM", "FedYogi"]
