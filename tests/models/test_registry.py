"""Properties every registered model must have: shapes, split == forward, identity attach, training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.core.rng import scoped_global_seed
from fedaug.layers.attach import attach_default
from fedaug.models import MODELS, build_model, forward_back, forward_front, split_stages
from tests.conftest import numeric_options

# name: (in_channels, num_classes, small input shape without batch, output shape without batch)
CASES = {
    "small_cnn":         (1, 10, (1, 28, 28),     (10,)),
    "digit_model":       (3, 10, (3, 28, 28),     (10,)),
    "alexnet_bn":        (3, 10, (3, 64, 64),     (10,)),
    "lenet5":            (1, 62, (1, 28, 28),     (62,)),
    "mlp":               (1, 10, (1, 28, 28),     (10,)),
    "resnet18_cifar":    (3, 10, (3, 16, 16),     (10,)),
    "mobilenetv2_cifar": (3, 10, (3, 16, 16),     (10,)),
    "unet2d":            (3, 2,  (3, 16, 16),     (2, 16, 16)),
    "unet3d":            (1, 3,  (1, 16, 16, 16), (3, 16, 16, 16)),
    "harnet":            (1, 6,  (1, 128, 3),     (6,)),
    "cnn1d":             (6, 6,  (6, 100),        (6,)),
    "audionet":          (2, 10, (2, 32, 64),     (10,)),
}  # fmt: skip
NAMES = sorted(CASES)


def _build(name: str) -> nn.Module:
    cin, ncls, _, _ = CASES[name]
    with scoped_global_seed(0, "test", name):
        return build_model(name, in_channels=cin, num_classes=ncls)


def _input(name: str, batch: int = 2, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *CASES[name][2], generator=g)


def test_every_registered_model_has_a_case():
    assert sorted(MODELS.names()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_help_and_feature_stages_are_module_names(name):
    model = _build(name)
    assert MODELS.help(name)
    modules = dict(model.named_modules())
    assert model.feature_stages and all(s in modules for s in model.feature_stages)
    assert set(model.feature_stages) <= set(split_stages(model))


@pytest.mark.parametrize("name", NAMES)
def test_output_shape_at_small_input(name):
    model = _build(name).eval()
    with torch.no_grad():
        out = model(_input(name))
    assert out.shape == (2, *CASES[name][3])
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_split_equals_forward_at_every_stage(name):
    model = _build(name).eval()
    x = _input(name)
    with torch.no_grad():
        full = model(x)
        for stage in split_stages(model):
            out = forward_back(model, forward_front(model, x, stage), stage)
            assert torch.equal(out, full), stage


@pytest.mark.parametrize("name", NAMES)
def test_identity_attach_at_default_points_changes_nothing(name):
    model = _build(name).eval()
    x = _input(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(x)
        with attach_default(model, lambda stage, c: nn.Identity(), x) as handle:
            assert list(handle.layers) == list(model.feature_stages)
            out = model(x)
    assert torch.equal(out, ref)
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("name", NAMES)
def test_a_few_sgd_steps_reduce_the_loss_on_a_fixed_batch(name):
    model = _build(name).train()
    x = _input(name, batch=4)
    ncls = CASES[name][1]
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, ncls, (4, *CASES[name][3][1:]), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(6):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


def test_unknown_option_names_the_option_and_the_valid_ones():
    with pytest.raises(ConfigError, match=r"no option 'hiden' \(did you mean 'hidden'\?\).*hidden"):
        build_model("alexnet_bn", in_channels=3, num_classes=10, hiden=512)


# in_channels and num_classes come from the dataset; the rest are model.options
COUNTS = [(n, k) for n in MODELS.names() for k in numeric_options(MODELS.get(n), fractional=False)
          if k not in ("in_channels", "num_classes")]


@pytest.mark.parametrize("value", [2.5, True, float("nan")], ids=["fraction", "bool", "nan"])
@pytest.mark.parametrize("name, key", COUNTS, ids=[f"{n}.{k}" for n, k in COUNTS])
def test_every_count_option_refuses_fractions_and_booleans(name, key, value):
    cin, ncls, _, _ = CASES[name]
    with pytest.raises(ConfigError, match=rf"^model\.options\.{key} must be .*integer.*, got .* \(model '{name}'\)$"):
        build_model(name, in_channels=cin, num_classes=ncls, **{key: value})
