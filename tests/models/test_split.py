"""The staged-model base and the split API (forward_front / forward_back / split_model / extract_features)."""

import pytest
import torch
from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.layers.attach import attach
from fedaug.models import StagedModel, build_model, forward_back, forward_front, split_model, split_stages
from fedaug.models.split import extract_features
from fedaug.models.small_cnn import SmallCNN


class _Chain(StagedModel):
    feature_stages = ("a",)

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.b = nn.ReLU()
        self.c = nn.Linear(4, 2)


def test_stages_are_children_in_order_and_forward_runs_them():
    model = _Chain()
    x = torch.randn(5, 3)
    assert split_stages(model) == ("a", "b", "c")
    assert torch.equal(model(x), model.c(model.b(model.a(x))))
    assert torch.equal(forward_front(model, x, "b"), model.b(model.a(x)))


def test_small_cnn_is_a_chain_of_named_stages():
    model = SmallCNN(1, 10).eval()
    x = torch.randn(2, 1, 28, 28)
    assert split_stages(model) == ("block1", "block2", "block3", "block4", "pool", "head")
    for stage in split_stages(model):
        assert torch.equal(forward_back(model, forward_front(model, x, stage), stage), model(x))


def test_split_model_shares_parameters_and_sees_attached_layers():
    model = build_model("lenet5", in_channels=1, num_classes=10).eval()
    x = torch.randn(2, 1, 28, 28)
    front, back = split_model(model, "conv1")
    with attach(model, {"conv1": nn.Identity()}):
        assert torch.equal(back(front(x)), model(x))
    with torch.no_grad():
        model.fc3.bias.add_(1.0)
    assert torch.equal(back(front(x)), model(x))


def test_a_nested_module_is_not_a_split_point_and_the_error_lists_stages():
    model = build_model("unet2d", in_channels=1, num_classes=2)
    with pytest.raises(ConfigError, match=r"cannot split UNet at 'enc1\.0'.*splittable stages are: enc1, pool1"):
        forward_front(model, torch.zeros(1, 1, 16, 16), "enc1.0")


def test_unknown_stage_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"'stag1' \(did you mean 'stage1'\?\)"):
        split_model(build_model("mobilenetv2_cifar", in_channels=3, num_classes=10), "stag1")


def test_a_model_without_stages_cannot_be_split():
    with pytest.raises(ConfigError, match=r"Sequential does not declare stages.*StagedModel"):
        split_stages(nn.Sequential(nn.Linear(2, 2)))



@pytest.mark.parametrize("chunk", [1, 2, 5, 256])  # 5 samples: one per chunk, a ragged last chunk, one chunk
def test_extract_features_in_chunks_equals_one_forward_front(chunk):
    model = SmallCNN(1, 10).eval()
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(extract_features(model, x, "block2", chunk=chunk), forward_front(model, x, "block2"))


def test_extract_features_keeps_the_unet_skips_and_answers_an_empty_batch():
    model = build_model("unet2d", in_channels=1, num_classes=2).eval()
    x = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        h, skips = extract_features(model, x, "pool2", chunk=2)
        h_ref, skips_ref = forward_front(model, x, "pool2")
        empty = extract_features(model, x[:0], "pool2")
    torch.testing.assert_close(h, h_ref)
    assert len(skips) == len(skips_ref) == 2
    for s, r in zip(skips, skips_ref):
        torch.testing.assert_close(s, r)
    assert empty[0].shape[0] == 0
