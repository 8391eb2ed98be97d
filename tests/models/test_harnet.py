"""HARNet against FLea (KDD 2024): ~0.69M parameters, 128x20x7 features at l = 1."""

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.models import forward_front
from fedaug.models.harnet import HARNet


def test_parameter_count_is_flea_s_0_69M_within_1_percent():
    n = sum(p.numel() for p in HARNet(1, 6).parameters())
    assert n == 690_950
    assert n == pytest.approx(0.69e6, rel=0.01)


def test_paper_window_and_flea_split_shape():
    model = HARNet(1, 6).eval()
    x = torch.zeros(2, 1, 128, 3)
    assert model(x).shape == (2, 6)
    assert forward_front(model, x, "block2").shape == (2, 128, 20, 7)


def test_kernels_are_temporal_only():
    model = HARNet(1, 6)
    assert all(getattr(model, s)[0].kernel_size == (5, 1) for s in model.feature_stages)


def test_other_window_lengths():
    assert HARNet(9, 6, window=64, axes=1)(torch.zeros(2, 9, 64, 1)).shape == (2, 6)


@pytest.mark.parametrize(
    ("options", "match"),
    [({"widths": (8, 8)}, r"harnet\.widths"), ({"window": 8}, r"window=8 is too short")],
)
def test_bad_options_are_config_errors(options, match):
    with pytest.raises(ConfigError, match=match):
        HARNet(1, 6, **options)
