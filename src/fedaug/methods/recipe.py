"""A recipe: one server rule, any local objectives and any augmentations, in a declared order
(MONAI ``Compose`` style)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedaug.config.paths import Key, declare_tables
from fedaug.core.errors import ConfigError
from fedaug.core.registry import Registry
from fedaug.data.registry import check_options
from fedaug.methods.component import PHASES, Component, Phase

METHODS: Registry[type[Component]] = Registry("method")

#: hooks that exactly one component may provide; the others run for every component.
REPLACEABLE = ("forward", "task_loss", "step")
#: hooks the engine calls per batch, only for the components that override them.
PER_BATCH = ("transform_batch", "loss_terms", "before_step")
#: the hooks whose step forms run in their place in every execution, eager too (the engine's step,
#: :mod:`fedaug.engine.client.step`): ``{hook: the step forms that replace it}``, the first a class
#: overrides being the one that runs. A component that overrides a hook below (or beside) the class that
#: gives one of its step forms would never have it called: the recipe refuses it (:func:`ignored_hooks`).
TAKEN_OVER: dict[str, tuple[str, ...]] = {
    "forward": ("group_replace_forward",),
    "loss_terms": ("group_replace_forward", "group_loss_terms"),  # the forward's replacer returns its terms
    "group_loss_terms": ("group_replace_forward",),
    "before_step": ("group_before_step",),
}
#: the server rule a legacy ``base = "<objective>"`` stands for (``base = "fedprox"`` is FedAvg + FedProx).
LEGACY_SERVER = "fedavg"


def overrides(component: Component, hook: str) -> bool:
    """Whether ``component``'s class overrides :class:`Component`'s ``hook``."""
    return getattr(type(component), hook) is not getattr(Component, hook)


def replaces(component: Component, hook: str) -> bool:
    """Whether ``component`` replaces the replaceable ``hook`` (:data:`REPLACEABLE`): overrides it, or, for
    ``forward``, its step form ``group_replace_forward``."""
    return overrides(component, hook) or (hook == "forward" and overrides(component, "group_replace_forward"))


def defining_class(cls: type, attr: str) -> type:
    """The class of ``cls``'s MRO that defines ``attr``."""
    return next(k for k in cls.__mro__ if attr in vars(k))


def _call(hook: str) -> str:
    """``hook`` as a call with :class:`Component`'s parameter names (``before_step(ctx, optimizer)``)."""
    return f"{hook}({', '.join(list(inspect.signature(getattr(Component, hook)).parameters)[1:])})"


def ignored_hooks(component: Component) -> list[str]:
    """Why hooks that ``component`` overrides would never be called, one message each (empty: none).

    A hook of :data:`TAKEN_OVER` is never called when one of its step forms is overridden too, unless the
    step form is defined in a subclass of the class that defines the hook (a step form written to replace
    it): e.g. a subclass of FLea that overrides ``forward``, which FLea's ``group_replace_forward`` replaces
    in eager, grouped and captured training alike. Each message names the hook and what to override instead.
    """
    out = []
    for hook, forms in TAKEN_OVER.items():
        form = next((f for f in forms if overrides(component, f)), None)
        if form is None or not overrides(component, hook):
            continue
        owner, runs = defining_class(type(component), hook), defining_class(type(component), form)
        if runs is not owner and issubclass(runs, owner):
            continue
        terms = (" and return its terms in the third value" if hook.endswith("loss_terms")
                 and form == "group_replace_forward" else "")
        fix = (f"move what it does into {_call(form)}{terms} and drop '{hook}'" if runs is owner else
               f"override {_call(form)} instead{terms}, calling super().{form}(...) to keep what {runs.__name__} does")
        out.append(f"'{component.name}' ({type(component).__name__}) overrides '{hook}', which is never called: "
                   f"{runs.__name__}'s step form '{form}' runs in its place in eager, grouped and captured training; "
                   f"{fix}")
    return out


class Recipe:
    """One server rule, then local objectives and augmentations in order.

    Args:
        base: the server rule (``role == "server"``); it owns the model weights.
        augs: local objectives and augmentations, in order (``transform_batch`` of the first runs
            first, and feature layers attached at one module chain in this order).

    Raises:
        ConfigError: the base is not a server rule or an entry of ``augs`` is one, a name repeats,
            two components replace the same hook, a component overrides a hook that its own step form
            replaces (:func:`ignored_hooks`), a component needs a global model that the server rule
            does not keep, or one needs double backward through layers (of another) that do not
            support it (each message names the components and the reason).

    >>> from fedaug.methods.base.fedavg import FedAvg
    >>> Recipe(FedAvg()).names
    ('fedavg',)
    """

    def __init__(self, base: Component, augs: Sequence[Component] = ()) -> None:
        problems = []
        if base.role != "server":
            problems.append(f"'{base.name}' is a {base.role.replace('objective', 'local objective')}, not a server "
                            f"rule; use a server rule as the base (e.g. fedavg) and list '{base.name}' in augs")
        for aug in augs:
            if aug.role == "server":
                problems.append(f"'{aug.name}' is a server rule; a recipe has exactly one (the base, here "
                                f"'{base.name}')")
        components = (base, *augs)
        names = [c.name for c in components]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            problems.append(f"component(s) listed twice: {', '.join(repeated)}")
        problems += [why for c in components for why in ignored_hooks(c)]
        self.replacer: dict[str, Component] = {}
        for hook in REPLACEABLE:
            owners = [c for c in components if replaces(c, hook)]
            if len(owners) > 1:
                problems.append(
                    f"both '{owners[0].name}' and '{owners[1].name}' replace '{hook}'; "
                    "at most one component per recipe may"
                )
            self.replacer[hook] = owners[0] if owners else base
        if base.role == "server" and not base.keeps_global_model:
            for c in augs:
                if c.needs_global_model:
                    problems.append(f"'{c.name}' needs a global model, but the server rule '{base.name}' keeps none "
                                    "(each client trains its own model); drop one of them")
        for needs in (c for c in components if c.needs_double_backward):
            for layers in (c for c in components if not c.double_backward):
                problems.append(f"'{needs.name}' differentiates a gradient again (double backward), which the layers "
                                f"of '{layers.name}' do not support on the fused kernels; set "
                                f"method.options.{layers.name}.kernel='off' (the pure-PyTorch path)")
        if problems:
            raise ConfigError("invalid method: " + "; ".join(problems))
        self.base = base
        self.components: tuple[Component, ...] = components
        self.names: tuple[str, ...] = tuple(names)
        self.per_batch = {
            hook: tuple(c for c in components if overrides(c, hook)) for hook in PER_BATCH
        }
        self._participants = {phase: tuple(c for c in components if phase in c.phases) for phase in PHASES}
        transforms = self.per_batch["transform_batch"]
        #: each component's evaluation-mode input pipeline: the components before it that transform batches
        self.transforms_before = {c.name: tuple(b for b in components[:i] if b in transforms)
                                  for i, c in enumerate(components)}

    def participants(self, phase: Phase) -> tuple[Component, ...]:
        """The components that take part in ``phase``, in recipe order."""
        return self._participants[phase]


def build_component(name: str, options: Mapping[str, Any]) -> Component:
    """Instantiate the registered component ``name`` with its (validated) keyword options."""
    cls = METHODS.get(name)
    check_options("method", name, cls.__init__, dict(options))
    return cls(**options)


@declare_tables
def component_tables(raw: Mapping[str, Any]) -> list[tuple[Key, Callable[..., Any]]]:
    """The ``method.options.<name>`` tables of ``raw`` (a config) that name a registered component, each
    with the ``__init__`` whose keyword options fill it (where :func:`fedaug.config.paths.path_keys`
    finds the components' path options)."""
    method = raw.get("method")
    tables = method.get("options") if isinstance(method, Mapping) else None
    if not isinstance(tables, Mapping):
        return []
    out: list[tuple[Key, Callable[..., Any]]] = []
    for name in tables:
        try:
            out.append((("method", "options", name), METHODS.get(str(name)).__init__))
        except ConfigError:  # an unknown component: build_recipe reports it
            continue
    return out


def expand_legacy_base(base: str, augs: Sequence[str], options: Mapping[str, Mapping[str, Any]]
                       ) -> tuple[str, list[str], dict[str, dict[str, Any]]]:
    """``base = "<local objective>"`` (how configs named FedProx, MOON, ... before server rules and
    objectives were two axes) as ``base = "fedavg"`` with the objective first in ``augs``; the
    objective's table keeps its own options and hands FedAvg's (``weighting``, ``bn``) to ``fedavg``.

    >>> expand_legacy_base("fedprox", ["fedfa"], {"fedprox": {"mu": 0.1, "bn": "local"}})
    ('fedavg', ['fedprox', 'fedfa'], {'fedprox': {'mu': 0.1}, 'fedavg': {'bn': 'local'}})
    """
    table = {k: dict(v) for k, v in options.items()}
    if METHODS.get(base).role != "objective":
        return base, list(augs), table
    if LEGACY_SERVER in table or LEGACY_SERVER in augs:
        raise ConfigError(f"method.base='{base}' is a local objective, which stands for base='{LEGACY_SERVER}' + "
                          f"augs=['{base}', ...]; with a '{LEGACY_SERVER}' table or entry as well, write that form: "
                          f"method.base='{LEGACY_SERVER}', method.augs=['{base}', ...]")
    server_keys = set(inspect.signature(METHODS.get(LEGACY_SERVER).__init__).parameters) - {"self"}
    own = table.pop(base, {})
    handed = {k: v for k, v in own.items() if k in server_keys}
    table[base] = {k: v for k, v in own.items() if k not in server_keys}
    if handed:
        table[LEGACY_SERVER] = handed
    return LEGACY_SERVER, [base, *augs], table


def build_recipe(
    base: str, augs: Sequence[str] = (), options: Mapping[str, Mapping[str, Any]] | None = None
) -> Recipe:
    """Build a :class:`Recipe` from registry names and per-component option tables.

    Args:
        base: registry name of the server rule (``"fedadam"``); a local objective's name
            (``"fedprox"``) means FedAvg plus that objective (:func:`expand_legacy_base`).
        augs: registry names of the local objectives and augmentations, in order.
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
    base, augs, options = expand_legacy_base(base, augs, options)
    return Recipe(
        build_component(base, options.get(base, {})),
        [build_component(a, options.get(a, {})) for a in augs],
    )
