"""FedBN's DigitModel (ICLR 2021): 64-64-128 convs, FC 2048-512."""

import pytest
import torch

from fedaug.core.errors import ConfigError
from fedaug.models.digit_model import DigitModel


def test_parameter_count_at_28x28():
    # conv 4,864 + 102,464 + 204,928; fc 12,847,104 + 1,049,088 + 5,130; BN affine 5,632
    assert sum(p.numel() for p in DigitModel(3, 10).parameters()) == 14_219_210


@pytest.mark.parametrize(("size", "flat"), [(28, 6272), (32, 8192)])
def test_input_size_fixes_the_first_fc_width(size, flat):
    model = DigitModel(3, 10, input_size=size).eval()
    assert model.fc1[0].in_features == flat
    assert model(torch.zeros(2, 3, size, size)).shape == (2, 10)


def test_too_small_input_size_is_a_config_error():
    with pytest.raises(ConfigError, match=r"digit_model\.input_size"):
        DigitModel(3, 10, input_size=3)
