"""Methods: base algorithms and augmentations as :class:`Component` s composed by a :class:`Recipe`."""

from fedaug.methods import fedavg  # noqa: F401  (registers)
from fedaug.methods import base  # noqa: F401  (registers the baselines)
from fedaug.methods import aug  # noqa: F401  (registers fedfa, vfda)
from fedaug.methods.component import Batch, ClientCtx, Component, State, Uplink
from fedaug.methods.recipe import METHODS, Recipe, build_recipe

__all__ = ["METHODS", "Batch", "ClientCtx", "Component", "Recipe", "State", "Uplink", "build_recipe"]
