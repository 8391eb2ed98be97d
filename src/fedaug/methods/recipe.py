"""A recipe: one base algorithm plus augmentations in a declared order (MONAI ``Compose`` style)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedaug.core.errors import ConfigError
from fedaug.core.registry import Registry
from fedaug.data.registry import check_options
from fedaug.methods.component import Component

METHODS: Registry[type[Component]] = Registry("method")

#: hooks that exactly one component may provide; the others run for every component.
REPLACEABLE = ("forward", "task_loss", "step")
#: hooks the engine calls per batch, only for the components that override them.
PER_BATCH = ("transform_batch", "loss_terms", "before_step")


def overrides(component: Component, hook: str) -> bool:
    """Whether ``component``'s class overrides :class:`Component`'s ``hook``."""
    return getattr(type(component), hook) is not getattr(Component, hook)


class Recipe:
    """A base algorithm and zero or more augmentations.

    Args:
        base: the base algorithm (``role == "base"``); it owns the model weights.
        augs: augmentations, applied in this order (``transform_batch`` of the first runs first).

    Raises:
        ConfigError: the base is an augmentation or vice versa, a name repeats, or two
            components replace the same hook (the message names both).

    >>> from fedaug.methods.fedavg import FedAvg
    >>> Recipe(FedAvg()).names
    ('fedavg',)
    """

    def __init__(self, base: Component, augs: Sequence[Component] = ()) -> None:
        problems = []
        if base.role != "base":
            problems.append(f"'{base.name}' is an augmentation, not a base algorithm")
        for aug in augs:
            if aug.role != "augmentation":
                problems.append(f"'{aug.name}' is a base algorithm; a recipe has exactly one")
        components = (base, *augs)
        names = [c.name for c in components]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            problems.append(f"component(s) listed twice: {', '.join(repeated)}")
        self.replacer: dict[str, Component] = {}
        for hook in REPLACEABLE:
            owners = [c for c in components if overrides(c, hook)]
            if len(owners) > 1:
                problems.append(
                    f"both '{owners[0].name}' and '{owners[1].name}' replace '{hook}'; "
                    "at most one component per recipe may"
                )
            self.replacer[hook] = owners[0] if owners else base
        if problems:
            raise ConfigError("invalid method: " + "; ".join(problems))
        self.base = base
        self.components: tuple[Component, ...] = components
        self.names: tuple[str, ...] = tuple(names)
        self.per_batch = {
            hook: tuple(c for c in components if overrides(c, hook)) for hook in PER_BATCH
        }


def build_component(name: str, options: Mapping[str, Any]) -> Component:
    """Instantiate the registered component ``name`` with its (validated) keyword options."""
    cls = METHODS.get(name)
    check_options("method", name, cls.__init__, dict(options))
    return cls(**options)


def build_recipe(
    base: str, augs: Sequence[str] = (), options: Mapping[str, Mapping[str, Any]] | None = None
) -> Recipe:
    """Build a :class:`Recipe` from registry names and per-component option tables.

    Args:
        base: registry name of the base algorithm (``"fedavg"``).
        augs: registry names of the augmentations, in order.
        options: ``{component name: {option: value}}``; a table for a component that is not in
            the recipe is an error (it would silently do nothing).
    """
    options = dict(options or {})
    unused = sorted(set(options) - {base, *augs})
    if unused:
        raise ConfigError(
            f"options given for method component(s) not in the recipe: {', '.join(unused)}; "
            f"the recipe is base='{base}', augs={list(augs)}: add them to method.augs or remove "
            "their tables"
        )
    return Recipe(
        build_component(base, options.get(base, {})),
        [build_component(a, options.get(a, {})) for a in augs],
    )
