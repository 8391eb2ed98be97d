"""MixStyle and MoEx as components: shapes kept, identity at evaluation, MoEx's labels sum to 1."""

from __future__ import annotations

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.methods.aug.mixstyle import MixStyle
from fedaug.methods.aug.moex import MoEx
from fedaug.methods.component import Batch
from fedaug.models.registry import build_model
from tests.methods.aug.inputs import make_ctx


def setup(component):
    torch.manual_seed(0)
    model = build_model("small_cnn", in_channels=1, num_classes=4, width=8)
    reference = build_model("small_cnn", in_channels=1, num_classes=4, width=8)
    reference.load_state_dict(model.state_dict())
    component.setup(model, (1, 8, 8))
    x = torch.rand(6, 1, 8, 8)
    ctx = make_ctx(x, torch.tensor([0, 1, 2, 3, 0, 1]), model=model)
    component.receive(ctx, {}, {})
    return model, reference, ctx


@pytest.mark.parametrize("component", [MixStyle(p=1.0), MoEx(p=1.0)])
def test_identity_at_evaluation_and_shape_kept_in_training(component):
    model, reference, ctx = setup(component)
    x = ctx.data.x
    assert torch.equal(model.eval()(x), reference.eval()(x))
    assert model.state_dict().keys() == reference.state_dict().keys()
    model.train()
    reference.train()
    out, target = component.forward(ctx, Batch(x, ctx.data.y))
    assert out.shape == (6, 4) and not torch.allclose(out, reference(x))


def test_moex_mixes_labels_with_lam():
    moex = MoEx(p=1.0, lam=0.9)
    model, _, ctx = setup(moex)
    model.train()
    _, target = moex.forward(ctx, Batch(ctx.data.x, ctx.data.y))
    assert target.y.shape == (6, 4) and torch.allclose(target.y.sum(1), torch.ones(6))
    assert torch.all(target.y.max(1).values >= 0.9 - 1e-6)


def test_options_are_validated():
    with pytest.raises(ConfigError, match=r"mixstyle\.p"):
        MixStyle(p=2.0)
    with pytest.raises(ConfigError, match=r"moex\.moments"):
        MoEx(moments="batch")
    with pytest.raises(ConfigError, match=r"mixstyle\.at"):
        MixStyle(at="block1")
