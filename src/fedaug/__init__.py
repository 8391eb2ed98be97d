"""fedaug: federated learning on heterogeneous clients with federated augmentation.

Importing the package registers the built-in datasets, models and methods.
"""

__version__ = "0.1.0"

from fedaug import data, methods, models  # noqa: E402  (register built-ins)
from fedaug.config import RunConfig, load_config  # noqa: E402
from fedaug.core.errors import (  # noqa: E402
    AttachError, CheckpointError, ConfigError, DataError, FedaugError, PayloadError,
)
from fedaug.engine import Simulation, run_experiment  # noqa: E402
from fedaug.methods import Batch, ClientCtx, Component, Recipe, build_recipe  # noqa: E402

__all__ = [
    "AttachError", "Batch", "CheckpointError", "ClientCtx", "Component", "ConfigError", "DataError",
    "FedaugError", "PayloadError", "Recipe", "RunConfig", "Simulation", "build_recipe", "data",
    "load_config", "methods", "models", "run_experiment",
]
