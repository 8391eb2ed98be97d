"""fedaug: federated learning on heterogeneous clients with federated augmentation.

Importing the package is light (it does not import torch, so that ``fedaug --help`` and ``fedaug
list`` start at once): the names below are imported on first use (PEP 562). Importing
``fedaug.data``, ``fedaug.models`` or ``fedaug.methods`` (or anything from them) registers their
built-in datasets, models and methods.
"""

from __future__ import annotations

import importlib
from typing import Any

from fedaug.core.version import __version__

#: exported name -> the module it is imported from, on first use
_EXPORTS = {
    **dict.fromkeys(("AttachError", "CheckpointError", "ConfigError", "DataError", "FedaugError", "PayloadError"),
                    "fedaug.core.errors"),
    "RunConfig": "fedaug.config", "load_config": "fedaug.config",
    "Simulation": "fedaug.engine", "run_experiment": "fedaug.engine",
    **dict.fromkeys(("Batch", "ClientCtx", "Component", "Recipe", "build_recipe"), "fedaug.methods"),
}
_SUBPACKAGES = ("analysis", "cli", "config", "core", "data", "engine", "layers", "methods", "metrics", "models",
                "privacy", "report")

__all__ = ["AttachError", "Batch", "CheckpointError", "ClientCtx", "Component", "ConfigError", "DataError",
           "FedaugError", "PayloadError", "Recipe", "RunConfig", "Simulation", "build_recipe", "data",
           "load_config", "methods", "models", "run_experiment"]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"fedaug.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedaug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
