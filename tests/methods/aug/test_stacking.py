"""Feature augmentations stacked at one module: the layers chain in recipe order and train; MoEx must
run last at its module (refused when the simulation is built); identity-acting chains are identities."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedaug.core.errors import ConfigError
from fedaug.data.base import Split
from fedaug.engine.run import build_simulation
from fedaug.layers.attach import chains, check_chains
from fedaug.methods.aug.fedfa import FedFA
from fedaug.methods.aug.mixstyle import MixStyle
from fedaug.methods.aug.moex import MoEx
from fedaug.methods.aug.vfda import VFDA
from fedaug.methods.component import Batch, ClientCtx
from fedaug.metrics.tasks import make_task
from fedaug.models import build_model
from tests.methods.aug.inputs import tiny_cfg

MODULE = "block1"


def at(name: str, module: str = MODULE):
    """The ``at`` option of ``name`` for one module (MoEx takes one name, the others a list)."""
    return module if name == "moex" else [module]


def stacked(augs: list[str], **options):
    """A tiny simulation with ``augs`` all attached at :data:`MODULE`."""
    table = {a: {"at": at(a), **options.get(a, {})} for a in augs}
    return build_simulation(tiny_cfg(augs, table, participation=1.0))


def layers_of(component) -> dict:
    return dict(component.handle.layers)


def train_two_rounds(sim) -> None:
    for r in (1, 2):
        rec = sim.run_round(r)
        losses = [m["loss"] for m in rec["train"]["clients"].values()]
        assert losses and all(math.isfinite(v) for v in losses)


@pytest.mark.parametrize("augs", [["mixstyle", "fedfa"], ["fedfa", "vfda"], ["mixstyle", "moex"]])
def test_layers_at_one_module_chain_in_recipe_order_and_train(augs):
    sim = stacked(augs, mixstyle={"p": 1.0}, fedfa={"p": 1.0}, vfda={"p": 1.0}, moex={"p": 1.0})
    components = sim.recipe.components[1:]
    assert [c.name for c in components] == augs
    expected = [(c.name, layers_of(c)[MODULE]) for c in components]
    assert chains(sim.model) == {MODULE: expected}
    train_two_rounds(sim)
    assert chains(sim.model) == {MODULE: expected}  # training neither re-attaches nor reorders


def test_fedfa_and_vfda_at_one_module_exchange_their_own_statistics():
    sim = stacked(["fedfa", "vfda"])
    sim.run_round(1)
    rec = sim.run_round(2)
    channels = layers_of(sim.recipe.components[1])[MODULE].num_channels
    clients = len(rec["sampled"])
    for name in ("fedfa", "vfda"):
        assert rec["comm"]["up"][name] == clients * 2 * channels * 4  # running mean and std, float32
        assert rec["comm"]["down"][name] == clients * 2 * channels * 4
    assert sorted(sim.server["fedfa"]["part"]) == [f"{MODULE}.gamma_mu", f"{MODULE}.gamma_sigma"]
    assert sorted(sim.server["vfda"]["part"]) == [f"{MODULE}.var_mu", f"{MODULE}.var_sigma"]


@pytest.mark.parametrize("after", ["mixstyle", "fedfa"])
def test_a_layer_after_moex_at_its_module_is_refused_before_round_one(after):
    with pytest.raises(ConfigError) as err:
        stacked(["moex", after])
    msg = str(err.value)
    assert f"'{after}' attaches a layer after 'moex' at module '{MODULE}'" in msg
    assert f"list '{after}' before 'moex'" in msg


def test_moex_last_builds_and_trains():
    sim = stacked(["mixstyle", "moex"], moex={"p": 1.0})
    assert [owner for owner, _ in chains(sim.model)[MODULE]] == ["mixstyle", "moex"]
    train_two_rounds(sim)


def test_moex_at_another_module_than_a_later_layer_is_accepted():
    raw = {"moex": {"at": "block1"}, "mixstyle": {"at": ["block2"]}}
    sim = build_simulation(tiny_cfg(["moex", "mixstyle"], raw, participation=1.0))
    assert {m: [o for o, _ in c] for m, c in chains(sim.model).items()} == {"block1": ["moex"], "block2": ["mixstyle"]}
    sim.run_round(1)


STAGES = ("block1", "block2", "block3", "block4")
MAKERS = {
    "fedfa": lambda p, m: FedFA(p=p, at=[m]),
    "vfda": lambda p, m: VFDA(p=p, at=[m]),
    "mixstyle": lambda p, m: MixStyle(p=p, at=[m]),
    "moex": lambda p, m: MoEx(p=p, at=m),
}


@settings(max_examples=30, deadline=None)
@given(
    names=st.lists(st.sampled_from(sorted(MAKERS)), min_size=1, max_size=4, unique=True),
    modules=st.lists(st.sampled_from(STAGES), min_size=4, max_size=4),
    same=st.booleans(),
    evaluate=st.booleans(),
    p=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_a_chain_of_identity_acting_layers_leaves_the_output_unchanged(names, modules, same, evaluate, p, seed):
    """In eval mode (any p) or in training with p = 0, any valid stack of FFA, MixStyle and MoEx
    layers, at one module or several, leaves the output, and BatchNorm's statistics, unchanged."""
    p = p if evaluate else 0.0
    modules = [modules[0]] * len(modules) if same else modules
    names = sorted(names, key=lambda n: n == "moex")  # MoEx last: a valid recipe order
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # fedfa.p=0 warns that it never augments
        components = [MAKERS[n](p, modules[i]) for i, n in enumerate(names)]
    torch.manual_seed(seed)
    model = build_model("small_cnn", in_channels=1, num_classes=4, width=8)
    reference = build_model("small_cnn", in_channels=1, num_classes=4, width=8)
    reference.load_state_dict(model.state_dict())
    for c in components:
        c.setup(model, (1, 8, 8))
    check_chains(model)
    assert sum(len(chain) for chain in chains(model).values()) == len(components)
    x = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    phase = "evaluate" if evaluate else "train"
    ctx = ClientCtx(model, 0, 1, seed, Split(x, y), phase=phase, task=make_task("classification", 4))
    for c in components:
        if phase in c.phases:
            server = c.init_server(model, 3)
            c.receive(ctx.view(c.name), c.downlink(server, 0, phase), {})
    model.train(not evaluate)
    reference.train(not evaluate)
    moex = next((c for c in components if c.name == "moex"), None)
    if moex is not None and not evaluate:  # MoEx's training forward, p = 0: never armed
        out, target = moex.forward(ctx.view("moex"), Batch(x, y))
        assert torch.equal(target.y, y)
    else:
        out = model(x)
    assert torch.equal(out, reference(x))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
