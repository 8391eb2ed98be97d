"""The kept walk of a model (fedaug.models.walk): torch's own walks' results, used again only while the
tree is unchanged."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from fedaug.methods._common import plain_entries
from fedaug.models.registry import build_model
from fedaug.models.walk import train_mode, trainable, walk


def _shared() -> nn.Module:
    """A model with one module under two names and a non-persistent buffer."""
    block = nn.Linear(3, 3)
    model = nn.Sequential(block, nn.ReLU(), block, nn.BatchNorm1d(3))
    model.register_buffer("scratch", torch.zeros(2), persistent=False)
    return model


@pytest.mark.parametrize("make", [lambda: build_model("mlp", 1, 10), lambda: build_model("small_cnn", 3, 10),
                                  lambda: build_model("mobilenetv2_cifar", 3, 10), _shared])
def test_the_walk_gives_torchs_state_dict_and_parameters_in_their_order(make):
    model = make()
    for _ in range(2):  # made, then kept
        expected = model.state_dict(keep_vars=True)
        got = plain_entries(model)
        assert list(got) == list(expected) and all(got[k] is expected[k] for k in got)
        assert [(k, id(p)) for k, p in walk(model).named_parameters()] == [(k, id(p)) for k, p in model.named_parameters()]
        assert walk(model) is walk(model)


def test_a_changed_tree_is_walked_again():
    model = _shared()
    before = walk(model)
    model[0].weight = nn.Parameter(torch.ones(3, 3))  # setattr: a registration
    assert walk(model) is not before and plain_entries(model)["0.weight"] is model[0].weight
    model.add_module("head", nn.Linear(3, 2))
    assert "head.weight" in plain_entries(model) and "head.bias" in trainable(model)
    del model.head.bias  # no registration hook: the module's sizes tell
    assert "head.bias" not in plain_entries(model) and list(plain_entries(model)) == list(model.state_dict())
    model.register_buffer("kept", torch.ones(1))
    assert list(plain_entries(model)) == list(model.state_dict())


def test_a_state_dict_hook_added_later_makes_the_entries_torchs_business():
    model = _shared()
    assert plain_entries(model) is not None
    handle = model[3].register_state_dict_pre_hook(lambda *args: None)
    assert plain_entries(model) is None  # load_state_dict / state_dict must run the hook
    handle.remove()
    assert plain_entries(model) is not None


def test_trainable_follows_requires_grad_without_a_new_walk():
    model = build_model("mlp", 1, 10)
    kept = walk(model)
    names = list(trainable(model))
    next(model.parameters()).requires_grad_(False)
    assert walk(model) is kept and list(trainable(model)) == names[1:]


class _Counting(nn.Linear):
    calls = 0

    def train(self, mode: bool = True) -> nn.Module:
        type(self).calls += 1
        return super().train(mode)


def test_train_mode_sets_every_flag_and_calls_an_overridden_train_each_time():
    model = build_model("mlp", 1, 10).eval()
    train_mode(model)
    assert all(m.training for m in model.modules())
    custom = nn.Sequential(_Counting(2, 2), nn.ReLU())
    train_mode(custom)
    train_mode(custom)
    assert _Counting.calls == 2 and all(m.training for m in custom.modules())


def test_a_kept_walk_does_not_keep_its_model_alive():
    model = build_model("mlp", 1, 10)
    walk(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
