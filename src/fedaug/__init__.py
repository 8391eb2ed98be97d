"""fedaug: federated learning on heterogeneous clients with federated augmentation.

Importing the package registers the built-in datasets, models and methods.
"""

from fedaug.core.version import __version__  # first: bound before the imports below run
from fedaug import data, methods, models  # (register built-ins)
from fedaug.config import RunConfig, load_config
from fedaug.core.errors import (
    AttachError, CheckpointError, ConfigError, DataError, FedaugError, PayloadError,
)
from fedaug.engine import Simulation, run_experiment
from fedaug.methods import Batch, ClientCtx, Component, Recipe, build_recipe

__all__ = [
    "AttachError", "Batch", "CheckpointError", "ClientCtx", "Component", "ConfigError", "DataError",
    "FedaugError", "PayloadError", "Recipe", "RunConfig", "Simulation", "build_recipe", "data",
    "load_config", "methods", "models", "run_experiment",
]
