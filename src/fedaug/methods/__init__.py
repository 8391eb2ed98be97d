"""Methods: server rules, local objectives and augmentations as :class:`Component` s composed by a
:class:`Recipe`."""

from fedaug.methods import addon, aug, base, objective  # noqa: F401  (registers every component)
from fedaug.methods.component import Batch, ClientCtx, Component, State, Uplink
from fedaug.methods.recipe import METHODS, Recipe, build_recipe

__all__ = ["METHODS", "Batch", "ClientCtx", "Component", "Recipe", "State", "Uplink", "build_recipe"]
