"""The plain 1-D CNN for sensor windows (B, C, L)."""

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.models.cnn1d import CNN1D


@pytest.mark.parametrize(
    ("shape", "widths"),
    [((2, 6, 100), (32, 64, 128)), ((3, 9, 128), (16,)), ((2, 3, 8), (4, 4, 4))],
)
def test_shapes_and_stages(shape, widths):
    model = CNN1D(shape[1], 5, widths=widths).eval()
    assert model(torch.zeros(shape)).shape == (shape[0], 5)
    assert model.feature_stages == tuple(f"block{i + 1}" for i in range(len(widths)))


def test_empty_widths_is_a_config_error():
    with pytest.raises(ConfigError, match=r"cnn1d\.widths"):
        CNN1D(6, 6, widths=())
