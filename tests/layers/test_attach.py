"""attach / detach / stage_channels / attach_default: hooks only, host mode, errors listing names."""

import pytest
import torch
from torch import nn

from fedaug.core.errors import AttachError, ConfigError
from fedaug.layers.attach import attach, attach_default, chains, check_chains, stage_channels
from fedaug.models import build_model


class _AddInTrain(nn.Module):
    """Adds 1 in train mode, identity in eval mode; records the mode of each call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("one", torch.ones(()))
        self.modes: list[bool] = []

    def forward(self, x):
        self.modes.append(self.training)
        return x + self.one if self.training else x


def _model() -> nn.Module:
    torch.manual_seed(0)
    return build_model("small_cnn", in_channels=1, num_classes=10)


def _x() -> torch.Tensor:
    return torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("train", [True, False])
def test_identity_leaves_outputs_and_state_dict_unchanged(train):
    model = _model().train(train)
    keys = list(model.state_dict())
    ref_model = _model().train(train)  # same init; BN statistics update identically in train mode
    handle = attach(model, {"block1": nn.Identity(), "block3.1": nn.Identity()})
    assert list(model.state_dict()) == keys
    assert torch.equal(model(_x()), ref_model(_x()))
    handle.detach()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref_model.state_dict().values()))


def test_layer_changes_output_in_train_mode_only_and_follows_host_mode():
    model, layer = _model(), _AddInTrain()
    x = _x()
    model.eval()
    ref = model(x)
    with attach(model, {"block4": layer}):
        assert torch.equal(model(x), ref)
        model.train()
        model(x)  # updates BN statistics: compare in eval afterwards
        model.eval()
        assert torch.equal(model(x), model(x))
        model.train()
        out_train = model(x)
    model.train()
    assert not torch.equal(out_train, model(x))
    assert layer.modes == [False, True, False, False, True]
    assert "one" not in "".join(model.state_dict())


def test_layer_moves_to_the_outputs_dtype():
    model, layer = _model().double(), _AddInTrain()
    with attach(model, {"block2": layer}):
        model(_x().double())
    assert layer.one.dtype == torch.float64


def test_detach_removes_every_hook_and_is_idempotent():
    model = _model()
    handle = attach(model, {"block1": nn.Identity(), "block2.0": nn.Identity()})
    assert handle.attached
    handle.detach()
    handle.detach()
    assert not handle.attached
    assert all(not m._forward_hooks for m in model.modules())
    attach(model, {"block1": nn.Identity()}).detach()  # the name is free again


def test_unknown_names_are_all_listed_with_suggestions_and_module_names():
    with pytest.raises(AttachError) as err:
        attach(_model(), {"blok1": nn.Identity(), "block1": nn.Identity(), "nothing": nn.Identity()})
    msg = str(err.value)
    assert "'blok1' (did you mean 'block1'?), 'nothing'" in msg
    assert "its modules are: block1, block1.0" in msg and "default attach points: block1, block2" in msg
    assert "named_modules()" in msg


def test_long_module_lists_show_the_top_level():
    top = r"its modules are: stem, layer1, layer2, layer3, layer4, pool, flatten, fc \(top level"
    with pytest.raises(AttachError, match=top):
        attach(build_model("resnet18_cifar", in_channels=3, num_classes=10), {"layer5": nn.Identity()})


class _Affine(nn.Module):
    """``x * scale + shift`` (no parameters): two of them do not commute."""

    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return x * self.scale + self.shift


def test_attaching_twice_at_a_name_chains_in_attach_order():
    model, ref = _model().eval(), _model().eval()
    layer1, layer2 = _Affine(2.0, 1.0), _Affine(0.5, -3.0)
    first = attach(model, {"block2": layer1}, owner="a")
    second = attach(model, {"block1": nn.Identity(), "block2": layer2}, owner="b")
    assert chains(model)["block2"] == [("a", layer1), ("b", layer2)]
    assert [owner for owner, _ in chains(model)["block1"]] == ["b"]
    x = _x()
    with attach(ref, {"block2": nn.Sequential(layer1, layer2)}):  # layer2(layer1(out))
        assert torch.equal(model(x), ref(x))
    with attach(ref, {"block2": nn.Sequential(layer2, layer1)}):
        assert not torch.equal(model(x), ref(x))  # the order matters
    with pytest.raises(AttachError, match="'nothing'"):
        attach(model, {"block3": nn.Identity(), "nothing": nn.Identity()})
    assert "block3" not in chains(model)  # nothing half-attached
    second.detach()
    assert chains(model) == {"block2": [("a", layer1)]}
    first.detach()
    assert chains(model) == {}


class _Last(nn.Identity):
    must_be_last = True


def test_check_chains_refuses_a_layer_after_a_must_be_last_one_naming_owners_and_module():
    model = _model()
    attach(model, {"block1": nn.Identity(), "block2": _Last()}, owner="first")
    attach(model, {"block1": _Last()}, owner="last")
    check_chains(model)  # a must-be-last layer at the end of its chain is fine
    attach(model, {"block2": nn.Identity(), "block1": nn.Identity()}, owner="late")
    with pytest.raises(ConfigError) as err:
        check_chains(model)
    msg = str(err.value)
    assert "'late' attaches a layer after 'first' at module 'block2'" in msg
    assert "'late' attaches a layer after 'last' at module 'block1'" in msg  # every problem at once
    assert "list 'late' before 'first' in method.augs" in msg


def test_stage_channels_does_not_change_bn_statistics_or_modes():
    model = _model().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert stage_channels(model, _x()) == {"block1": 32, "block2": 32, "block3": 32, "block4": 32}
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_attach_default_passes_each_stage_and_its_channels():
    model = build_model("unet2d", in_channels=1, num_classes=2, base_width=4)
    seen = []
    handle = attach_default(model, lambda name, c: seen.append((name, c)) or nn.Identity(), torch.zeros(2, 1, 16, 16))
    assert seen == [("pool1", 4), ("pool2", 8), ("pool3", 16), ("pool4", 32), ("bottleneck", 64)]
    handle.detach()


def test_attach_default_needs_declared_stages():
    with pytest.raises(AttachError, match=r"declares no feature_stages"):
        attach_default(nn.Sequential(nn.Linear(2, 2)), lambda n, c: nn.Identity(), torch.zeros(1, 2))


class _Reversed(nn.Module):
    """Runs ``b`` before ``a``, though ``a`` is defined (and named) first."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 3, 1), nn.Conv2d(2, 4, 1)

    def forward(self, x):
        return self.a(self.b(x))


def test_stage_channels_in_call_order_follows_the_forward_pass():
    model, x = _Reversed(), torch.zeros(2, 2, 3, 3)
    assert list(stage_channels(model, x, ["a", "b"]).items()) == [("a", 3), ("b", 4)]
    assert list(stage_channels(model, x, ["a", "b"], call_order=True).items()) == [("b", 4), ("a", 3)]
