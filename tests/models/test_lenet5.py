"""LeNet-5 (FedFA's EMNIST model, Table 9)."""

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.models.lenet5 import LeNet5


@pytest.mark.parametrize(("size", "params"), [(28, 61_706), (32, 82_826)])  # 16x5x5 / 16x6x6 features: +176*120
def test_parameter_count_and_shape(size, params):
    model = LeNet5(1, 10, input_size=size)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model(torch.zeros(2, 1, size, size)).shape == (2, 10)


def test_emnist_62_classes():
    assert LeNet5(1, 62)(torch.zeros(2, 1, 28, 28)).shape == (2, 62)


def test_too_small_input_is_a_config_error():
    with pytest.raises(ConfigError, match=r"lenet5\.input_size"):
        LeNet5(1, 10, input_size=8)
