"""A recipe refuses a component that overrides a hook its own step form replaces (issue 61): the hook would never
be called, in eager training as in grouped or captured. Every registered component with such a step form is
subclassed once per hook it replaces; the fix the message names (override the step form) trains."""

from __future__ import annotations

import pytest

from fedaug.config.schema import validate
from fedaug.core.errors import ConfigError
from fedaug.engine.run import build_simulation
from fedaug.methods import METHODS, Component, Recipe
from fedaug.methods.aug.flea import FLea
from fedaug.methods.base.fedavg import FedAvg
from fedaug.methods.recipe import TAKEN_OVER, ignored_hooks
from tests.conftest import tiny_raw

#: (component, hook, the step form that runs in its place, its parameters): every registered component with a
#: step form that replaces a hook, and each hook it replaces
REPLACED = [
    ("flea", "forward", "group_replace_forward", "run, captured, inputs, batch"),
    ("flea", "loss_terms", "group_replace_forward", "run, captured, inputs, batch"),
    ("flea", "group_loss_terms", "group_replace_forward", "run, captured, inputs, batch"),
    ("fedprox", "loss_terms", "group_loss_terms", "params, captured, batch, out"),
    ("scaffold", "before_step", "group_before_step", "grads, captured, optimizer"),
]


def overridden(cls: type, attr: str) -> bool:
    return getattr(cls, attr) is not getattr(Component, attr)


def test_the_table_names_every_registered_component_whose_step_form_replaces_a_hook():
    found = sorted((name, hook) for name in METHODS.names() for hook, forms in TAKEN_OVER.items()
                   if any(overridden(METHODS.get(name), f) for f in forms))
    assert found == sorted((name, hook) for name, hook, _, _ in REPLACED)


def never_called(hook: str):
    def hook_body(self, *args, **kwargs):
        raise AssertionError(f"{hook} ran: the recipe should have refused it")
    return hook_body


def recipe_of(component: Component) -> Recipe:
    return Recipe(component) if component.role == "server" else Recipe(FedAvg(), [component])


@pytest.mark.parametrize(("name", "hook", "form", "params"), REPLACED)
def test_a_subclass_overriding_a_replaced_hook_is_refused_naming_the_hook_and_the_step_form(name, hook, form, params):
    cls = METHODS.get(name)
    sub = type(f"My{cls.__name__}", (cls,), {hook: never_called(hook)})
    with pytest.raises(ConfigError, match=(
            rf"'{name}' \(My{cls.__name__}\) overrides '{hook}', which is never called: {cls.__name__}'s step form "
            rf"'{form}' runs in its place in eager, grouped and captured training; override {form}\({params}\) "
            rf"instead.*calling super\(\)\.{form}\(\.\.\.\) to keep what {cls.__name__} does")):
        recipe_of(sub())
    recipe_of(cls())  # the component itself is accepted


def test_the_issue_s_flea_subclass_gets_one_error_naming_both_hooks():
    class MyFLea(FLea):
        def forward(self, ctx, batch): raise AssertionError("never called")
        def loss_terms(self, ctx, batch, out): raise AssertionError("never called")

    with pytest.raises(ConfigError) as err:
        Recipe(FedAvg(), [MyFLea()])
    message = str(err.value)
    assert "overrides 'forward', which is never called" in message
    assert "overrides 'loss_terms', which is never called" in message
    assert "return its terms in the third value" in message


def test_a_hook_and_its_step_form_in_one_class_are_refused_and_a_step_form_added_below_the_hook_is_not():
    class Both(Component):
        name = "both"
        def loss_terms(self, ctx, batch, out): return {}
        def group_loss_terms(self, params, captured, batch, out): return {}

    assert ignored_hooks(Both()) == [
        "'both' (Both) overrides 'loss_terms', which is never called: Both's step form 'group_loss_terms' runs in its "
        "place in eager, grouped and captured training; move what it does into "
        "group_loss_terms(params, captured, batch, out) and drop 'loss_terms'"]

    class Eager(Component):
        name = "eager"
        def loss_terms(self, ctx, batch, out): return {}

    class Stepped(Eager):  # a step form written to replace its base's hook
        def group_loss_terms(self, params, captured, batch, out): return {}

    assert ignored_hooks(Eager()) == ignored_hooks(Stepped()) == []
    Recipe(FedAvg(), [Stepped()])


@pytest.mark.parametrize("group_clients", [1, 3])
def test_the_override_the_message_names_runs_eagerly_and_grouped(group_clients):
    calls = []

    class ExtraFLea(FLea):
        def group_replace_forward(self, run, captured, inputs, batch):
            out, batch, terms = super().group_replace_forward(run, captured, inputs, batch)
            calls.append(out.shape[0])
            return out, batch, {**terms, "extra": out.pow(2).mean()}

    raw = tiny_raw(participation=1.0, group_clients=group_clients)
    sim = build_simulation(validate(raw), recipe=Recipe(FedAvg(), [ExtraFLea(stage="block2")]))
    clients = sim.run_round(1)["train"]["clients"]
    assert len(calls) == 3 * (3 if group_clients == 1 else 1)  # 3 steps of 3 clients, or 3 steps of one group
    assert sorted(clients) == ["0", "1", "2"]
    assert all(c["flea/extra"] > 0 and {"flea/distill", "flea/dcor"} <= set(c) for c in clients.values())
