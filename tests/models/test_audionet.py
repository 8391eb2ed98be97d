"""AudioNet against FLea (KDD 2024), App. C.2 (~26k parameters, 2x64x344 spectrograms)."""

import pytest
import torch

from fedaug.models import forward_front
from fedaug.models.audionet import AudioNet


def test_parameter_count_is_flea_s_26k_within_3_percent():
    n = sum(p.numel() for p in AudioNet(2, 10).parameters())
    assert n == 25_602
    assert n == pytest.approx(26e3, rel=0.03)


def test_paper_input_and_flea_split_shape():
    model = AudioNet(2, 10).eval()
    x = torch.zeros(2, 2, 64, 344)
    assert model(x).shape == (2, 10)
    assert forward_front(model, x, "block2").shape == (2, 16, 16, 86)  # FLea public scripts, l = 1


def test_block_order_is_conv_relu_bn():
    kinds = [type(m).__name__ for m in AudioNet(2, 10).block1]
    assert kinds == ["Conv2d", "ReLU", "BatchNorm2d"]
