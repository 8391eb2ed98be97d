"""Server rules: each owns the model weights and how the server aggregates them, and composes with
any local objectives and augmentations (see ``docs/baselines.md``). Importing this package registers them."""

from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.base.fedbn import FedBN
from fedaug.methods.base.feddyn import FedDyn
from fedaug.methods.base.fednova import FedNova
from fedaug.methods.base.fedproto import FedProto
from fedaug.methods.base.robust import Krum, Median, TrimmedMean
from fedaug.methods.base.scaffold import SCAFFOLD
from fedaug.methods.base.server_opt import FedAdam, FedAvgM, FedYogi

__all__ = ["SCAFFOLD", "FedAdam", "FedAvg", "FedAvgM", "FedBN", "FedDyn", "FedNova", "FedProto", "FedYogi", "Krum",
           "Median", "TrimmedMean"]
