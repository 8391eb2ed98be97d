"""U-Nets against FedFA (ICLR 2023) Tables 14-15 and VFDA's encoder placement."""

import pytest
import torch
from torch import nn

from fedaug.core.errors import ConfigError
from fedaug.layers.attach import attach, stage_channels
from fedaug.models import build_model, forward_back, forward_front
from fedaug.models.unet import UNet


def test_unet2d_parameter_count_matches_the_papers_model_size():
    n = sum(p.numel() for p in build_model("unet2d", in_channels=3, num_classes=2).parameters())
    assert n == 7_763_074
    assert n * 4 / 2**20 == pytest.approx(29.6, abs=0.05)  # FedFA App. E.6: 29.6 MB per model (fp32)


def test_unet2d_paper_input_384():  # a real forward takes ~3 s on 2 cores; meta tensors give the shape
    with torch.device("meta"):
        model = build_model("unet2d", in_channels=3, num_classes=2)
        assert model(torch.empty(16, 3, 384, 384)).shape == (16, 2, 384, 384)


@pytest.mark.parametrize("side", [16, 48])  # 16 = the smallest the 4 poolings admit
def test_unet2d_small_inputs(side):
    model = build_model("unet2d", in_channels=3, num_classes=2).eval()
    assert model(torch.zeros(2, 3, side, side)).shape == (2, 2, side, side)


def test_unet2d_attach_points_are_table_14s_ffa_widths():
    model = build_model("unet2d", in_channels=3, num_classes=2)
    assert stage_channels(model, torch.zeros(2, 3, 16, 16)) == {
        "pool1": 32, "pool2": 64, "pool3": 128, "pool4": 256, "bottleneck": 512,
    }  # fmt: skip


class _Scale(nn.Module):
    def forward(self, x):
        return 2 * x


def test_a_layer_after_pool_changes_the_path_down_but_not_the_skip():
    model = UNet(1, 2, features=(4, 8)).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        plain = forward_front(model, x, "pool1")
        with attach(model, {"pool1": _Scale()}):
            h, skips = forward_front(model, x, "pool1")
    assert torch.equal(h, 2 * plain[0])
    assert torch.equal(skips[0], plain[1][0])  # the skip is enc1's un-augmented, pre-pool output


def test_unet3d_encoder_stages_are_configurable_and_vfda_attaches_after_each():
    model = build_model("unet3d", in_channels=1, num_classes=3, features=(8, 16, 32, 64, 128))
    assert model.feature_stages == ("enc1", "enc2", "enc3", "enc4", "bottleneck")
    assert model.eval()(torch.zeros(1, 1, 16, 16, 16)).shape == (1, 3, 16, 16, 16)


def test_split_features_carry_the_pending_skips():
    model = UNet(1, 2, features=(4, 8, 16)).eval()
    x = torch.randn(2, 1, 8, 8)
    h, skips = forward_front(model, x, "bottleneck")
    assert h.shape == (2, 16, 2, 2) and [tuple(s.shape) for s in skips] == [(2, 4, 8, 8), (2, 8, 4, 4)]
    assert torch.equal(forward_back(model, (h, skips), "bottleneck"), model(x))
    assert forward_front(model, x, "head")[1] == ()


def test_instance_norm_option():
    model = UNet(1, 2, features=(4, 8), dims=3, norm="instance").eval()
    assert model(torch.randn(1, 1, 4, 4, 4)).shape == (1, 2, 4, 4, 4)


def test_bad_options_are_reported_together():
    with pytest.raises(ConfigError, match=r"dims must be 2 or 3, got 4; norm must be .*, got 'group'"):
        UNet(1, 2, dims=4, norm="group")


@pytest.mark.parametrize("shape", [(1, 1, 12, 16), (1, 1, 16, 16, 16)])
def test_input_not_divisible_or_wrong_rank_is_explained(shape):
    model = build_model("unet2d", in_channels=1, num_classes=2)
    with pytest.raises(ValueError, match=r"divisible by 16.*crop or pad"):
        model(torch.zeros(shape))
