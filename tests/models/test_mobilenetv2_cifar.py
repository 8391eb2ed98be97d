"""MobileNetV2, CIFAR variant, against FLea (KDD 2024) App. C.2 and its public scripts."""

import pytest
import torch

from fedaug.models import forward_front
from fedaug.models.mobilenetv2_cifar import MobileNetV2CIFAR


def test_parameter_count_is_flea_s_2_3M_within_2_percent():
    n = sum(p.numel() for p in MobileNetV2CIFAR(3, 10).parameters())
    assert n == 2_296_922
    assert n == pytest.approx(2.30e6, rel=0.02)


def test_seventeen_inverted_residual_blocks():
    model = MobileNetV2CIFAR(3, 10)
    assert sum(len(getattr(model, s)) for s in model.feature_stages) == 17


def test_flea_split_point_gives_16x32x32_features():
    model = MobileNetV2CIFAR(3, 10).eval()
    assert forward_front(model, torch.zeros(2, 3, 32, 32), "stage1").shape == (2, 16, 32, 32)
